"""Log-probs (and entropies) of target tokens through the vocabulary projection, with a hand-written VJP.

    logp_BxT = token_logprobs(project, w, hidden_BxTxE, targets_BxT, needed_BxT, chunk_tokens=512)
    logp_RxC = chunk_logprobs(project, w, h_RxCxE, targets_RxC, temperature)   # project(w, h) -> logits [R, C, V]

`token_logprobs` maps `chunk_logprobs` over each row shard's tokens in chunks bounded by a token budget, and
skips the chunks holding no position the caller reads (a loss's prompts and padding). For one chunk, the
forward keeps only the log-normaliser per token; the backward recomputes the logits once and forms
dz = g * (onehot(target) - softmax(z)) (+ the entropy's term) in one fused pass over [R, C, V] before the two
matmuls of the projection's transpose. Autodiff through `jax.checkpoint` does the same matmuls but many more
passes over [R, C, V] (logsumexp's max, exp and sum again, the gather's scatter, the adds): at Qwen's 151,936
words those passes were about 15% of a train step's op time on CPU (a profile at Qwen3-0.6B width).

With recompute=False (models/config.Execution.logprob_recompute) the forward keeps the logits instead: one matmul
fewer per chunk, for [tokens, V] of memory, as torch's autograd keeps them.

Values equal jax.nn.log_softmax(project(w, h) / temperature)[target] and -sum(p log p); gradients equal autodiff's
(tests/models_logprobs_test.py checks both against the plain formulas).
"""
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import custom_derivatives

from oapl_jax import parallel


def _scaled(logits_RxCxV, temperature: float):
  z_RxCxV = logits_RxCxV.astype(jnp.float32)
  return z_RxCxV if temperature == 1.0 else z_RxCxV / temperature


def _forward(project, temperature, with_entropy, w, h_RxCxE, targets_RxC):
  """(logp, entropy or None), log-normaliser. One max and one exp pass over the chunk's logits: log Z is
  jax.nn.logsumexp's value (log of the shifted sum, plus the max), the entropy log Z - E_p[z]."""
  z_RxCxV = _scaled(project(w, h_RxCxE), temperature)
  max_RxC = jnp.max(z_RxCxV, axis=-1)
  max_RxC = jnp.where(jnp.isfinite(max_RxC), max_RxC, 0.0)
  e_RxCxV = jnp.exp(z_RxCxV - max_RxC[..., None])
  sum_RxC = jnp.sum(e_RxCxV, axis=-1)
  logz_RxC = jnp.log(sum_RxC) + max_RxC
  logp_RxC = jnp.take_along_axis(z_RxCxV, targets_RxC[..., None], axis=-1)[..., 0] - logz_RxC
  if not with_entropy:
    return (logp_RxC, None), logz_RxC
  entropy_RxC = logz_RxC - jnp.sum(e_RxCxV * z_RxCxV, axis=-1) / sum_RxC
  return (logp_RxC, entropy_RxC), logz_RxC


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
  def run():
    logits_RxCxV = None if recompute else project(w, h_RxCxE)  # kept: one matmul fewer, [R, C, V] alive
    out, logz_RxC = _forward(project if recompute else (lambda *_: logits_RxCxV), temperature, with_entropy, w,
                             h_RxCxE, targets_RxC)
    return out, logz_RxC, logits_RxCxV
  out, logz_RxC, logits_RxCxV = _when(live, run)
  # w and h are the chunk's own inputs: a map over chunks keeps them once, not per chunk
  return out, (w, h_RxCxE, targets_RxC, live, logz_RxC, out[1], logits_RxCxV)


def _chunk_fwd_rule(project, temperature, with_entropy, recompute, *primals):
  """_chunk_fwd on the primals' values (symbolic_zeros=True wraps each leaf in a CustomVJPPrimal)."""
  values = jax.tree.map(lambda p: p.value, primals, is_leaf=lambda x: isinstance(x, custom_derivatives.CustomVJPPrimal))
  return _chunk_fwd(project, temperature, with_entropy, recompute, *values)


def _chunk_bwd(project, temperature, with_entropy, recompute, residuals, cotangents):
  """(Recompute the logits,) one fused pass to their cotangent (temperature and dtype included), then the
  projection's transpose (two matmuls). A skipped chunk's gradients are zeros. An output nothing
  differentiates (a symbolic zero: the trainer's entropy, a metric under stop_gradient) adds no term, so
  its pass over [R, C, V] is not run (XLA's cost analysis of one chunk: +12% FLOPs, +43% bytes with it)."""
  w, h_RxCxE, targets_RxC, live, logz_RxC, entropy_RxC, kept_logits_RxCxV = residuals
  g_logp_RxC, g_entropy_RxC = (None if isinstance(g, custom_derivatives.SymbolicZero) else g for g in cotangents)

  def run():
    logits_RxCxV, project_vjp = jax.vjp(project, w, h_RxCxE)  # with kept logits, XLA drops this forward matmul
    logits_RxCxV = logits_RxCxV if recompute else kept_logits_RxCxV
    logp_RxCxV = _scaled(logits_RxCxV, temperature) - logz_RxC[..., None]
    p_RxCxV = jnp.exp(logp_RxCxV)
    dz_RxCxV = jnp.zeros_like(p_RxCxV)
    # d logp[target] / dz = onehot(target) - p;  d entropy / dz = -p (log p + entropy)
    if g_logp_RxC is not None:
      is_target_RxCxV = jnp.arange(logits_RxCxV.shape[-1]) == targets_RxC[..., None]
      dz_RxCxV = jnp.where(is_target_RxCxV, g_logp_RxC[..., None], 0.0) - p_RxCxV * g_logp_RxC[..., None]
    if with_entropy and g_entropy_RxC is not None:
      dz_RxCxV = dz_RxCxV - p_RxCxV * (logp_RxCxV + entropy_RxC[..., None]) * g_entropy_RxC[..., None]
    return project_vjp(_scaled(dz_RxCxV, temperature).astype(logits_RxCxV.dtype))

  dw, dh_RxCxE = _when(live, run)
  return dw, dh_RxCxE, None, None


