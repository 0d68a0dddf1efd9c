"""Causal attention by position behind one function, `attend`, with pluggable kernels.

Semantics (every kernel): query t of row b sees key s iff kv_valid[b, s] and
kv_positions[b, s] <= q_positions[b, t]; scores are scaled by 1/sqrt(D), the softmax is taken in
float32, the output is cast to q's dtype. GQA: H = K * G heads, query head h reads kv head h // G.
A query row that sees no key returns zeros (with zero, finite gradients).

Kernels (`implementation`):
  reference  full [B, K, G, T, S] float32 scores: the test oracle; memory quadratic in T.
  blockwise  pure JAX, flash-style online softmax over q and kv blocks, with a custom backward that
             recomputes scores per block: memory linear in T in forward and backward; exact for any
             positions, so it also serves decode over a long cache (T = 1, S = cache length).
  splash     Pallas TPU splash attention (Pallas interpret mode off TPU, for tests).
  cudnn      jax.nn.dot_product_attention(implementation="cudnn") on GPU for fp16/bf16 and head dims
             up to 128 (multiples of 8); anything else falls back to blockwise.
  auto       by platform: "tpu" -> splash, "gpu" -> cudnn, otherwise blockwise.

Precondition of splash and cudnn (which is why "auto" suits training and prefill, not decode):
positions equal the array index (q_positions[b, t] == t, kv_positions[b, s] == s); they are not read,
only the causal index mask is applied. cudnn further needs kv_valid to be a prefix per row (right
padding), passed as key lengths. A jitted function cannot check this; the caller chooses.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from oapl_jax import parallel

IMPLEMENTATIONS = ("auto", "reference", "blockwise", "splash", "cudnn")
_SPLASH_LANES = 128  # splash kv blocks (and our q blocks) are multiples of the TPU lane width


def resolve_implementation(implementation: str, platform=None) -> str:
  """The kernel `attend` runs for `implementation` on `platform` (before the cudnn dtype fallback)."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"unknown attention implementation {implementation!r}; expected one of {IMPLEMENTATIONS}")
  if implementation != "auto":
    return implementation
  platform = _platform(platform)
  return {"tpu": "splash", "gpu": "cudnn", "cuda": "cudnn"}.get(platform, "blockwise")


def attend(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, *, q_positions_BxT, kv_positions_BxS, kv_valid_BxS=None,
           implementation="auto", block_q=512, block_kv=512, platform=None):
  """Attention output [B, T, H, D] in q's dtype; see the module docstring for semantics and kernels."""
  _check_inputs(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_positions_BxT, kv_positions_BxS, kv_valid_BxS,
                block_q, block_kv)
  kernel = resolve_implementation(implementation, platform)
  B, S = k_BxSxKxD.shape[:2]
  kv_valid_BxS = jnp.ones((B, S), bool) if kv_valid_BxS is None else kv_valid_BxS.astype(bool)
  q_pos, kv_pos = q_positions_BxT.astype(jnp.int32), kv_positions_BxS.astype(jnp.int32)
  if kernel == "cudnn" and not _cudnn_applies(q_BxTxHxD, platform):
    kernel = "blockwise"
  if kernel == "reference":
    return _reference(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos, kv_pos, kv_valid_BxS)
  if kernel == "blockwise":
    return _blockwise(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos, kv_pos, kv_valid_BxS,
                      min(block_q, q_BxTxHxD.shape[1]), min(block_kv, S))
  if kernel == "splash":
    splash_fn = functools.partial(_splash, block_q=block_q, block_kv=block_kv, interpret=_platform(platform) != "tpu")
    out = _per_shard(splash_fn, q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, kv_valid_BxS)
  else:
    out = _cudnn(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, kv_valid_BxS)
  seen_BxT = _sees_a_key(q_pos, kv_pos, kv_valid_BxS)
  return out * seen_BxT[:, :, None, None].astype(out.dtype)


