"""Log-probs (and entropies) of target tokens through the vocabulary projection, with a hand-written VJP.

    logp_RxC = chunk_logprobs(project, w, h_RxCxE, targets_RxC, temperature)   # project(w, h) -> logits [R, C, V]

One chunk of tokens at a time (models/qwen.token_logprobs maps it over chunks bounded by a token budget). The
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _chunk(project, temperature, with_entropy, recompute, w, h_RxCxE, targets_RxC):
  return _forward(project, temperature, with_entropy, w, h_RxCxE, targets_RxC)[0]


def _chunk_fwd(project, temperature, with_entropy, recompute, w, h_RxCxE, targets_RxC):
  logits_RxCxV = None if recompute else project(w, h_RxCxE)  # kept: one matmul fewer, [R, C, V] alive
  out, logz_RxC = _forward(project if recompute else (lambda *_: logits_RxCxV), temperature, with_entropy, w,
                           h_RxCxE, targets_RxC)
  # w and h are the chunk's own inputs: a map over chunks keeps them once, not per chunk
  return out, (w, h_RxCxE, targets_RxC, logz_RxC, out[1], logits_RxCxV)


def _chunk_bwd(project, temperature, with_entropy, recompute, residuals, cotangents):
  """(Recompute the logits,) one fused pass to their cotangent (temperature and dtype included), then the
  projection's transpose (two matmuls)."""
  w, h_RxCxE, targets_RxC, logz_RxC, entropy_RxC, kept_logits_RxCxV = residuals
  g_logp_RxC, g_entropy_RxC = cotangents
  logits_RxCxV, project_vjp = jax.vjp(project, w, h_RxCxE)  # with kept logits, XLA drops this forward matmul
  logits_RxCxV = logits_RxCxV if recompute else kept_logits_RxCxV
  logp_RxCxV = _scaled(logits_RxCxV, temperature) - logz_RxC[..., None]
  p_RxCxV = jnp.exp(logp_RxCxV)
  is_target_RxCxV = jnp.arange(logits_RxCxV.shape[-1]) == targets_RxC[..., None]
  # d logp[target] / dz = onehot(target) - p;  d entropy / dz = -p (log p + entropy)
  dz_RxCxV = jnp.where(is_target_RxCxV, g_logp_RxC[..., None], 0.0) - p_RxCxV * g_logp_RxC[..., None]
  if with_entropy:
    dz_RxCxV = dz_RxCxV - p_RxCxV * (logp_RxCxV + entropy_RxC[..., None]) * g_entropy_RxC[..., None]
  dw, dh_RxCxE = project_vjp(_scaled(dz_RxCxV, temperature).astype(logits_RxCxV.dtype))
  return dw, dh_RxCxE, None


_chunk.defvjp(_chunk_fwd, _chunk_bwd)


def chunk_logprobs(project: Callable, w, h_RxCxE, targets_RxC, temperature: float = 1.0, with_entropy: bool = False,
                   recompute: bool = True):
  """log softmax(project(w, h) / temperature)[target], float32 [R, C] (and the entropy of each position's
  distribution, with `with_entropy`). `project(w, h)` must be a pure function of its arguments (a model's
  vocabulary projection with w the weights it reads), so that the backward can recompute it. recompute=False
  keeps the chunk's logits for the backward instead (saves one matmul; under a map over chunks, every chunk's
  logits stay alive until the backward)."""
  logp_RxC, entropy_RxC = _chunk(project, float(temperature), bool(with_entropy), bool(recompute), w, h_RxCxE,
                                 targets_RxC)
  return (logp_RxC, entropy_RxC) if with_entropy else logp_RxC
