"""The plan of token_logprobs' vocabulary chunks (models/vocab_chunks.py) against hand-counted values, apart from
the runner; and token_logprobs with random needed-position masks against the same call without one."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis.extra import numpy as hnp

from oapl_jax.models import vocab_chunks, vocab_logprobs
from oapl_jax.models.vocab_chunks import ChunkPlan


def test_the_plan_of_37_tokens_in_chunks_of_16_with_two_tail_levels():
  # 37 tokens in 3 chunks of 13 (padded to 39); tails: unit ceil(13 / 4) = 4, and 8
  plan = vocab_chunks.make_plan(1, 37, 1, 16, tail_levels=2, masked=True)
  assert plan == ChunkPlan(rows=1, length=37, shards=1, chunks=3, chunk=13, tails=(8, 4), masked=True, recompute=True)
  assert plan.tokens == 37 and not plan.unrolled
  assert vocab_chunks.make_plan(1, 37, 1, 16, tail_levels=2, masked=False).tails == ()
  assert vocab_chunks.make_plan(1, 37, 1, 16, tail_levels=2, masked=True, recompute=False).unrolled
  # recompute=True keeps the blocks where all of them fit: (39 + 8 + 4) tokens x 10 words x 4 bytes
  kept = lambda keep_bytes: vocab_chunks.make_plan(  # noqa: E731
      1, 37, 1, 16, tail_levels=2, masked=True, keep_bytes=keep_bytes, vocab=lambda: 10)
  assert not kept(51 * 10 * 4).recompute and kept(51 * 10 * 4 - 1).recompute


def _schedule(plan, need, seed=0):
  """The schedule of one shard with `need` needed tokens at random positions."""
  needed_N = np.random.RandomState(seed).permutation(np.arange(plan.tokens) < need)
  return vocab_chunks.make_schedule(plan, jnp.asarray(needed_N)[None]), needed_N


# need: (live whole chunks, tail starts, live tails), counted by hand for chunks of 13 and tails of 8 and 4
@pytest.mark.parametrize("need, live_K, starts, lives", [
    (0, [0, 0, 0], (0, 0), (0, 0)),
    (5, [0, 0, 0], (0, 8), (1, 0)),      # 5 -> 2 units: the 8
    (13, [1, 0, 0], (13, 13), (0, 0)),   # one whole chunk, nothing left
    (22, [1, 0, 0], (13, 21), (1, 1)),   # 13 + 9 -> 3 units: 8 at 13, 4 at 21
    (31, [1, 1, 0], (26, 34), (1, 0)),   # 26 + 5 -> 2 units
    (37, [1, 1, 0], (26, 34), (1, 1)),   # 26 + 11 -> 3 units: to 38, within the padded 39
])
def test_the_schedule_of_37_tokens_counted_by_hand(need, live_K, starts, lives):
  plan = vocab_chunks.make_plan(1, 37, 1, 16, tail_levels=2, masked=True)
  schedule, needed_N = _schedule(plan, need)
  np.testing.assert_array_equal(schedule.live_K, np.asarray(live_K, bool))
  assert tuple(int(s) for s in schedule.tail_starts) == starts
  assert tuple(bool(x) for x in schedule.tail_lives) == tuple(map(bool, lives))
  order_N = np.asarray(schedule.order_SxN[0])  # the needed tokens first, each group in its order
  np.testing.assert_array_equal(order_N, np.concatenate([np.flatnonzero(needed_N), np.flatnonzero(~needed_N)]))
  np.testing.assert_array_equal(order_N[np.asarray(schedule.unorder_SxN[0])], np.arange(37))


def test_a_rest_the_tails_would_fill_runs_in_one_more_whole_chunk():
  # 48 tokens in 3 chunks of 16, tails 8 and 4: 45 = 32 + 13, and 13 -> 4 units = 16, a whole chunk
  plan = vocab_chunks.make_plan(1, 48, 1, 16, tail_levels=2, masked=True)
  assert (plan.chunks, plan.chunk, plan.tails) == (3, 16, (8, 4))
  schedule, _ = _schedule(plan, 45)
  np.testing.assert_array_equal(schedule.live_K, [True, True, True])
  assert not any(bool(x) for x in schedule.tail_lives)


@pytest.mark.parametrize("tokens, levels", [(37, 2), (48, 2), (48, 0), (100, 3)])
def test_the_schedule_runs_the_tokens_projected_tokens_counts(tokens, levels):
  plan = vocab_chunks.make_plan(1, tokens, 1, 16, tail_levels=levels, masked=True)
  for need in range(tokens + 1):
    schedule, _ = _schedule(plan, need, seed=need)
    run = int(np.sum(schedule.live_K)) * plan.chunk + sum(
        size for size, live in zip(plan.tails, schedule.tail_lives) if live)
    assert run == vocab_chunks.projected_tokens(need, tokens, 16, levels), need
    assert run >= need


def test_the_fullest_shard_sets_the_live_chunks_and_each_shard_keeps_its_own_order():
  plan = vocab_chunks.make_plan(4, 3, 2, 2, masked=True)  # 2 shards of 2 rows x 3 = 6 tokens, 3 chunks of 2
  needed_BxT = np.zeros((4, 3), bool)
  needed_BxT[0, 1] = needed_BxT[1, 1] = True  # shard 0: tokens 1, 4
  needed_BxT[2, [0, 2]] = needed_BxT[3, [0, 2]] = True  # shard 1: tokens 0, 2, 3, 5
  schedule = vocab_chunks.make_schedule(plan, jnp.asarray(needed_BxT))
  np.testing.assert_array_equal(schedule.order_SxN, [[1, 4, 0, 2, 3, 5], [0, 2, 3, 5, 1, 4]])
  np.testing.assert_array_equal(schedule.live_K, [True, True, False])  # 4 needed tokens: 2 chunks


_B, _T, _V, _E = 3, 12, 32, 8  # 36 tokens in chunks of 8: 5 chunks (kept: pieces of one call), tails 4 and 2
_PROJECT = lambda w, h: jnp.einsum("...e,ve->...v", h, w)  # pylint: disable=unnecessary-lambda-assignment
_RNG = np.random.RandomState(5)
_W, _H = (jnp.asarray(_RNG.normal(size=s), jnp.float32) for s in ((_V, _E), (_B, _T, _E)))
_TARGETS, _U = jnp.asarray(_RNG.randint(0, _V, (_B, _T))), jnp.asarray(_RNG.normal(size=(_B, _T)), jnp.float32)


@functools.cache
def _runs(levels, recompute):
  """Jitted (logp, entropy) and the gradient of sum(u * logp at needed positions) + sum(entropy there), with a
  needed mask (an argument) and without one."""
  def values(needed):
    return vocab_logprobs.token_logprobs(_PROJECT, _W, _H, _TARGETS, needed, chunk_tokens=8, with_entropy=True,
                                         recompute=recompute, tail_levels=levels)

  def grads(needed, masked):
    def loss(w, h):
      logp, entropy = vocab_logprobs.token_logprobs(_PROJECT, w, h, _TARGETS, needed if masked else None,
                                                    chunk_tokens=8, with_entropy=True, recompute=recompute,
                                                    tail_levels=levels)
      return jnp.sum(jnp.where(needed, _U * logp + entropy, 0.0))
    return jax.grad(loss, argnums=(0, 1))(_W, _H)

  return (jax.jit(values), jax.jit(values)(None), jax.jit(functools.partial(grads, masked=True)),
          jax.jit(functools.partial(grads, masked=False)))


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("levels", [0, 1, 2])
@settings(max_examples=15, deadline=None, database=None)
@given(needed=hnp.arrays(np.bool_, (_B, _T)))
@example(needed=np.zeros((_B, _T), bool))
@example(needed=np.ones((_B, _T), bool))
def test_needed_positions_equal_the_full_computation_and_the_rest_are_zero(levels, recompute, needed):
  masked, full, masked_grads, full_grads = _runs(levels, recompute)
  for got, want in zip(masked(jnp.asarray(needed)), full):
    np.testing.assert_allclose(np.asarray(got)[needed], np.asarray(want)[needed], rtol=1e-6, atol=1e-6)
    assert np.all(np.asarray(got)[~needed] == 0)
  for got, want in zip(masked_grads(jnp.asarray(needed)), full_grads(jnp.asarray(needed))):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