def _per_shard(fn, q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, kv_valid_BxS):
  """fn(q, k, v, kv_valid) on each device's rows and heads: Pallas (Mosaic) kernels cannot be
  partitioned by XLA, so under a sharding context the call is a shard_map over the batch axes and,
  when they divide both H and K, the head axis (GQA's h // G mapping holds shard by shard)."""
  ctx = parallel.current_context()
  if ctx is None:
    return fn(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, kv_valid_BxS)
  mesh, rules = ctx
  B, _, H, _ = q_BxTxHxD.shape
  K = k_BxSxKxD.shape[2]
  heads = "activation_heads" if H % parallel.axis_size(mesh, rules, "activation_heads") == 0 and \
      K % parallel.axis_size(mesh, rules, "activation_heads") == 0 else None
  q_spec = parallel.spec_where_divisible((B, 1, H, 1), ("activation_batch", None, heads, None), mesh, rules)
  kv_spec = parallel.spec_where_divisible((B, 1, K, 1), ("activation_batch", None, heads, None), mesh, rules)
  valid_spec = jax.sharding.PartitionSpec(q_spec[0], None)
  return jax.shard_map(fn, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, valid_spec), out_specs=q_spec,
                       check_vma=False)(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, kv_valid_BxS)


def _platform(platform):
  return (platform or jax.devices()[0].platform).lower()


def _check_inputs(q, k, v, q_pos, kv_pos, kv_valid, block_q, block_kv):
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f"attend wants q [B,T,H,D], k and v [B,S,K,D]; got {q.shape}, {k.shape}, {v.shape}")
  if k.shape != v.shape:
    raise ValueError(f"k {k.shape} and v {v.shape} must have the same shape [B,S,K,D]")
  (B, T, H, D), (Bk, S, K, Dk) = q.shape, k.shape
  if B != Bk or D != Dk:
    raise ValueError(f"q {q.shape} and k {k.shape} disagree on batch or head dim")
  if H % K:
    raise ValueError(f"query heads ({H}) must be a multiple of kv heads ({K})")
  if q_pos.shape != (B, T) or kv_pos.shape != (B, S):
    raise ValueError(f"positions must be [B,T]={(B, T)} and [B,S]={(B, S)}; got {q_pos.shape}, {kv_pos.shape}")
  if kv_valid is not None and kv_valid.shape != (B, S):
    raise ValueError(f"kv_valid must be [B,S]={(B, S)}; got {kv_valid.shape}")
  if not (isinstance(block_q, int) and isinstance(block_kv, int) and block_q > 0 and block_kv > 0):
    raise ValueError(f"block sizes must be positive ints; got block_q={block_q!r}, block_kv={block_kv!r}")


def _sees_a_key(q_pos_BxT, kv_pos_BxS, kv_valid_BxS):
  """[B, T] bool: does query t see at least one key (the earliest valid key's position <= its own)."""
  first_BxS = jnp.where(kv_valid_BxS, kv_pos_BxS, jnp.iinfo(jnp.int32).max).min(axis=1)
  return q_pos_BxT >= first_BxS[:, None]


def _reference(q, k, v, q_pos, kv_pos, kv_valid):
  B, T, H, D = q.shape
  K = k.shape[2]
  q_BxTxKxGxD = q.reshape(B, T, K, H // K, D)
  scores = jnp.einsum("btkgd,bskd->bkgts", q_BxTxKxGxD, k.astype(q.dtype), preferred_element_type=jnp.float32)
  visible_BxTxS = kv_valid[:, None, :] & (kv_pos[:, None, :] <= q_pos[:, :, None])
  scores = jnp.where(visible_BxTxS[:, None, None], scores / math.sqrt(D), jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1) * visible_BxTxS.any(-1)[:, None, None, :, None]
  out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(q.dtype), v.astype(q.dtype), preferred_element_type=jnp.float32)
  return out.reshape(B, T, H, D).astype(q.dtype)


# ----------------------------------------------------------------------------- blockwise

