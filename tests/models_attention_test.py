"""Every attention kernel against the reference einsum (itself checked against a numpy loop):
forward and gradients w.r.t. q, k, v on padding, GQA, odd lengths and decode-like positions;
rows that see no key; kernel choice; input errors; blockwise memory linear in T."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oapl_jax.models import attention
from oapl_jax.models.attention import attend


def _inputs(B, T, S, H, K, D, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in
             [(B, T, H, D), (B, S, K, D), (B, S, K, D)])
  cotangent = jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32)
  return q, k, v, cotangent


def _index_positions(B, N):
  return jnp.broadcast_to(jnp.arange(N, dtype=jnp.int32), (B, N))


def _right_padding(lengths, S):
  return jnp.arange(S)[None, :] < jnp.asarray(lengths)[:, None]


@functools.partial(jax.jit, static_argnames=("implementation", "block_q", "block_kv", "platform"))
def _out_and_grads(q, k, v, cotangent, q_pos, kv_pos, kv_valid, implementation, block_q=512, block_kv=512,
                   platform=None):
  """Output and d<out, cotangent>/d(q, k, v), one compile per kernel and shape."""
  fn = lambda q, k, v: attend(q, k, v, q_positions_BxT=q_pos, kv_positions_BxS=kv_pos, kv_valid_BxS=kv_valid,
                              implementation=implementation, block_q=block_q, block_kv=block_kv, platform=platform)
  out, vjp = jax.vjp(fn, q, k, v)
  return out, vjp(cotangent)


def _assert_matches_reference(case, implementation, **blocks):
  q, k, v, ct, q_pos, kv_pos, valid = case
  out, grads = _out_and_grads(q, k, v, ct, q_pos, kv_pos, valid, implementation, **blocks)
  ref_out, ref_grads = _out_and_grads(q, k, v, ct, q_pos, kv_pos, valid, "reference")
  np.testing.assert_allclose(out, ref_out, atol=1e-5, rtol=1e-5)
  for name, g, ref_g in zip("qkv", grads, ref_grads):
    assert np.isfinite(g).all(), f"d{name} not finite"
    np.testing.assert_allclose(g, ref_g, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")
  return out


def _padded_gqa_case():
  """T = S = 37 (odd), 4 query heads on 2 kv heads, row 1 right-padded to 23 keys and with its first
  3 keys invalid too, so its queries 0..2 see no key."""
  B, T, H, K, D = 2, 37, 4, 2, 8
  q, k, v, ct = _inputs(B, T, T, H, K, D)
  valid = _right_padding([37, 23], T).at[1, :3].set(False)
  return q, k, v, ct, _index_positions(B, T), _index_positions(B, T), valid


def test_reference_matches_numpy_loop():
  B, T, S, H, K, D = 2, 5, 7, 4, 2, 3
  q, k, v, _ = _inputs(B, T, S, H, K, D, seed=1)
  q_pos = jnp.array([[2, 3, 4, 5, 6], [0, 1, 2, 3, 4]])
  kv_pos = _index_positions(B, S)
  valid = _right_padding([7, 4], S).at[1, 0].set(False)
  out = np.asarray(attend(q, k, v, q_positions_BxT=q_pos, kv_positions_BxS=kv_pos, kv_valid_BxS=valid,
                          implementation="reference"))
  qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
  for b in range(B):
    for t in range(T):
      for h in range(H):
        seen = [s for s in range(S) if valid[b, s] and kv_pos[b, s] <= q_pos[b, t]]
        expected = np.zeros(D)
        if seen:
          logits = np.array([qn[b, t, h] @ kn[b, s, h // (H // K)] / math.sqrt(D) for s in seen])
          w = np.exp(logits - logits.max())
          expected = (w / w.sum()) @ vn[b, seen, h // (H // K)]
        np.testing.assert_allclose(out[b, t, h], expected, atol=1e-6, err_msg=f"b={b} t={t} h={h}")


@pytest.mark.parametrize("block_q,block_kv", [(16, 8), (8, 64)])
def test_blockwise_matches_reference_padded_gqa_odd(block_q, block_kv):
  out = _assert_matches_reference(_padded_gqa_case(), "blockwise", block_q=block_q, block_kv=block_kv)
  np.testing.assert_array_equal(out[1, :3], 0.0)  # rows that see no key


def test_blockwise_matches_reference_decode_positions():
  """Queries at arbitrary positions over a longer cache (the sampler's case): 3 queries per row at
  positions 20..22 and 5..7 over a 29-slot cache, multi-query (K = 1)."""
  B, T, S, H, K, D = 2, 3, 29, 4, 1, 8
  q, k, v, ct = _inputs(B, T, S, H, K, D, seed=2)
  q_pos = jnp.array([[20, 21, 22], [5, 6, 7]], jnp.int32)
  case = (q, k, v, ct, q_pos, _index_positions(B, S), _right_padding([23, 8], S))
  _assert_matches_reference(case, "blockwise", block_q=2, block_kv=8)


def test_splash_matches_reference_in_interpret_mode():
  out = _assert_matches_reference(_padded_gqa_case(), "splash", block_q=128, block_kv=128, platform="cpu")
  np.testing.assert_array_equal(out[1, :3], 0.0)


@pytest.mark.devices(8)
def test_splash_is_shard_mapped_under_a_sharding_context():
  """Mosaic kernels cannot be partitioned by XLA: under a mesh, splash runs per shard (rows over
  data x fsdp, heads over tensor) and still equals the reference on the whole batch."""
  from oapl_jax import parallel
  B, T, H, K, D = 4, 130, 4, 2, 8
  q, k, v, ct = _inputs(B, T, T, H, K, D, seed=3)
  pos, valid = _index_positions(B, T), _right_padding([130, 90, 7, 64], T)
  want, want_grads = _out_and_grads(q, k, v, ct, pos, pos, valid, "reference")
  mesh = parallel.make_mesh((1, 4, 2))
  with parallel.sharding_context(mesh, parallel.DEFAULT_RULES):
    jaxpr = jax.make_jaxpr(lambda q: attend(q, k, v, q_positions_BxT=pos, kv_positions_BxS=pos, kv_valid_BxS=valid,
                                            implementation="splash", block_q=128, block_kv=128, platform="cpu"))(q)
    got, got_grads = _out_and_grads(q, k, v, ct, pos, pos, valid, "splash", block_q=128, block_kv=128, platform="cpu")
  assert "shard_map" in str(jaxpr)
  np.testing.assert_allclose(got, want, atol=1e-5)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, atol=1e-5)


def test_cudnn_off_gpu_falls_back_to_blockwise():
  _assert_matches_reference(_padded_gqa_case(), "cudnn", block_q=16, block_kv=8, platform="cpu")


def test_auto_picks_kernel_by_platform():
  assert attention.resolve_implementation("auto", "tpu") == "splash"
  assert attention.resolve_implementation("auto", "gpu") == "cudnn"
  assert attention.resolve_implementation("auto", "cpu") == "blockwise"
  default = {"tpu": "splash", "gpu": "cudnn"}.get(jax.default_backend(), "blockwise")
  assert attention.resolve_implementation("auto") == default  # no platform named: the default backend's
  assert attention.resolve_implementation("reference", "tpu") == "reference"


def test_bad_inputs_raise_clear_errors():
  q, k, v, _ = _inputs(1, 4, 4, 4, 2, 8)
  pos = _index_positions(1, 4)
  kw = dict(q_positions_BxT=pos, kv_positions_BxS=pos)
  with pytest.raises(ValueError, match="unknown attention implementation 'flash'"):
    attend(q, k, v, implementation="flash", **kw)
  with pytest.raises(ValueError, match="multiple of kv heads"):
    attend(q[:, :, :3], k, v, **kw)
  with pytest.raises(ValueError, match="same shape"):
    attend(q, k, v[:, :3], **kw)
  with pytest.raises(ValueError, match="head dim"):
    attend(q, k[..., :4], v[..., :4], **kw)
  with pytest.raises(ValueError, match="positions"):
    attend(q, k, v, q_positions_BxT=pos[:, :3], kv_positions_BxS=pos)
  with pytest.raises(ValueError, match="kv_valid"):
    attend(q, k, v, kv_valid_BxS=jnp.ones((1, 5), bool), **kw)
  with pytest.raises(ValueError, match="multiples of 128"):
    attend(q, k, v, implementation="splash", block_q=100, **kw)


def _train_temp_bytes(implementation, T, block=64):
  """Compiled temporary bytes of forward + backward at length T (compile only, nothing runs)."""
  q, k, v, _ = (jax.ShapeDtypeStruct(s, jnp.float32) for s in [(1, T, 4, 16), (1, T, 2, 16), (1, T, 2, 16), ()])
  pos = _index_positions(1, T)
  loss = lambda q, k, v: jnp.sum(attend(q, k, v, q_positions_BxT=pos, kv_positions_BxS=pos,
                                        implementation=implementation, block_q=block, block_kv=block) ** 2)
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_blockwise_memory_grows_linearly_in_T():
  """4x the length: blockwise temporaries grow at most ~4x; the reference's (the scores) ~16x, which
  shows the measurement can tell the two apart."""
  blockwise_ratio = _train_temp_bytes("blockwise", 1024) / _train_temp_bytes("blockwise", 256)
  reference_ratio = _train_temp_bytes("reference", 1024) / _train_temp_bytes("reference", 256)
  assert blockwise_ratio <= 5.0, blockwise_ratio
  assert reference_ratio >= 10.0, reference_ratio