_chunk.defvjp(_chunk_fwd_rule, _chunk_bwd, symbolic_zeros=True)


def chunk_logprobs(project: Callable, w, h_RxCxE, targets_RxC, temperature: float = 1.0, with_entropy: bool = False,
                   recompute: bool = True, live=None):
  """log softmax(project(w, h) / temperature)[target], float32 [R, C] (and the entropy of each position's
  distribution, with `with_entropy`). `project(w, h)` must be a pure function of its arguments (a model's
  vocabulary projection with w the weights it reads), so that the backward can recompute it. recompute=False
  keeps the chunk's logits for the backward instead (saves one matmul; under a map over chunks, every chunk's
  logits stay alive until the backward). `live`: a traced bool; False runs nothing, forward or backward, and
  gives zeros (None: always live)."""
  logp_RxC, entropy_RxC = _chunk(project, float(temperature), bool(with_entropy), bool(recompute), w, h_RxCxE,
                                 targets_RxC, live)
  return (logp_RxC, entropy_RxC) if with_entropy else logp_RxC


def chunk_plan(tokens: int, budget: int) -> tuple[int, int]:
  """(chunks, tokens per chunk): `tokens` in as few nearly equal chunks of <= budget as there can be."""
  chunks = -(-tokens // budget)
  return chunks, -(-tokens // chunks)


def token_logprobs(project: Callable, w, hidden_BxTxE, targets_BxT, needed_BxT=None, *, chunk_tokens: int,
                   temperature: float = 1.0, with_entropy: bool = False, recompute: bool = True):
  """log softmax(project(w, hidden) / temperature)[target] per position, float32 [B, T] (and entropies).

  Each row shard's tokens (its rows' positions, in order) run through `chunk_logprobs` in chunks of at most
  `chunk_tokens`, so one float32 [chunk, V] block is alive per device, however many rows the batch has, and
  each device projects only its own rows. `needed_BxT` (bool; None: all): the positions whose values the
  caller reads. Those are moved to the front of their shard's tokens (order kept), chunks holding none on
  any shard are skipped forward and backward, and every other position gives 0: a batch's prompts and
  padding cost no vocabulary projection.
  """
  B, T, E = hidden_BxTxE.shape
  ctx = parallel.current_context()
  S = parallel.axis_size(*ctx, "activation_batch") if ctx else 1
  S = S if B % S == 0 else 1
  N = B // S * T  # tokens per row shard: rows are sharded in contiguous blocks
  K, C = chunk_plan(N, chunk_tokens)
  h_SxNxE, targets_SxN = hidden_BxTxE.reshape(S, N, E), targets_BxT.reshape(S, N)
  if needed_BxT is not None:
    needed_SxN = needed_BxT.reshape(S, N).astype(bool)
    order_SxN = jnp.argsort(~needed_SxN, axis=1, stable=True)  # needed first, each group in its order
    unorder_SxN = jnp.argsort(order_SxN, axis=1)  # the inverse permutation, for the outputs
    h_SxNxE = jnp.take_along_axis(h_SxNxE, order_SxN[..., None], axis=1)
    targets_SxN = jnp.take_along_axis(targets_SxN, order_SxN, axis=1)
    live_K = jnp.arange(K) * C < jnp.max(jnp.sum(needed_SxN, axis=1))

  def to_chunks(x_SxNx_):  # [S, N, ...] -> [K, S, C, ...], tokens padded to K * C
    x = jnp.pad(x_SxNx_, ((0, 0), (0, K * C - N)) + ((0, 0),) * (x_SxNx_.ndim - 2))
    x = jnp.swapaxes(x.reshape(S, K, C, *x.shape[2:]), 0, 1)
    return parallel.constrain_where_divisible(x, (None, "activation_batch") + (None,) * (x.ndim - 2))

  def from_chunks(x_KxSxC):
    x_SxN = jnp.swapaxes(x_KxSxC, 0, 1).reshape(S, K * C)[:, :N]
    if needed_BxT is not None:  # back to the original order; positions not needed are 0
      x_SxN = jnp.where(needed_SxN, jnp.take_along_axis(x_SxN, unorder_SxN, axis=1), 0.0)
    return x_SxN.reshape(B, T)

  def one_chunk(xs):
    h_SxCxE, targets_SxC, live = xs
    return chunk_logprobs(project, w, h_SxCxE, targets_SxC, temperature=temperature, with_entropy=with_entropy,
                          recompute=recompute, live=live)

  out = jax.lax.map(one_chunk, (to_chunks(h_SxNxE), to_chunks(targets_SxN), None if needed_BxT is None else live_K))
  return jax.tree.map(from_chunks, out)