def _to_blocks(x_BxNx_, block, fill):
  """Pad axis 1 to a multiple of `block` with `fill`, then [n_blocks, B, block, ...]."""
  n = -(-x_BxNx_.shape[1] // block)
  pad = [(0, 0), (0, n * block - x_BxNx_.shape[1])] + [(0, 0)] * (x_BxNx_.ndim - 2)
  x = jnp.pad(x_BxNx_, pad, constant_values=fill)
  return jnp.moveaxis(x.reshape(x.shape[0], n, block, *x.shape[2:]), 1, 0)


def _from_blocks(x_NxBxbx_, length):
  x = jnp.moveaxis(x_NxBxbx_, 0, 1)
  return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]


# Inside the kernel every product is a 4-d matmul batched over [B, K]: a q block's G heads and bq positions
# fold into one query axis of Q = G * bq (head-major), keys and values are [B, K, bk, D]. XLA:CPU runs
# these several times faster than the 5-d einsums over [B, bq, K, G, D] (scores at B=64, T=128, H=4, D=16:
# 5.6 vs 35 ms; at Qwen3-0.6B's heads, B=8, T=256: 39 vs 78 ms).
def _fold_q_blocks(x_BxTxKxGx_, block):
  """[B, T, K, G, ...] -> [nq, B, K, G * bq, ...]."""
  x = _to_blocks(x_BxTxKxGx_, block, 0)  # [nq, B, bq, K, G, ...]
  nq, B, bq, K, G = x.shape[:5]
  x = jnp.moveaxis(x, 2, 4)  # [nq, B, K, G, bq, ...]
  return x.reshape(nq, B, K, G * bq, *x.shape[5:])


def _fold_q_positions(q_pos_BxT, block, G):
  """Query positions along the folded axis, [nq, B, G * bq]; padded rows get int32 min and see no key."""
  return jnp.tile(_to_blocks(q_pos_BxT, block, jnp.iinfo(jnp.int32).min), (1, 1, G))


