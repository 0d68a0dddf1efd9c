"""Token sampling with temperature, top-k and top-p, returning the log-prob of each sampled token.

The log-prob is taken under the distribution the token was actually drawn from: logits divided by
the temperature, then top-k, then top-p (the order of HF and vLLM), renormalised over the kept set.
At temperature 1, top-p 1, top-k 0 this is the model's plain log-softmax.

temperature == 0 means greedy (argmax of the raw logits). A greedy "distribution" is a point mass
(log-prob 0, no information), so for greedy steps we report the model's plain log-softmax of the
chosen token instead.

All three knobs are traced scalars, so changing them never recompiles.
"""
import math

import jax
import jax.numpy as jnp


def filter_threshold(z_SxV: jax.Array, top_p, top_k) -> jax.Array:
  """Per row, the smallest logit kept by top-k, then by the top-p nucleus: logits below it are cut.

  top_k == 0 disables top-k; top_p >= 1 disables top-p. Ties at the cut-off are kept (so the kept
  set can exceed k when logits tie exactly). The most likely token is always kept.
  """
  V = z_SxV.shape[-1]
  sorted_SxV = jnp.flip(jnp.sort(z_SxV, axis=-1), axis=-1)  # descending
  k = jnp.where(top_k > 0, jnp.minimum(top_k, V), V)
  in_k_SxV = (jnp.arange(V) < k)[None, :]
  p_SxV = jax.nn.softmax(jnp.where(in_k_SxV, sorted_SxV, -jnp.inf), axis=-1)
  mass_before_SxV = jnp.cumsum(p_SxV, axis=-1) - p_SxV
  keep_SxV = in_k_SxV & ((mass_before_SxV < top_p) | (top_p >= 1.0))
  n_keep_S = jnp.maximum(jnp.sum(keep_SxV, axis=-1), 1)
  return jnp.take_along_axis(sorted_SxV, (n_keep_S - 1)[:, None], axis=-1)[:, 0]


def _last_positive(x_SxN) -> jax.Array:
  """Index of the last entry > 0 in each row."""
  return x_SxN.shape[-1] - 1 - jnp.argmax(x_SxN[:, ::-1] > 0, axis=-1)


def block_size(V: int) -> int:
  """The divisor of V nearest sqrt(V) (in ratio): 1,187 for Qwen's 151,936 = 128 x 1,187, 16 for 256. Blocks
  that tile the vocabulary exactly make the block sums reads of a free reshape; a slice for a partial last
  block copied the [S, V] logits (at [64, 151,936] the block stats took 26.8 ms that way, 7.2 ms on a reshape). A
  prime V gets one block of V (a flat CDF)."""
  divisors = [d for d in range(1, int(V ** 0.5) + 1) if V % d == 0]
  divisors += [V // d for d in divisors]
  return min(divisors, key=lambda d: (round(abs(math.log(d / V ** 0.5)), 6), -d))  # ties: fewer blocks


def _block_stats(l_SxNxB, inv_t):
  """Per block of raw logits [S, N blocks, B]: the max and the sum of exp((l - that max) * inv_t), each [S, N].
  Both are reductions that read the logits (nothing [S, V] is written); an all -inf block (filtered out) has sum
  0, not NaN."""
  max_SxN = jnp.max(l_SxNxB, axis=-1)
  safe_SxN = jnp.where(jnp.isfinite(max_SxN), max_SxN, 0.0)
  return max_SxN, jnp.sum(jnp.exp((l_SxNxB - safe_SxN[..., None]) * inv_t), axis=-1)


def _draw(l_SxV, u_S, inv_t, greedy):
  """(tokens_S, logp_S) from raw logits (-inf where filtered out) at temperature 1 / inv_t."""
  S, V = l_SxV.shape
  block = block_size(V)
  l_SxNxB = l_SxV.reshape(S, V // block, block)  # free: the blocks tile V
  bmax_SxN, bsum_SxN = _block_stats(l_SxNxB, inv_t)
  max_S = jnp.max(bmax_SxN, axis=-1)
  mass_SxN = bsum_SxN * jnp.exp((bmax_SxN - max_S[:, None]) * inv_t)
  cdf_SxN = jnp.cumsum(mass_SxN, axis=-1)
  total_S = cdf_SxN[:, -1]

  u_S = u_S * total_S
  drawn_S = jnp.minimum(jnp.sum(cdf_SxN <= u_S[:, None], axis=-1), _last_positive(mass_SxN))
  block_S = jnp.where(greedy, jnp.argmax(bmax_SxN, axis=-1), drawn_S)
  l_SxB = jnp.take_along_axis(l_SxNxB, block_S[:, None, None], axis=1)[:, 0]
  rest_S = u_S - jnp.take_along_axis(cdf_SxN - mass_SxN, block_S[:, None], axis=-1)[:, 0]
  p_SxB = jnp.exp((l_SxB - max_S[:, None]) * inv_t)
  inner_S = jnp.where(greedy, jnp.argmax(l_SxB, axis=-1),
                      jnp.minimum(jnp.sum(jnp.cumsum(p_SxB, axis=-1) <= rest_S[:, None], axis=-1),
                                  _last_positive(p_SxB)))
  l_S = jnp.take_along_axis(l_SxB, inner_S[:, None], axis=-1)[:, 0]
  return (block_S * block + inner_S).astype(jnp.int32), (l_S - max_S) * inv_t - jnp.log(total_S)


def sample_tokens(logits_SxV: jax.Array, u_S: jax.Array, temperature, top_p, top_k):
  """Draw one token per row. Returns (tokens_S int32, logp_S float32).

  logits_SxV: raw model logits; u_S: one uniform in [0, 1) per row, inverted through the CDF.

  The inverse CDF runs in two levels: pick a block of ~sqrt(V) tokens from the block masses, then a token
  inside it. Exact like a flat inverse CDF, with no V-long cumulative sum and no [S, V] array written when
  nothing is filtered: each block's max and its sum of exp come from two reductions over the logits, the
  softmax's normaliser from those [S, V / block] sums, and only the chosen block's logits are gathered.
  Zero-mass tokens (filtered out) are never returned, rounding at a block's end included. Greedy takes the
  first maximum the same way (the first maximal block max, then the first maximum inside that block).
  """
  logits_SxV = logits_SxV.astype(jnp.float32)
  greedy = temperature <= 0.0
  inv_t = 1.0 / jnp.where(greedy, 1.0, temperature)
  needs_filter = (~greedy) & ((top_k > 0) | (top_p < 1.0))

  def filtered(l_SxV):
    threshold_S = filter_threshold(l_SxV * inv_t, top_p, top_k)
    return _draw(jnp.where(l_SxV * inv_t >= threshold_S[:, None], l_SxV, -jnp.inf), u_S, inv_t, greedy)

  # Both branches return [S] arrays: the unfiltered one never copies the logits.
  return jax.lax.cond(needs_filter, filtered, lambda l_SxV: _draw(l_SxV, u_S, inv_t, greedy), logits_SxV)
