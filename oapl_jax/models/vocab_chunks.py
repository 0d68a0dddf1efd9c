"""Which of a batch's tokens go through the vocabulary projection in which chunk: the plan that
models/vocab_logprobs.token_logprobs runs.

    plan = make_plan(B, T, row_shards(B), chunk_tokens, tail_levels, masked, recompute)  # static
    schedule = make_schedule(plan, needed_BxT)                 # traced: token order, live chunks, tail starts
    (h_KxSxCxE, targets_KxSxC, live_K), tails = pieces(plan, schedule, hidden_BxTxE, targets_BxT)
    out_BxT = joined(plan, schedule, out_KxSxC, tail_outs)     # the runner's outputs at the batch's positions

A batch's rows are split into S row shards (contiguous blocks, one per activation_batch shard); each shard's N
tokens (its rows' positions, in order) run in K chunks of C tokens, padded to K x C. With a needed-positions mask
each shard's needed tokens move to the front (order kept), the chunks past the fullest shard's needed tokens are
skipped, and the needed tokens past the last whole chunk run in tails (`tail_sizes`) instead of one more whole chunk.
The host functions (chunk_plan, tail_sizes, kept_block_bytes, recomputes, projected_tokens) count the same plan
for FLOP and memory estimates.
"""
import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from oapl_jax import parallel


# With a needed-positions mask, the kept path runs up to this many whole chunks, and the tails, as pieces of one call
# (vocab_logprobs._kept_pieces) instead of a map over the chunks. Under a map, every chunk's kept block is written
# into a zero-filled stacked output and sliced out again for the backward: at train_bench's 2 x 4 x 256 (Qwen3-0.6B
# width, 2 chunks and a tail run) the log-probs' forward and backward took 6.76 vs 6.46 s, and XLA's temporaries 2.84
# vs 2.36 GiB with the pieces' weight gradients summed one by one. (Without a mask no piece is skipped, and XLA summed
# them all at once.)
UNROLLED_KEPT_CHUNKS = 8