def _unfold_q_blocks(x_NxBxKxQx_, G, length):
  """[nq, B, K, G * bq, ...] -> [B, T, K, G, ...] (inverse of _fold_q_blocks)."""
  nq, B, K, Q = x_NxBxKxQx_.shape[:4]
  x = x_NxBxKxQx_.reshape(nq, B, K, G, Q // G, *x_NxBxKxQx_.shape[4:])
  return _from_blocks(jnp.moveaxis(x, 4, 2), length)


def _kv_blocks(x_BxSxKxD, block):
  """[B, S, K, D] -> [nk, B, K, bk, D]."""
  return jnp.swapaxes(_to_blocks(x_BxSxKxD, block, 0), 2, 3)


def _block_visible(q_pos_BxQ, kv_pos_Bxs, kv_valid_Bxs):
  """[B, 1, Q, bk] visibility, broadcastable over the K head axis of block scores."""
  return (kv_valid_Bxs[:, None, :] & (kv_pos_Bxs[:, None, :] <= q_pos_BxQ[:, :, None]))[:, None]


def _block_scores(q_BxKxQxD, k_BxKxsxD, visible, scale):
  """Scaled float32 scores [B, K, Q, bk], -inf where not visible."""
  s = jnp.einsum("bkqd,bksd->bkqs", q_BxKxQxD, k_BxKxsxD.astype(q_BxKxQxD.dtype), preferred_element_type=jnp.float32)
  return jnp.where(visible, s * scale, -jnp.inf)


def _blockwise_forward(q, k, v, q_pos, kv_pos, kv_valid, block_q, block_kv):
  """Output [B, T, H, D] and the row logsumexp in blocks [nq, B, K, G * bq] (+inf for empty rows)."""
  B, T, H, D = q.shape
  K = k.shape[2]
  G, scale = H // K, 1.0 / math.sqrt(D)
  q_blocks = _fold_q_blocks(q.reshape(B, T, K, G, D), block_q)
  q_pos_blocks = _fold_q_positions(q_pos, block_q, G)
  kv_blocks = (_kv_blocks(k, block_kv), _kv_blocks(v, block_kv),
               _to_blocks(kv_pos, block_kv, 0), _to_blocks(kv_valid, block_kv, False))
  Q = G * block_q

  def one_q_block(args):
    q_blk, q_pos_blk = args

    def kv_step(carry, kv):
      k_blk, v_blk, kv_pos_blk, valid_blk = kv
      visible = _block_visible(q_pos_blk, kv_pos_blk, valid_blk)

      def update(carry):
        m, l, acc = carry
        s = _block_scores(q_blk, k_blk, visible, scale)
        m_new = jnp.maximum(m, s.max(-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # no -inf - -inf while a row is empty
        p = jnp.exp(s - m_safe[..., None])
        correction = jnp.exp(m - m_safe)
        pv = jnp.einsum("bkqs,bksd->bkqd", p.astype(v.dtype), v_blk, preferred_element_type=jnp.float32)
        return m_new, l * correction + p.sum(-1), acc * correction[..., None] + pv

      return lax.cond(visible.any(), update, lambda c: c, carry), None

    init = (jnp.full((B, K, Q), -jnp.inf), jnp.zeros((B, K, Q)), jnp.zeros((B, K, Q, D)))
    (m, l, acc), _ = lax.scan(kv_step, init, kv_blocks)
    seen = l > 0
    out = acc / jnp.where(seen, l, 1.0)[..., None]
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), jnp.inf)
    return out.astype(q.dtype), lse

  out_blocks, lse_blocks = lax.map(one_q_block, (q_blocks, q_pos_blocks))
  return _unfold_q_blocks(out_blocks, G, T).reshape(B, T, H, D), lse_blocks


def _blockwise_backward(block_q, block_kv, residuals, dout_BxTxHxD):
  """Flash-style backward: outer scan over kv blocks (dk, dv per block), inner over q blocks
  (dq contributions summed into a float32 buffer of q's blocks). Scores are recomputed per block."""
  q, k, v, q_pos, kv_pos, kv_valid, out, lse_blocks = residuals
  B, T, H, D = q.shape
  S, K = k.shape[1], k.shape[2]
  G, scale = H // K, 1.0 / math.sqrt(D)
  as5 = lambda x: x.reshape(B, T, K, G, D)
  delta_BxTxKxG = jnp.sum(dout_BxTxHxD.astype(jnp.float32) * out.astype(jnp.float32), -1).reshape(B, T, K, G)
  q_side = (_fold_q_blocks(as5(q), block_q), _fold_q_blocks(as5(dout_BxTxHxD), block_q), lse_blocks,
            _fold_q_blocks(delta_BxTxKxG, block_q),
            _fold_q_positions(q_pos, block_q, G))
  kv_side = (_kv_blocks(k, block_kv), _kv_blocks(v, block_kv),
             _to_blocks(kv_pos, block_kv, 0), _to_blocks(kv_valid, block_kv, False))

  def kv_step(dq_acc, kv):
    k_blk, v_blk, kv_pos_blk, valid_blk = kv

    def q_step(dkv, qs):
      q_blk, do_blk, lse_blk, delta_blk, q_pos_blk = qs
      visible = _block_visible(q_pos_blk, kv_pos_blk, valid_blk)

      def grads(dkv):
        dk, dv = dkv
        p = jnp.exp(_block_scores(q_blk, k_blk, visible, scale) - lse_blk[..., None])
        dv = dv + jnp.einsum("bkqs,bkqd->bksd", p.astype(do_blk.dtype), do_blk, preferred_element_type=jnp.float32)
        dp = jnp.einsum("bkqd,bksd->bkqs", do_blk, v_blk.astype(do_blk.dtype), preferred_element_type=jnp.float32)
        ds = p * (dp - delta_blk[..., None]) * scale
        dk = dk + jnp.einsum("bkqs,bkqd->bksd", ds.astype(q.dtype), q_blk, preferred_element_type=jnp.float32)
        dq = jnp.einsum("bkqs,bksd->bkqd", ds.astype(q.dtype), k_blk.astype(q.dtype),
                        preferred_element_type=jnp.float32)
        return (dk, dv), dq

      skip = lambda dkv: (dkv, jnp.zeros(q_blk.shape, jnp.float32))
      return lax.cond(visible.any(), grads, skip, dkv)

    zeros_kv = jnp.zeros(k_blk.shape, jnp.float32)
    (dk, dv), dq_blocks = lax.scan(q_step, (zeros_kv, zeros_kv), q_side)
    return dq_acc + dq_blocks, (dk, dv)

  dq_init = jnp.zeros(q_side[0].shape, jnp.float32)
  dq_blocks, (dk_blocks, dv_blocks) = lax.scan(kv_step, dq_init, kv_side)
  dq = _unfold_q_blocks(dq_blocks, G, T).reshape(B, T, H, D).astype(q.dtype)
  dk, dv = (_from_blocks(jnp.swapaxes(x, 2, 3), S) for x in (dk_blocks, dv_blocks))
  return dq, dk.astype(k.dtype), dv.astype(v.dtype), None, None, None


def _blockwise_fwd(q, k, v, q_pos, kv_pos, kv_valid, block_q, block_kv):
  out, lse_blocks = _blockwise_forward(q, k, v, q_pos, kv_pos, kv_valid, block_q, block_kv)
  return out, (q, k, v, q_pos, kv_pos, kv_valid, out, lse_blocks)


_blockwise = jax.custom_vjp(lambda q, k, v, q_pos, kv_pos, kv_valid, block_q, block_kv:
                            _blockwise_forward(q, k, v, q_pos, kv_pos, kv_valid, block_q, block_kv)[0],
                            nondiff_argnums=(6, 7))
_blockwise.defvjp(_blockwise_fwd, _blockwise_backward)


# ----------------------------------------------------------------------------- splash (TPU)

def _splash(q, k, v, kv_valid, block_q, block_kv, *, interpret):
  """Causal splash MHA (GQA by kv head index h // G), padding masked by kv segment ids, vmapped over B."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  if block_q % _SPLASH_LANES or block_kv % _SPLASH_LANES:
    raise ValueError(f"splash block sizes must be multiples of {_SPLASH_LANES}; got {block_q}, {block_kv}")
  B, T, H, D = q.shape
  S = k.shape[1]
  round_up = lambda n, m: -(-n // m) * m
  bq, bkv = min(block_q, round_up(T, _SPLASH_LANES)), min(block_kv, round_up(S, _SPLASH_LANES))
  Tp, Sp = round_up(T, bq), round_up(S, bkv)
  pad_seq = lambda x, n: jnp.pad(x, [(0, 0), (0, n - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
  q_BxHxTxD = pad_seq((q.astype(jnp.float32) / math.sqrt(D)).astype(q.dtype), Tp).transpose(0, 2, 1, 3)
  k_BxKxSxD = pad_seq(k.astype(q.dtype), Sp).transpose(0, 2, 1, 3)
  v_BxKxSxD = pad_seq(v.astype(q.dtype), Sp).transpose(0, 2, 1, 3)
  segments = splash.SegmentIds(q=jnp.ones((B, Tp), jnp.int32), kv=pad_seq(kv_valid, Sp).astype(jnp.int32))
  block_sizes = splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq,
                                  block_kv_dkv=bkv, block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
  mask = splash.MultiHeadMask([splash.CausalMask((Tp, Sp)) for _ in range(H)])
  kernel = splash.make_splash_mha(mask, block_sizes=block_sizes, head_shards=1, q_seq_shards=1,
                                  interpret=interpret)
  out_BxHxTxD = jax.vmap(kernel)(q_BxHxTxD, k_BxKxSxD, v_BxKxSxD, segments)
  return out_BxHxTxD[:, :, :T].transpose(0, 2, 1, 3).astype(q.dtype)


# ----------------------------------------------------------------------------- cuDNN (GPU)

def _cudnn_applies(q, platform) -> bool:
  D = q.shape[-1]
  return (_platform(platform) in ("gpu", "cuda") and q.dtype in (jnp.float16, jnp.bfloat16)
          and D % 8 == 0 and D <= 128)


def _cudnn(q, k, v, kv_valid):
  lengths_B = kv_valid.sum(axis=1).astype(jnp.int32)  # kv_valid must be a prefix per row
  return jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), scale=1.0 / math.sqrt(q.shape[-1]),
                                      is_causal=True, key_value_seq_lengths=lengths_B, implementation="cudnn")
