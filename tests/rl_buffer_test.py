"""The rollout buffer: packing alignment, version purity, least-used-first sampling."""
import numpy as np
import pytest

from oapl_jax.objectives.batch_fields import FIELDS, Field
from oapl_jax.rl import batch_spec
from oapl_jax.rl.buffer import RolloutBuffer, pack_groups
from oapl_jax.sampler.api import RolloutGroups
from oapl_jax.sampler.settings import SamplingSettings


def _groups(version, P=2, G=2, N=3, seed=0):
  rng = np.random.default_rng(seed)
  return RolloutGroups(
      prompt_tokens=np.array([[5, 6, 7], [8, 9, 0]], np.int32)[:P], prompt_lengths=np.array([3, 2], np.int32)[:P],
      response_tokens=rng.integers(10, 20, (P, G, N)).astype(np.int32), response_mask=np.ones((P, G, N), bool),
      sampler_logp=-rng.random((P, G, N)).astype(np.float32), lengths=np.array([[3, 1], [2, 3]], np.int32)[:P, :G],
      finish_reason=np.ones((P, G), np.int8), snapshot_version=version, seed=0,
      settings=SamplingSettings(max_new_tokens=N))


def test_pack_groups_aligns_targets_mask_and_logp():
  g = _groups(1)
  packed = pack_groups(g, np.array([[1.0, 0.0], [0.5, 0.25]]), seq_len=6)
  # prompt [5,6,7] + response r0 (3 tokens): tokens = seq[:-1], targets = seq[1:]
  r = g.response_tokens[0, 0]
  np.testing.assert_array_equal(packed["tokens"][0, 0], [5, 6, 7, r[0], r[1], 0])
  np.testing.assert_array_equal(packed["targets"][0, 0], [6, 7, r[0], r[1], r[2], 0])
  np.testing.assert_array_equal(packed["response_mask"][0, 0], [0, 0, 1, 1, 1, 0])
  np.testing.assert_allclose(packed["sampler_token_logp"][0, 0, 2:5], g.sampler_logp[0, 0])
  # prompt [8,9] + 3 response tokens: first response target sits at index 1
  np.testing.assert_array_equal(packed["response_mask"][1, 1], [0, 1, 1, 1, 0, 0])
  # masked-out logps are zero, so sums over the mask equal the sampler's sequence log-prob
  np.testing.assert_allclose(packed["sampler_token_logp"].sum(-1)[0, 1], g.sampler_logp[0, 1, :1].sum(), rtol=1e-6)
  with pytest.raises(ValueError, match="exceed the trainer's sequence length"):
    pack_groups(g, np.zeros((2, 2)), seq_len=4)


def test_buffer_refuses_other_versions_and_reset_clears():
  buf = RolloutBuffer(seq_len=6)
  buf.reset(3)
  assert not buf.add(_groups(2), np.zeros((2, 2)))
  assert buf.add(_groups(3), np.zeros((2, 2)))
  assert buf.versions() == {3} and buf.num_groups() == 2
  buf.reset(4)
  assert buf.num_groups() == 0
  assert buf.sample(1, 1, np.random.default_rng(0), timeout=0.01) is None  # waits for a chunk, none comes


def test_sampling_draws_least_used_groups_first_and_only_visible_chunks():
  buf = RolloutBuffer(seq_len=6)
  buf.reset(1)
  buf.add(_groups(1, seed=0), np.array([[0.0, 0.0], [0.0, 0.0]]))
  buf.add(_groups(1, seed=1), np.array([[1.0, 1.0], [1.0, 1.0]]))
  rng = np.random.default_rng(0)
  first = buf.sample(2, chunks_visible=1, rng=rng)
  second = buf.sample(2, chunks_visible=1, rng=rng)
  assert (first["rewards"] == 0).all() and (second["rewards"] == 0).all()  # chunk 2 not visible yet
  np.testing.assert_array_equal(first["reuse"], [1, 1])
  np.testing.assert_array_equal(second["reuse"], [2, 2])  # both groups of chunk 1 were used once before
  third = buf.sample(2, chunks_visible=2, rng=rng)
  assert (third["rewards"] == 1).all()  # the unused groups of chunk 2 come first
  with pytest.raises(ValueError, match="fewer than the trainer batch"):
    buf.sample(5, chunks_visible=2, rng=rng)


