"""Log-probs (and entropies) of target tokens through the vocabulary projection, with a hand-written VJP.

    logp_BxT = token_logprobs(project, w, hidden_BxTxE, targets_BxT, needed_BxT, chunk_tokens=512)
    logp_RxC = chunk_logprobs(project, w, h_RxCxE, targets_RxC, temperature)   # project(w, h) -> logits [R, C, V]

`token_logprobs` maps `chunk_logprobs` over each row shard's tokens in chunks bounded by a token budget, and
skips the chunks holding no position the caller reads (a loss's prompts and padding); the read tokens past the
last whole chunk run in halves, quarters and eighths of a chunk (`tail_sizes`), not in one more whole chunk
(1,344 projected positions instead of 1,536 for the train benchmark's 1,332 response tokens). For one chunk, the
forward keeps only the log-normaliser per token; the backward recomputes the logits once and forms
dz = g * (onehot(target) - softmax(z)) in one exp pass over [R, C, V] (the target entries by an in-place
update; plus the entropy's term, when it is differentiated) before the two matmuls of the projection's
transpose. Autodiff through `jax.checkpoint` does the same matmuls but many more passes over [R, C, V]
(logsumexp's max, exp and sum again, the gather's scatter, the adds): at Qwen's 151,936 words those passes
were about 15% of a train step's op time on CPU (a profile at Qwen3-0.6B width).

The plan of chunks (which of each row shard's tokens run in which chunk or tail, and whether the backward
recomputes) is models/vocab_chunks.py; `token_logprobs` makes it, runs it (`_run`) and puts the outputs back at
the batch's positions.

With recompute=False (models/execution.Execution.logprob_recompute) the forward keeps, instead of the logits,
exp(z - max z) with its sum subtracted at the target: the log-probs' cotangent up to that per-position factor.
The backward is then the two matmuls alone, the factor applied to their [R, C, E] side: one matmul and every
pass over [R, C, V] fewer, for [tokens, V] of memory, as torch's autograd keeps the logits. `project` must be
linear in h and bias-free, position by position (a vocabulary projection is), for the factor to move to h.

Values equal jax.nn.log_softmax(project(w, h) / temperature)[target] and -sum(p log p); gradients equal autodiff's
(tests/models_logprobs_test.py checks both against the plain formulas).
"""
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import custom_derivatives

from oapl_jax.models import vocab_chunks
# the plan's host counts, named here by their callers (compile_check, the benchmarks, the tests)
from oapl_jax.models.vocab_chunks import (  # noqa: F401
    chunk_plan, kept_block_bytes, projected_tokens, recomputes, tail_sizes)


def _scaled(logits_RxCxV, temperature: float):
  z_RxCxV = logits_RxCxV.astype(jnp.float32)
  return z_RxCxV if temperature == 1.0 else z_RxCxV / temperature


def _forward(project, temperature, with_entropy, keep, w, h_RxCxE, targets_RxC):
  """(logp, entropy or None), log-normaliser, and with `keep` (sum e, block), block = e - sum(e) * onehot(target)
  with e = exp(z - max z): onehot - softmax(z) = -block / sum(e), the logp cotangent with its one entry per
  position in place (else ()). One max and one exp pass over the chunk's logits: log Z is jax.nn.logsumexp's
  value (log of the shifted sum, plus the max), the entropy log Z - E_p[z]."""
  logits_RxCxV = project(w, h_RxCxE)
  z_RxCxV = _scaled(logits_RxCxV, temperature)
  max_RxC = jnp.max(z_RxCxV, axis=-1)
  max_RxC = jnp.where(jnp.isfinite(max_RxC), max_RxC, 0.0)
  e_RxCxV = jnp.exp(z_RxCxV - max_RxC[..., None])
  sum_RxC, ez_RxC = _sums_last(e_RxCxV, z_RxCxV) if with_entropy else (jnp.sum(e_RxCxV, axis=-1), None)
  logz_RxC = jnp.log(sum_RxC) + max_RxC
  logp_RxC = jnp.take_along_axis(z_RxCxV, targets_RxC[..., None], axis=-1)[..., 0] - logz_RxC
  kept = (sum_RxC, _minus_at_targets(e_RxCxV, targets_RxC, sum_RxC).astype(logits_RxCxV.dtype)) if keep else ()
  if not with_entropy:
    return (logp_RxC, None), logz_RxC, kept
  entropy_RxC = logz_RxC - ez_RxC / sum_RxC
  return (logp_RxC, entropy_RxC), logz_RxC, kept


