"""Token sampling with temperature, top-k and top-p, returning the log-prob of each sampled token.

The log-prob is taken under the distribution the token was actually drawn from: logits divided by
the temperature, then top-k, then top-p (the order of HF and vLLM), renormalised over the kept set.
At temperature 1, top-p 1, top-k 0 this is the model's plain log-softmax.

temperature == 0 means greedy (argmax of the raw logits). A greedy "distribution" is a point mass
(log-prob 0, no information), so for greedy steps we report the model's plain log-softmax of the
chosen token instead.

All three knobs are traced scalars, so changing them never recompiles.
"""
import jax
import jax.numpy as jnp


def filter_logits(z_SxV: jax.Array, top_p, top_k) -> jax.Array:
  """Set logits outside the top-k, then outside the top-p nucleus, to -inf.

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
  threshold_S = jnp.take_along_axis(sorted_SxV, (n_keep_S - 1)[:, None], axis=-1)
  return jnp.where(z_SxV >= threshold_S, z_SxV, -jnp.inf)


def _last_positive(x_SxN) -> jax.Array:
  """Index of the last entry > 0 in each row."""
  return x_SxN.shape[-1] - 1 - jnp.argmax(x_SxN[:, ::-1] > 0, axis=-1)


def _inverse_cdf_sample(u_S, weights_SxV):
  """One uniform per row, inverted through the CDF of the row's (unnormalised, non-negative)
  weights in two levels: pick a block of ~sqrt(V) tokens from the block masses, then a token
  inside it. Exact like a flat inverse CDF, but with no V-long cumulative sum (slow on CPU, and on
  a 150k vocabulary everywhere). Zero-weight tokens (filtered out) are never returned, rounding at
  a block's end included.

  A vocabulary that is not a multiple of the block (Qwen's 151,936) ends in a partial block, summed on its
  own: the [S, V] weights are never padded (a padded copy cost a full pass over them every decode step)."""
  S, V = weights_SxV.shape
  block = max(16, 1 << (max(1, int(V ** 0.5)) - 1).bit_length())
  whole = V // block  # whole blocks; the last V - whole * block tokens (if any) form one more
  mass_SxN = jnp.sum(weights_SxV[:, :whole * block].reshape(S, whole, block), axis=-1)
  if V > whole * block:
    mass_SxN = jnp.concatenate([mass_SxN, jnp.sum(weights_SxV[:, whole * block:], axis=-1, keepdims=True)], axis=-1)
  cdf_SxN = jnp.cumsum(mass_SxN, axis=-1)
  u_S = u_S * cdf_SxN[:, -1]
  block_S = jnp.minimum(jnp.sum(cdf_SxN <= u_S[:, None], axis=-1), _last_positive(mass_SxN))
  rest_S = u_S - jnp.take_along_axis(cdf_SxN - mass_SxN, block_S[:, None], axis=-1)[:, 0]
  token_SxB = block_S[:, None] * block + jnp.arange(block)[None, :]
  p_SxB = jnp.where(token_SxB < V, jnp.take_along_axis(weights_SxV, jnp.minimum(token_SxB, V - 1), axis=1), 0.0)
  inner_S = jnp.minimum(jnp.sum(jnp.cumsum(p_SxB, axis=-1) <= rest_S[:, None], axis=-1), _last_positive(p_SxB))
  return block_S * block + inner_S


def sample_tokens(logits_SxV: jax.Array, u_S: jax.Array, temperature, top_p, top_k):
  """Draw one token per row. Returns (tokens_S int32, logp_S float32).

  logits_SxV: raw model logits; u_S: one uniform in [0, 1) per row, inverted through the CDF.
  """
  logits_SxV = logits_SxV.astype(jnp.float32)
  greedy = temperature <= 0.0
  z_SxV = logits_SxV / jnp.where(greedy, 1.0, temperature)
  needs_filter = (~greedy) & ((top_k > 0) | (top_p < 1.0))
  z_SxV = jax.lax.cond(needs_filter, lambda z: filter_logits(z, top_p, top_k), lambda z: z, z_SxV)
  # Softmax kept unnormalised (one exp pass over V): the sampler scales u by the total.
  max_S = jnp.max(z_SxV, axis=-1)
  weights_SxV = jnp.exp(z_SxV - max_S[:, None])
  tokens_S = jax.lax.cond(greedy, lambda: jnp.argmax(logits_SxV, axis=-1).astype(jnp.int32),
                          lambda: _inverse_cdf_sample(u_S, weights_SxV).astype(jnp.int32))
  # Greedy: z is the raw logits and nothing is filtered, so this is the plain log-softmax.
  z_S = jnp.take_along_axis(z_SxV, tokens_S[:, None], axis=-1)[:, 0]
  logp_S = z_S - max_S - jnp.log(jnp.sum(weights_SxV, axis=-1))
  return tokens_S, logp_S
