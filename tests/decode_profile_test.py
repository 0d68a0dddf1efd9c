"""benchmarks/decode_profile labels XLA's trace of the decode loop by source op: on a model whose vocabulary is
much wider than its layers, the vocabulary projection is the op that takes the most thread time."""
from benchmarks import decode_profile


def test_fusions_are_labelled_with_the_op_they_came_from():
  hlo = ('  %ynn_fusion.8 = f32[64,256]{1,0} fusion(%a, %b), kind=kCustom, calls=%f8, '
         'metadata={op_name="jit(decode_fn)/while/body/Qwen.logits/embed.attend/dot_general" stack_frame_id=3}\n'
         '  ROOT %tuple.1 = (f32[]) tuple(%c), metadata={op_name="jit(decode_fn)/tuple"}\n')
  assert decode_profile.op_labels(hlo) == {"ynn_fusion.8": "Qwen.logits/embed.attend/dot_general",
                                           "tuple.1": "tuple"}


def test_the_projection_leads_the_profile_of_a_wide_vocabulary(capsys, monkeypatch):
  monkeypatch.setitem(decode_profile.train_bench.WIDTHS, "wide_vocab", dict(
      vocab_size=65536, hidden_size=512, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
      head_dim=16, tie_word_embeddings=True))
  decode_profile.main(["--width", "wide_vocab", "--layers", "1", "--batch", "16", "--cache_len", "24",
                       "--steps", "2", "--top", "3"])
  lines = capsys.readouterr().out.splitlines()
  header = next(i for i, line in enumerate(lines) if line.strip().startswith("thread ms/step"))
  assert "Qwen.logits" in lines[header + 1], lines
  assert lines[-1].endswith("all ops")