def chunk_plan(tokens: int, budget: int) -> tuple[int, int]:
  """(chunks, tokens per chunk): `tokens` in as few nearly equal chunks of <= budget as there can be."""
  chunks = -(-tokens // budget)
  return chunks, -(-tokens // chunks)


def tail_sizes(chunk: int, levels: int) -> tuple[int, ...]:
  """The smaller chunks that stand in for a partly needed last chunk, largest first: unit x 2^j for j < levels,
  unit = ceil(chunk / 2^levels), those below `chunk`. Any count of needed tokens short of a whole chunk is
  covered, rounded up to a unit, by one subset of them."""
  unit = -(-chunk // 2**levels)
  return tuple(unit << j for j in reversed(range(levels)) if unit << j < chunk)


def kept_block_bytes(tokens: int, chunk_tokens: int, tail_levels: int, vocab: int, needed_mask: bool = True) -> int:
  """Bytes per device of the float32 blocks the forward keeps when the backward reuses them (recompute=False): every
  chunk's [C, V] (and, with a needed-positions mask, every tail's), live or not, for a row shard of `tokens`."""
  chunks, chunk = chunk_plan(tokens, chunk_tokens)
  tails = tail_sizes(chunk, tail_levels) if needed_mask else ()
  return 4 * vocab * (chunks * chunk + sum(tails))


def recomputes(recompute: bool, keep_bytes: int, tokens: int, chunk_tokens: int, tail_levels: int, vocab: int,
               needed_mask: bool = True) -> bool:
  """Whether the backward recomputes the logits: recompute=False never does; recompute=True does unless the kept
  blocks (kept_block_bytes) fit in `keep_bytes` (models/execution.Execution.logprob_keep_bytes)."""
  return recompute and kept_block_bytes(tokens, chunk_tokens, tail_levels, vocab, needed_mask) > keep_bytes


def _cover(need, chunk: int, unit: int):
  """(whole chunks, units of the rest, whether the rest runs in tails): `need` tokens as whole chunks, then the rest
  rounded up to tail units, or one more whole chunk where those units would fill it. `need`: an int or traced."""
  whole = need // chunk
  units = -(-(need % chunk) // unit)
  return whole, units, units * unit < chunk


def projected_tokens(needed: int, tokens: int, chunk_tokens: int, tail_levels: int) -> int:
  """How many tokens a row shard of `tokens` positions, `needed` of them read, runs through the projection
  (token_logprobs' plan, on the host: for FLOP counts)."""
  chunks, chunk = chunk_plan(tokens, chunk_tokens)
  tails = tail_sizes(chunk, tail_levels)
  if not tails:
    return min(chunks, -(-needed // chunk)) * chunk
  whole, units, by_tails = _cover(needed, chunk, tails[-1])
  return whole * chunk + (units * tails[-1] if by_tails else chunk)


def row_shards(rows: int) -> int:
  """How many row shards the batch's rows split into: activation_batch's size in the current sharding context
  where it divides `rows`, else 1 (rows are sharded in contiguous blocks)."""
  ctx = parallel.current_context()
  shards = parallel.axis_size(*ctx, "activation_batch") if ctx else 1
  return shards if rows % shards == 0 else 1


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
  """The static plan: a [rows, length] batch as `shards` row shards of N tokens, each in K chunks of C."""
  rows: int  # B
  length: int  # T
  shards: int  # S, dividing B
  chunks: int  # K
  chunk: int  # C: tokens per chunk, K x C >= N
  tails: tuple[int, ...]  # tail chunk sizes, largest first (a unit and its doublings); () without a mask
  masked: bool  # a needed-positions mask reorders each shard's tokens and skips chunks
  recompute: bool  # the backward recomputes the logits; else each chunk keeps its [C, V] block

  @property
  def tokens(self) -> int:  # N, per row shard
    return self.rows // self.shards * self.length

  @property
  def unrolled(self) -> bool:  # the whole chunks and tails as kept pieces of one call, not a map
    return not self.recompute and self.masked and self.chunks <= UNROLLED_KEPT_CHUNKS


def make_plan(rows: int, length: int, shards: int, chunk_tokens: int, tail_levels: int = 0, masked: bool = False,
              recompute: bool = True, keep_bytes: int = 0, vocab: Optional[Callable[[], int]] = None) -> ChunkPlan:
  """The plan of a [rows, length] batch over `shards` row shards, chunks of at most `chunk_tokens` tokens. With
  `recompute` and `keep_bytes`, the backward reuses kept blocks where all of them fit (`recomputes`); `vocab` gives
  the vocabulary's size, asked only then."""
  tokens = rows // shards * length
  chunks, chunk = chunk_plan(tokens, chunk_tokens)
  if recompute and keep_bytes:
    recompute = recomputes(recompute, keep_bytes, tokens, chunk_tokens, tail_levels, vocab(), masked)
  tails = tail_sizes(chunk, tail_levels) if masked else ()
  return ChunkPlan(rows, length, shards, chunks, chunk, tails, masked, recompute)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """The plan's traced part, from the needed-positions mask (None and () without one)."""
  needed_SxN: Optional[jax.Array]
  order_SxN: Optional[jax.Array]  # each shard's tokens, needed first, each group in its order
  unorder_SxN: Optional[jax.Array]  # the inverse permutation, for the outputs
  live_K: Optional[jax.Array]  # which whole chunks run
  tail_starts: tuple[jax.Array, ...]  # each tail's first token in the ordered tokens, after the runs before it
  tail_lives: tuple[jax.Array, ...]  # which tails run


def make_schedule(plan: ChunkPlan, needed_BxT) -> Schedule:
  """The chunks and tails that hold the fullest shard's needed tokens: whole chunks up to them, then the rest in
  the tails whose sizes make its count of units (their bits), or in one more whole chunk where they would fill it."""
  if needed_BxT is None:
    return Schedule(None, None, None, None, (), ())
  S, N, K, C = plan.shards, plan.tokens, plan.chunks, plan.chunk
  needed_SxN = needed_BxT.reshape(S, N).astype(bool)
  order_SxN = jnp.argsort(~needed_SxN, axis=1, stable=True)
  unorder_SxN = jnp.argsort(order_SxN, axis=1)
  need = jnp.max(jnp.sum(needed_SxN, axis=1))  # all at the front of their shard
  if not plan.tails:
    return Schedule(needed_SxN, order_SxN, unorder_SxN, jnp.arange(K) * C < need, (), ())
  unit = plan.tails[-1]
  whole, units, by_tails = _cover(need, C, unit)
  live_K = (jnp.arange(K) < whole) | ((jnp.arange(K) == whole) & ~by_tails)
  bits = [size // unit for size in plan.tails]
  starts = tuple(whole * C + (units & ~(2 * bit - 1)) * unit for bit in bits)
  lives = tuple(by_tails & (units & bit > 0) for bit in bits)
  return Schedule(needed_SxN, order_SxN, unorder_SxN, live_K, starts, lives)


def _shard_constrained(x_SxMx_, lead=()):
  spec = lead + ("activation_batch",) + (None,) * (x_SxMx_.ndim - len(lead) - 1)
  return parallel.constrain_where_divisible(x_SxMx_, spec)


def pieces(plan: ChunkPlan, schedule: Schedule, hidden_BxTxE, targets_BxT):
  """The runner's inputs, from each shard's tokens in the schedule's order padded to K x C: the whole chunks
  (h [K, S, C, E], targets [K, S, C], live_K) and per tail (h [S, size, E], targets [S, size], live)."""
  S, N, K, C = plan.shards, plan.tokens, plan.chunks, plan.chunk
  h_SxNxE, targets_SxN = hidden_BxTxE.reshape(S, N, hidden_BxTxE.shape[-1]), targets_BxT.reshape(S, N)
  if schedule.order_SxN is not None:
    h_SxNxE = jnp.take_along_axis(h_SxNxE, schedule.order_SxN[..., None], axis=1)
    targets_SxN = jnp.take_along_axis(targets_SxN, schedule.order_SxN, axis=1)

  def to_chunks(x_SxPx_):  # [S, K * C, ...] -> [K, S, C, ...]
    return _shard_constrained(jnp.swapaxes(x_SxPx_.reshape(S, K, C, *x_SxPx_.shape[2:]), 0, 1), lead=(None,))

  pad = lambda x: jnp.pad(x, ((0, 0), (0, K * C - N)) + ((0, 0),) * (x.ndim - 2))  # noqa: E731
  h_SxPxE, targets_SxP = pad(h_SxNxE), pad(targets_SxN)
  chunks = (to_chunks(h_SxPxE), to_chunks(targets_SxP), schedule.live_K)
  tails = []
  for size, start, live in zip(plan.tails, schedule.tail_starts, schedule.tail_lives):
    take = lambda x: _shard_constrained(jax.lax.dynamic_slice_in_dim(x, start, size, axis=1))  # noqa: E731
    tails.append((take(h_SxPxE), take(targets_SxP), live))
  return chunks, tails


def joined(plan: ChunkPlan, schedule: Schedule, out_KxSxC, tail_outs):
  """The runner's outputs at the batch's positions, [B, T]: the whole chunks' [K, S, C] with each tail's [S, size]
  added at its start, back in the shards' own order (positions not needed: 0)."""
  out_SxP = jnp.swapaxes(out_KxSxC, 0, 1).reshape(plan.shards, plan.chunks * plan.chunk)
  for start, tail_SxL in zip(schedule.tail_starts, tail_outs):
    out_SxP = out_SxP + jax.lax.dynamic_update_slice_in_dim(jnp.zeros_like(out_SxP), tail_SxL, start, 1)
  out_SxN = out_SxP[:, :plan.tokens]
  if schedule.order_SxN is not None:
    out_SxN = jnp.where(schedule.needed_SxN, jnp.take_along_axis(out_SxN, schedule.unorder_SxN, axis=1), 0.0)
  return out_SxN.reshape(plan.rows, plan.length)