def _sums_last(e_RxCxV, z_RxCxV):
  """(sum e, sum e * z) over the last axis, in one variadic reduction. XLA's CPU backend runs a lone multiply-sum as
  a YNNPACK fusion far below the memory rate: over [512, 151,936] float32, sum(e * z) took 171 ms and sum(e) 22 ms,
  both as one reduction 66 ms (Intel AVX-512 host, 2026-11-27; the entropy's sum was ~16% of a real-width train step
  there before it ran on a 2-d view, 4% after)."""
  return jax.lax.reduce((e_RxCxV, e_RxCxV * z_RxCxV), (jnp.float32(0), jnp.float32(0)),
                        lambda a, b: (a[0] + b[0], a[1] + b[1]), (e_RxCxV.ndim - 1,))


def _minus_at_targets(x_RxCxV, targets_RxC, amount_RxC):
  """x with amount subtracted at each position's target word (an in-place update of R x C entries)."""
  R, C = targets_RxC.shape
  return x_RxCxV.at[jnp.arange(R)[:, None], jnp.arange(C)[None, :], targets_RxC].add(-amount_RxC)


def _zeros_like_shapes(fn):
  """A function returning zeros shaped like fn()'s outputs (None leaves stay None)."""
  return lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn))


def _when(live, fn):
  """fn() if live, else zeros of its shapes: a skipped chunk runs no projection. live=None: always."""
  return fn() if live is None else jax.lax.cond(live, fn, _zeros_like_shapes(fn))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _chunk(project, temperature, with_entropy, recompute, w, h_RxCxE, targets_RxC, live):
  return _chunk_fwd(project, temperature, with_entropy, recompute, w, h_RxCxE, targets_RxC, live)[0]


def _chunk_fwd(project, temperature, with_entropy, recompute, w, h_RxCxE, targets_RxC, live):
  out, logz_RxC, kept = _when(live, lambda: _forward(project, temperature, with_entropy, not recompute, w, h_RxCxE,
                                                      targets_RxC))  # kept: a [R, C, V] block alive to the backward
  # w and h are the chunk's own inputs: a map over chunks keeps them once, not per chunk
  return out, (w, h_RxCxE, targets_RxC, live, logz_RxC, out[1], kept)


def _values(primals):
  """The primals' values: symbolic_zeros=True wraps each leaf in a CustomVJPPrimal."""
  return jax.tree.map(lambda p: p.value, primals, is_leaf=lambda x: isinstance(x, custom_derivatives.CustomVJPPrimal))


def _chunk_fwd_rule(project, temperature, with_entropy, recompute, *primals):
  return _chunk_fwd(project, temperature, with_entropy, recompute, *_values(primals))


