"""benchmarks/decode_profile labels XLA's trace of the decode loop by source op: on a model whose vocabulary is
much wider than its layers, the vocabulary projection is the op that takes the most thread time."""
from jax.profiler import ProfileData

from benchmarks import decode_profile


def test_fusions_are_labelled_with_the_op_they_came_from():
  hlo = ('  %ynn_fusion.8 = f32[64,256]{1,0} fusion(%a, %b), kind=kCustom, calls=%f8, '
         'metadata={op_name="jit(decode_fn)/while/body/Qwen.logits/embed.attend/dot_general" stack_frame_id=3}\n'
         '  ROOT %tuple.1 = (f32[]) tuple(%c), metadata={op_name="jit(decode_fn)/tuple"}\n')
  assert decode_profile.op_labels(hlo) == {"ynn_fusion.8": "Qwen.logits/embed.attend/dot_general",
                                           "tuple.1": "tuple"}


def _event(name_id, start_us, duration_us):
  return f"events {{ metadata_id: {name_id} offset_ps: {start_us * 10**6} duration_ps: {duration_us * 10**6} }}"


def test_thunks_count_on_every_thread_by_self_time():
  """A loaded host runs some thunks inline on the calling thread, inside the while that owns them: they must count
  there too, and the while only for its own time; the executor's wrappers are not instructions."""
  names = {1: "while.1", 2: "ynn_fusion.8", 3: "ThunkExecutor::Execute", 4: "cond.2"}
  caller = " ".join([_event(1, 0, 10), _event(2, 1, 6), _event(3, 2, 1), _event(4, 8, 1)])
  pool = " ".join([_event(2, 0, 5), _event(3, 5, 2)])
  metadata = " ".join(f'event_metadata {{ key: {k} value {{ id: {k} name: "{v}" }} }}' for k, v in names.items())
  profile = ProfileData.from_text_proto(
      f'planes {{ name: "/host:CPU" lines {{ name: "tf_XLAPjRtCpuClient/1" timestamp_ns: 0 {caller} }} '
      f'lines {{ name: "tf_XLAEigen/2" timestamp_ns: 0 {pool} }} {metadata} }}')
  totals = decode_profile.thread_times(profile, {"while.1", "ynn_fusion.8", "cond.2"})
  assert totals == {"while.1": 3_000, "ynn_fusion.8": 11_000, "cond.2": 1_000}


def test_the_projection_leads_the_profile_of_a_wide_vocabulary(capsys, monkeypatch):
  monkeypatch.setitem(decode_profile.random_models.WIDTHS, "wide_vocab", dict(
      vocab_size=65536, hidden_size=512, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
      head_dim=16, tie_word_embeddings=True))
  decode_profile.main(["--width", "wide_vocab", "--layers", "1", "--batch", "16", "--cache_len", "24",
                       "--steps", "2", "--top", "3"])
  lines = capsys.readouterr().out.splitlines()
  header = next(i for i, line in enumerate(lines) if line.strip().startswith("thread ms/step"))
  assert "decode_logits" in lines[header + 1], lines  # models/decoder_cached.decode_logits: the [E, V] copy on CPU
  assert lines[-1].endswith("all ops")
