"""The sampler's draw (sampler/sampling.py) against numpy references: the two-level inverse CDF, top-k, greedy ties,
its temporaries; and the cache-length buckets (sampler/buckets.py)."""
import jax
import numpy as np
import pytest
import scipy.special
import scipy.stats

from oapl_jax.sampler import buckets, sampling
from oapl_jax.sampler.sampling import sample_tokens


def test_two_level_sampling_with_top_k_keeps_the_set_and_its_frequencies():
  """V = 1000 (25 blocks of 40), top-k 7 of a random row whose likeliest token ends the last block: every draw
  is in the top-7 set and the frequencies match the renormalised softmax."""
  logits_V = np.random.RandomState(3).normal(size=1000).astype(np.float32) * 2
  logits_V[-1] = logits_V.max() + 1  # the last real token, right before the padding, is the likeliest
  n = 20000
  uniforms = jax.random.uniform(jax.random.PRNGKey(1), (n,))
  tokens, _ = sample_tokens(np.broadcast_to(logits_V, (n, 1000)), uniforms, 1.0, 1.0, 7)
  tokens = np.asarray(tokens)
  top7 = np.argsort(logits_V)[-7:]
  assert np.isin(tokens, top7).all()
  probs = scipy.special.softmax(logits_V[top7].astype(np.float64))
  observed = np.array([(tokens == t).sum() for t in top7])
  assert scipy.stats.chisquare(observed, n * probs).pvalue > 1e-3


def test_blocks_tile_the_vocabulary_near_its_square_root():
  got = {V: sampling.block_size(V) for V in (256, 1000, 151936, 152064, 997)}
  assert got == {256: 16, 1000: 40, 151936: 1187, 152064: 396, 997: 997}
  assert all(V % b == 0 for V, b in got.items())


def test_the_unfiltered_draw_keeps_no_vocabulary_sized_temporary():
  """The draw reads [S, V] logits through reductions and a gather of one block: XLA's temporaries stay far below
  one [S, V] float32 array (8 MiB here; writing exp(z - max) as weights, as before, needs one of them)."""
  S, V = 64, 32768
  draw = jax.jit(lambda l_SxV, u_S, inv_t, greedy: sampling._draw(l_SxV, u_S, inv_t, greedy))
  compiled = draw.lower(jax.ShapeDtypeStruct((S, V), np.float32), jax.ShapeDtypeStruct((S,), np.float32),
                        np.float32(1.0), np.bool_(False)).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < S * V * 4 / 8


def test_greedy_takes_the_first_maximum_across_blocks_and_reports_the_log_softmax():
  """Ties for the maximum in different blocks (V = 1000, blocks of 40): the first wins, as with np.argmax;
  the log-prob is the plain log-softmax of the raw logits, at any temperature <= 0."""
  rng = np.random.RandomState(5)
  logits_SxV = rng.normal(size=(6, 1000)).astype(np.float32)
  ties = [(0, 3, 999), (1, 39, 40), (2, 500, 520), (3, 0, 1), (4, 960, 999), (5, 123, 124)]
  for row, first, second in ties:
    logits_SxV[row, [first, second]] = logits_SxV[row].max() + 2.0
  tokens, logp = sample_tokens(logits_SxV, np.full(6, 0.99, np.float32), 0.0, 0.5, 3)
  np.testing.assert_array_equal(np.asarray(tokens), [first for _, first, _ in ties])
  log_softmax = scipy.special.log_softmax(logits_SxV.astype(np.float64), axis=-1)
  np.testing.assert_allclose(np.asarray(logp), log_softmax[np.arange(6), np.asarray(tokens)], atol=1e-6)


def test_cache_buckets_are_powers_of_two_and_their_three_quarters():
  got = [buckets.cache_bucket(n, 1000) for n in (1, 16, 17, 24, 25, 33, 49, 65, 97, 129, 999)]
  assert got == [16, 16, 24, 24, 32, 48, 64, 96, 128, 192, 1000]
  assert buckets.cache_bucket(200, 136) == 136  # capped at the state's max_len


@pytest.mark.parametrize("V", [256, 1000, 151936 // 64, 997])
def test_two_level_draw_is_the_flat_inverse_cdf(V):
  """Each draw equals a float64 flat inverse CDF of the same uniform (numpy searchsorted over the whole
  softmax), away from rounding at a token's boundary. Blocks: 16 x 16, 25 x 40, 2 x 1187, and one of 997 (a
  prime: the flat CDF itself)."""
  rng = np.random.RandomState(V)
  logits_SxV = (rng.normal(size=(512, V)) * 3).astype(np.float32)
  uniforms_S = rng.uniform(size=512).astype(np.float32)
  tokens, _ = sample_tokens(logits_SxV, uniforms_S, 1.0, 1.0, 0)
  probs_SxV = scipy.special.softmax(logits_SxV.astype(np.float64), axis=-1)
  cdf_SxV = np.cumsum(probs_SxV, axis=-1)
  expected = np.array([np.searchsorted(cdf_SxV[i], uniforms_S[i], side="right") for i in range(512)])
  clear = np.min(np.abs(cdf_SxV - uniforms_S[:, None].astype(np.float64)), axis=-1) > 1e-5
  assert clear.sum() > 450
  np.testing.assert_array_equal(np.asarray(tokens)[clear], expected[clear])