def _chunk_grads(project, temperature, with_entropy, recompute, residuals, cotangents):
  """A function giving the chunk's (dw, dh): dz = g * (onehot - p) (+ the entropy's term), then the projection's
  transpose (two matmuls).

  Recomputing: one exp pass over the recomputed logits writes g * (p - onehot) scaled, the target entry by an
  in-place update. Kept: the forward's block is e - sum(e) * onehot, so dz = -(g / sum e) * block, and the
  per-position factor r moves to the [R, C, E] side: a projection linear and bias-free in h gives
  d/dw <r * D, project(w, h)> = d/dw <D, project(w, r * h)> and d/dh = r * (D through the weights' transpose);
  the backward makes no pass over [R, C, V]. An entropy that is differentiated adds -g_H * p * (log p + H) in
  one pass. An output nothing differentiates (a symbolic zero: the trainer's entropy, a metric under
  stop_gradient) adds no term, so its pass over [R, C, V] is not run (XLA's cost analysis of one chunk: +12%
  FLOPs, +43% bytes with it). A skipped chunk's gradients are zeros."""
  w, h_RxCxE, targets_RxC, live, logz_RxC, entropy_RxC, kept = residuals
  g_logp_RxC, g_entropy_RxC = (None if isinstance(g, custom_derivatives.SymbolicZero) else g for g in cotangents)
  entropy_differentiated = with_entropy and g_entropy_RxC is not None

  def entropy_term(p_RxCxV, logp_RxCxV):  # d entropy / dz = -p (log p + H), times g_H, per raw logit
    term_RxCxV = jnp.where(p_RxCxV > 0, p_RxCxV * (logp_RxCxV + entropy_RxC[..., None]), 0.0)
    return (g_entropy_RxC / temperature)[..., None] * term_RxCxV

  def run():
    g_RxC = jnp.zeros_like(logz_RxC) if g_logp_RxC is None else g_logp_RxC
    if recompute:
      logits_RxCxV, project_vjp = jax.vjp(project, w, h_RxCxE)
      z_RxCxV = _scaled(logits_RxCxV, temperature)
      p_RxCxV = jnp.exp(z_RxCxV - logz_RxC[..., None])
      scale_RxC = -g_RxC / temperature  # dz = scale * (p - onehot)
      dz_RxCxV = _minus_at_targets(scale_RxC[..., None] * p_RxCxV, targets_RxC, scale_RxC)
      if entropy_differentiated:
        dz_RxCxV = dz_RxCxV - entropy_term(p_RxCxV, z_RxCxV - logz_RxC[..., None])
      return project_vjp(dz_RxCxV.astype(logits_RxCxV.dtype))
    sum_RxC, block_RxCxV = kept
    scale_RxC = -g_RxC / (sum_RxC * temperature)  # dz = scale * block
    if entropy_differentiated:  # p and log p from the block: e = block + sum(e) onehot, log p = log e - log sum
      e_RxCxV = _minus_at_targets(block_RxCxV.astype(jnp.float32), targets_RxC, -sum_RxC)
      logp_RxCxV = jnp.log(jnp.where(e_RxCxV > 0, e_RxCxV, 1.0)) - jnp.log(sum_RxC)[..., None]
      block_RxCxV = (scale_RxC[..., None] * block_RxCxV
                     - entropy_term(e_RxCxV / sum_RxC[..., None], logp_RxCxV)).astype(block_RxCxV.dtype)
      scale_RxC = jnp.ones_like(scale_RxC)
    h_scaled_RxCxE = (h_RxCxE * scale_RxC[..., None]).astype(h_RxCxE.dtype)
    _, project_vjp = jax.vjp(project, w, h_scaled_RxCxE)  # its forward is unused: XLA drops that matmul
    dw, dh_RxCxE = project_vjp(block_RxCxV)
    return dw, (dh_RxCxE * scale_RxC[..., None]).astype(h_RxCxE.dtype)

  return run


def _chunk_bwd(project, temperature, with_entropy, recompute, residuals, cotangents):
  dw, dh_RxCxE = _when(residuals[3], _chunk_grads(project, temperature, with_entropy, recompute, residuals, cotangents))
  return dw, dh_RxCxE, None, None


