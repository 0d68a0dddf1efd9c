"""benchmarks/train_profile attributes XLA's trace of the train step to kinds of work: the kinds are told apart by
their source op, and every traced instruction of a real step lands in exactly one kind, the vocabulary projection's
and the softmax passes' among them. Which op takes the most time is a measurement, not asserted here."""
import pytest

from benchmarks import train_profile


@pytest.mark.parametrize("label, instruction, kind", [
    ("transpose(jvp())/while/body/closed_call/cond/branch_1_fun/transpose(jvp(Decoder.logits))/lm_head/lm_head/"
     "dot_general", "ynn_fusion.3", "matmul: vocabulary projection (fwd, grads)"),
    ("jvp()/while/body/closed_call/cond/branch_1_fun/reduce_sum", "fusion.7", "vocabulary softmax / log-prob passes"),
    ("jvp()/cond/branch_1_fun/exp", "fusion.8", "vocabulary softmax / log-prob passes"),  # a tail chunk
    ("cond/branch_1_fun/add", "fusion.10", "outside the model (optimizer, grad norms, loss)"),  # the update's cond
    ("transpose(jvp(Decoder))/while/body/closed_call/layers/mlp/down_proj/down_proj/dot_general", "ynn_fusion.1",
     "matmul: layer projections"),
    ("jvp(Decoder)/while/body/closed_call/layers/attn/while/body/cond/branch_1_fun/bkqd,bksd->bkqs/dot_general",
     "ynn_fusion.2", "matmul: attention scores/values"),
    ("transpose(jvp(Decoder))/while/body/closed_call/layers/attn/transpose", "transpose.4",
     "copies, transposes, slices"),
    ("jvp(Decoder)/while/body/jit(dynamic_update_index_in_dim)/dynamic_update_slice", "fusion.9",
     "copies, transposes, slices"),
    ("transpose(jvp(Decoder))/while/body/closed_call/layers/post_attn_norm/reduce_sum", "fusion.5",
     "layer elementwise (norms, rotary, SiLU, attention softmax)"),
    ("transpose(jvp(Decoder))/while/body/closed_call", "call.2", "control (while, call, cond: self time)"),
    ("mul", "fusion.12", "outside the model (optimizer, grad norms, loss)"),
])
def test_kinds_follow_the_source_op(label, instruction, kind):
  assert train_profile.kind_of(label, instruction) == kind


def test_a_traced_step_has_every_op_in_one_kind(capsys, monkeypatch):
  monkeypatch.setitem(train_profile.random_models.WIDTHS, "wide_vocab", dict(
      vocab_size=32768, hidden_size=256, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
      head_dim=16, tie_word_embeddings=True))
  step, state, batch, _ = train_profile.build_step("wide_vocab", 1, 2, 2, 32, keep_logits=True)
  totals, labels, wall_s, _ = train_profile.profile_step(step, state, batch, steps=1)
  by_op, _, by_kind = train_profile.summarize(totals, labels)
  assert wall_s > 0 and sum(by_kind.values()) == sum(by_op.values()) == sum(totals.values()) > 0
  projection = [op for op in by_op if "Decoder.logits" in op and op.endswith("dot_general")]
  assert projection, by_op.most_common(10)
  assert {train_profile.kind_of(op, "") for op in projection} == {"matmul: vocabulary projection (fwd, grads)"}
  assert by_kind["matmul: vocabulary projection (fwd, grads)"] > 0, by_kind
  assert by_kind["vocabulary softmax / log-prob passes"] > 0, by_kind