def test_annotated_chunks_carry_their_arrays_into_batches():
  """GRPO's pi_old per round: a chunk annotated with per-group arrays serves them with its groups."""
  buf = RolloutBuffer(seq_len=8)
  buf.reset(1)
  for seed in (0, 1):
    assert buf.add(_groups(1, seed=seed), np.zeros((2, 2), np.float32))
  chunk = buf.chunk(1)
  old = [np.full_like(buf.chunk(i)["sampler_token_logp"], -(i + 1.0)) for i in (0, 1)]
  for i in (0, 1):
    buf.annotate(i, "old_policy_token_logp", old[i])
  batch = buf.sample(4, 2, np.random.default_rng(0))
  assert sorted(np.unique(batch["old_policy_token_logp"])) == [-2.0, -1.0]  # both chunks' rows, each its own
  np.testing.assert_array_equal(chunk["tokens"], buf.chunk(1)["tokens"])
  with pytest.raises(ValueError, match="3 rows for a chunk of 2 groups"):
    buf.annotate(0, "x", np.zeros((3, 2, 8)))
  buf.close()
  assert buf.chunk(5) is None  # closed before it arrived


def _unstated(batch, fields) -> list[str]:
  """How a sampled batch and a statement of its fields differ, both ways: names, then dtypes and shapes."""
  B, G, T = batch["tokens"].shape
  return ([f"{k}: packed, not stated" for k in sorted(set(batch) - set(fields))] +
          [f"{k}: stated, not packed" for k in sorted(set(fields) - set(batch))] +
          [f"{k}: {batch[k].dtype} {batch[k].shape}, stated {np.dtype(f.dtype)} {f.shape(B, G, T)}"
           for k, f in fields.items()
           if k in batch and (batch[k].dtype, batch[k].shape) != (np.dtype(f.dtype), f.shape(B, G, T))])


def test_the_packed_batch_is_the_stated_fields_both_ways():
  """objectives/batch_fields.FIELDS is the buffer's batch: every packed field stated, every stated field packed,
  in its dtype and its [B, G, T] or [B, G] shape; the optional ones when a chunk comes with them."""
  always = {k: f for k, f in FIELDS.items() if not f.optional}
  batches = []
  for optional in (False, True):
    buf = RolloutBuffer(seq_len=7)
    buf.reset(1)
    for seed in (0, 1):  # float64 and int inputs: the stated dtypes come out
      buf.add(_groups(1, seed=seed), np.ones((2, 2)), {"demo_slots": np.eye(2, dtype=int)} if optional else None)
      if optional:
        buf.annotate(seed, "old_policy_token_logp", np.full((2, 2, 7), -1.0))
    batch = buf.sample(3, 2, np.random.default_rng(0))
    assert batch.pop("reuse").shape == batch.pop("version").shape == (3,)  # the draw's bookkeeping, no field
    batches.append(batch)
  plain, full = batches
  assert _unstated(plain, always) == [] and _unstated(full, FIELDS) == []
  # both ways: a field stated but not packed, and fields packed but not stated, fail the comparison
  assert _unstated(plain, {**always, "new": Field(np.float32, False)}) == ["new: stated, not packed"]
  assert _unstated(full, always) == ["demo_slots: packed, not stated", "old_policy_token_logp: packed, not stated"]
  assert _unstated({**plain, "rewards": plain["rewards"][..., None]}, always) == \
      ["rewards: float32 (3, 2, 1), stated float32 (3, 2)"]
  # the spec the compile check and the train benchmarks build is that batch
  spec = batch_spec.train_batch(*plain["tokens"].shape)
  assert {k: (s.shape, s.dtype) for k, s in spec.items()} == {k: (v.shape, v.dtype) for k, v in plain.items()}
  with pytest.raises(ValueError, match="'x' is no field of the trainer's batch"):
    buf.annotate(0, "x", np.zeros((2, 2, 7)))