_chunk.defvjp(_chunk_fwd_rule, _chunk_bwd, symbolic_zeros=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _kept_pieces(project, temperature, with_entropy, w, hs, targets, lives):
  """_chunk with kept blocks over several pieces (chunks of any sizes) at once: the backward sums the pieces' weight
  gradients in one buffer, a skipped piece adding nothing, where separate calls leave each piece's gradient (zeros
  for a skipped one) alive to one sum at the end."""
  return _kept_pieces_fwd(project, temperature, with_entropy, w, hs, targets, lives)[0]


def _kept_pieces_fwd(project, temperature, with_entropy, w, hs, targets, lives):
  outs = [_chunk_fwd(project, temperature, with_entropy, False, w, *xs) for xs in zip(hs, targets, lives)]
  return tuple(o for o, _ in outs), tuple(r for _, r in outs)


def _kept_pieces_fwd_rule(project, temperature, with_entropy, *primals):
  return _kept_pieces_fwd(project, temperature, with_entropy, *_values(primals))


def _kept_pieces_bwd(project, temperature, with_entropy, residuals, cotangents):
  """Each piece's (dw, dh); dw added to the sum so far inside the piece's `live` cond (a traced bool per piece)."""
  dw, dhs = None, []
  for res, cts in zip(residuals, cotangents):
    live, h_RxCxE = res[3], res[1]
    run = _chunk_grads(project, temperature, with_entropy, False, res, cts)

    def added(acc, run=run):
      dw_piece, dh_RxCxE = run()
      return jax.tree.map(jnp.add, acc, dw_piece), dh_RxCxE

    if dw is None:
      dw, dh_RxCxE = _when(live, run)
    else:
      dw, dh_RxCxE = jax.lax.cond(live, added, lambda acc: (acc, jnp.zeros_like(h_RxCxE)), dw)
    dhs.append(dh_RxCxE)
  return dw, tuple(dhs), tuple(None for _ in dhs), tuple(None for _ in dhs)


_kept_pieces.defvjp(_kept_pieces_fwd_rule, _kept_pieces_bwd, symbolic_zeros=True)


def chunk_logprobs(project: Callable, w, h_RxCxE, targets_RxC, temperature: float = 1.0, with_entropy: bool = False,
                   recompute: bool = True, live=None):
  """log softmax(project(w, h) / temperature)[target], float32 [R, C] (and the entropy of each position's
  distribution, with `with_entropy`). `project(w, h)` must be a pure function of its arguments, linear and
  bias-free in h position by position (a model's vocabulary projection with w the weights it reads), so that
  the backward can recompute it and move a per-position factor onto h. recompute=False keeps a [R, C, V] block
  for the backward instead (saves one matmul and a pass; under a map over chunks, every chunk's block stays
  alive until the backward). `live`: a traced bool; False runs nothing, forward or backward, and
  gives zeros (None: always live)."""
  logp_RxC, entropy_RxC = _chunk(project, float(temperature), bool(with_entropy), bool(recompute), w, h_RxCxE,
                                 targets_RxC, live)
  return (logp_RxC, entropy_RxC) if with_entropy else logp_RxC




def _run(plan: vocab_chunks.ChunkPlan, schedule: vocab_chunks.Schedule, project, w, hidden_BxTxE, targets_BxT,
         temperature: float, with_entropy: bool):
  """The plan's whole chunks (a map over them, or with kept blocks the pieces of one call) and its tails: the
  chunks' outputs [K, S, C] and each tail's [S, size] (pytrees: (logp, entropy) with `with_entropy`)."""
  chunks, tails = vocab_chunks.pieces(plan, schedule, hidden_BxTxE, targets_BxT)

  def one_chunk(h_SxCxE, targets_SxC, live):
    return chunk_logprobs(project, w, h_SxCxE, targets_SxC, temperature=temperature, with_entropy=with_entropy,
                          recompute=plan.recompute, live=live)

  if not plan.unrolled:
    return jax.lax.map(lambda xs: one_chunk(*xs), chunks), [one_chunk(*piece) for piece in tails]
  # each kept block its own buffer: no stacked output to zero-fill, write into and slice again
  K = plan.chunks
  pieces = [tuple(x[k] for x in chunks) for k in range(K)] + tails
  outs = _kept_pieces(project, float(temperature), bool(with_entropy), w, *zip(*pieces))
  outs = [o if with_entropy else o[0] for o in outs]
  return jax.tree.map(lambda *x_K: jnp.stack(x_K), *outs[:K]), outs[K:]


def token_logprobs(project: Callable, w, hidden_BxTxE, targets_BxT, needed_BxT=None, *, chunk_tokens: int,
                   temperature: float = 1.0, with_entropy: bool = False, recompute: bool = True,
                   tail_levels: int = 0, keep_bytes: int = 0):
  """log softmax(project(w, hidden) / temperature)[target] per position, float32 [B, T] (and entropies).

  Each row shard's tokens (its rows' positions, in order) run through `chunk_logprobs` in chunks of at most
  `chunk_tokens`, so one float32 [chunk, V] block is alive per device, however many rows the batch has, and
  each device projects only its own rows. `needed_BxT` (bool; None: all): the positions whose values the
  caller reads. Those are moved to the front of their shard's tokens (order kept), chunks holding none on
  any shard are skipped forward and backward, and every other position gives 0: a batch's prompts and
  padding cost no vocabulary projection. With `tail_levels` > 0 the needed tokens past the last whole chunk
  run in chunks of `tail_sizes(chunk, tail_levels)` instead of one more whole chunk, so the projection runs on
  at most a unit (chunk / 2^levels) more tokens than are needed, not up to a chunk more, at one more skipped
  or run chunk per level (each run chunk sums one more [V, E] weight gradient). With `recompute`, the backward
  still reuses kept blocks when all of them take at most `keep_bytes` per device (`recomputes`).
  """
  B, T, _ = hidden_BxTxE.shape
  vocab = lambda: jax.eval_shape(project, w, hidden_BxTxE[:1, :1]).shape[-1]  # noqa: E731
  plan = vocab_chunks.make_plan(B, T, vocab_chunks.row_shards(B), chunk_tokens, tail_levels, needed_BxT is not None,
                                recompute, keep_bytes, vocab)
  schedule = vocab_chunks.make_schedule(plan, needed_BxT)
  out_KxSxC, tail_outs = _run(plan, schedule, project, w, hidden_BxTxE, targets_BxT, temperature, with_entropy)
  return jax.tree.map(lambda o, *tails: vocab_chunks.joined(plan, schedule, o, tails), out_KxSxC, *tail_outs)
