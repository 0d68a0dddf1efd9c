"""Flax (linen) dense Qwen decoder: Qwen2 / Qwen2.5 / Qwen3 from one QwenConfig.

Layers are stacked with `nn.scan` (parameters carry a leading 'layers' axis), every parameter and
main activation carries logical axis names, and the forward optionally reads/writes a KV cache so
the same module serves training (no cache) and the sampler (prefill + decode).

Attention uses key index == absolute position, so right-padded prompts need only a causal mask:
garbage written past a row's true length is never visible to a query at an earlier position.
With a cache, each layer attends over the old cache (entries before this call's write index) plus
this call's own keys, and returns the new keys/values; one scatter after the layer scan writes them
into the cache, in place. (Writing inside the scan made XLA copy the whole cache every step.)
"""
from typing import Any, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from oapl_jax import parallel
from oapl_jax.models.config import QwenConfig

Array = jax.Array


class KVCache(NamedTuple):
  """Per-layer keys/values, stacked over layers: [layers, batch, kv_heads, max_len, head_dim].

  Head-major, so attention reads each layer's block without a transpose; `write_cache` adds a
  call's new entries after the layer scan (a decode step writes one position per row).
  """

  k: Array
  v: Array


def init_cache(config: QwenConfig, batch: int, max_len: int, dtype=None) -> KVCache:
  shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
  dtype = dtype or config.jnp_dtype
  return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


CACHE_LOGICAL_AXES = KVCache(*(("layers", "cache_batch", "cache_kv_heads", "cache_length", "head_dim"),) * 2)


def _constrain(x, names):
  return parallel.constrain(x, names)


class RMSNorm(nn.Module):
  eps: float
  param_dtype: Any
  axis_name: str = "norm"

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis_name,)),
                       (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return scale.astype(x.dtype) * x32.astype(x.dtype)  # same rounding order as HF


def rope(x_BxTxHxD, positions_BxT, theta: float):
  """Rotary embedding, HF's rotate-half layout (first half / second half of head_dim)."""
  half = x_BxTxHxD.shape[-1] // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(0, half, dtype=jnp.float32) * 2.0 / (2 * half)))
  angles_BxTxF = positions_BxT.astype(jnp.float32)[..., None] * inv_freq
  cos = jnp.cos(angles_BxTxF)[:, :, None, :].astype(x_BxTxHxD.dtype)
  sin = jnp.sin(angles_BxTxF)[:, :, None, :].astype(x_BxTxHxD.dtype)
  x1, x2 = x_BxTxHxD[..., :half], x_BxTxHxD[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _dense(features, axes, config, name, bias=False, in_axes=-1):
  return nn.DenseGeneral(
      features, axis=in_axes, use_bias=bias, dtype=config.jnp_dtype, param_dtype=config.jnp_param_dtype,
      kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]), name=name)


def write_cache(cache: "KVCache", new_k_LxBxKxTxD, new_v_LxBxKxTxD, write_index_B) -> "KVCache":
  """Scatter every layer's T new entries into each row at that row's own offset."""
  B, T = new_k_LxBxKxTxD.shape[1], new_k_LxBxKxTxD.shape[3]
  rows_Bx1 = jnp.arange(B)[:, None]
  slots_BxT = write_index_B[:, None] + jnp.arange(T)[None, :]

  def put(cache_LxBxKxSxD, new_LxBxKxTxD):
    # Advanced indices (rows, slots) around the head slice: the indexed block is [B, T, L, K, D].
    block = new_LxBxKxTxD.transpose(1, 3, 0, 2, 4).astype(cache_LxBxKxSxD.dtype)
    return cache_LxBxKxSxD.at[:, rows_Bx1, :, slots_BxT, :].set(block, mode="drop")

  return KVCache(put(cache.k, new_k_LxBxKxTxD), put(cache.v, new_v_LxBxKxTxD))


# One query position (decode): many tiny per-(row, head) matmuls are slow as batched dots on
# CPU, so the products are written as a fused multiply-reduce there; the math is identical.
def _attention_dot(q_BxTxKxGxD, k_BxKxSxD):
  if q_BxTxKxGxD.shape[1] == 1:
    prod = q_BxTxKxGxD[:, 0, :, :, None, :].astype(jnp.float32) * k_BxKxSxD[:, :, None].astype(jnp.float32)
    return jnp.sum(prod, axis=-1)[:, :, :, None, :]  # [B, K, G, 1, S]
  return jnp.einsum("btkgd,bksd->bkgts", q_BxTxKxGxD, k_BxKxSxD, preferred_element_type=jnp.float32)


def _attention_mix(probs_BxKxGxTxS, v_BxKxSxD):
  if probs_BxKxGxTxS.shape[3] == 1:
    out_BxKxGxD = jnp.sum(probs_BxKxGxTxS[:, :, :, 0, :, None].astype(jnp.float32)
                          * v_BxKxSxD[:, :, None].astype(jnp.float32), axis=3)
    return out_BxKxGxD[:, None].astype(v_BxKxSxD.dtype)  # [B, 1, K, G, D]
  return jnp.einsum("bkgts,bksd->btkgd", probs_BxKxGxTxS, v_BxKxSxD)


class Attention(nn.Module):
  config: QwenConfig

  @nn.compact
  def __call__(self, x_BxTxE, positions_BxT, key_mask_BxS, layer_cache, write_index_B):
    c = self.config
    q = _dense((c.num_heads, c.head_dim), ("embed", "q_heads", "head_dim"), c, "q_proj", c.qkv_bias)(x_BxTxE)
    k = _dense((c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), c, "k_proj", c.qkv_bias)(x_BxTxE)
    v = _dense((c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), c, "v_proj", c.qkv_bias)(x_BxTxE)
    if c.qk_norm:
      q = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, "head_dim", name="q_norm")(q)
      k = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, "head_dim", name="k_norm")(k)
    q = _constrain(rope(q, positions_BxT, c.rope_theta), ("activation_batch", "activation_length", "activation_heads", None))
    k = rope(k, positions_BxT, c.rope_theta)

    B, T, H, D = q.shape
    K = c.num_kv_heads
    q_BxTxKxGxD = q.reshape(B, T, K, H // K, D)
    k_BxKxTxD, v_BxKxTxD = k.swapaxes(1, 2), v.swapaxes(1, 2)
    # This call's own tokens: causal by position (and the optional key mask).
    visible_BxTxT = positions_BxT[:, None, :] <= positions_BxT[:, :, None]
    if key_mask_BxS is not None:
      visible_BxTxT &= key_mask_BxS[:, None, :].astype(bool)
    scores = _attention_dot(q_BxTxKxGxD, k_BxKxTxD.astype(q.dtype))
    visible = visible_BxTxT
    if layer_cache is not None:  # plus the cached entries written by earlier calls
      old_k_BxKxSxD, old_v_BxKxSxD = layer_cache
      S = old_k_BxKxSxD.shape[2]
      old_visible_BxTxS = jnp.broadcast_to((jnp.arange(S)[None, :] < write_index_B[:, None])[:, None, :], (B, T, S))
      scores = jnp.concatenate([_attention_dot(q_BxTxKxGxD, old_k_BxKxSxD.astype(q.dtype)), scores], axis=-1)
      visible = jnp.concatenate([old_visible_BxTxS, visible_BxTxT], axis=-1)
    scores = jnp.where(visible[:, None, None], scores / jnp.sqrt(jnp.float32(D)), jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = _attention_mix(probs[..., -T:], v_BxKxTxD.astype(q.dtype))
    if layer_cache is not None:
      out = out + _attention_mix(probs[..., :-T], old_v_BxKxSxD.astype(q.dtype))
    out = out.reshape(B, T, H, D)
    out = _dense(c.hidden_size, ("q_heads", "head_dim", "embed"), c, "o_proj", in_axes=(-2, -1))(out)
    return out, (k_BxKxTxD, v_BxKxTxD)


class MLP(nn.Module):
  config: QwenConfig

  @nn.compact
  def __call__(self, x_BxTxE):
    c = self.config
    gate = _dense(c.intermediate_size, ("embed", "mlp"), c, "gate_proj")(x_BxTxE)
    up = _dense(c.intermediate_size, ("embed", "mlp"), c, "up_proj")(x_BxTxE)
    h = _constrain(nn.silu(gate) * up, ("activation_batch", "activation_length", "activation_mlp"))
    return _dense(c.hidden_size, ("mlp", "embed"), c, "down_proj")(h)


class DecoderLayer(nn.Module):
  """One block; fits nn.scan: (x, this layer's old cache or None, *broadcast) -> (x, its new k/v)."""

  config: QwenConfig

  @nn.compact
  def __call__(self, x_BxTxE, layer_cache, positions_BxT, key_mask_BxS, write_index_B):
    c = self.config
    h = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name="input_norm")(x_BxTxE)
    attn, new_kv = Attention(c, name="attn")(h, positions_BxT, key_mask_BxS, layer_cache, write_index_B)
    x_BxTxE = x_BxTxE + attn
    h = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name="post_attn_norm")(x_BxTxE)
    x_BxTxE = x_BxTxE + MLP(c, name="mlp")(h)
    x_BxTxE = _constrain(x_BxTxE, ("activation_batch", "activation_length", "activation_embed"))
    return x_BxTxE, new_kv


class Qwen(nn.Module):
  """Returns final-norm hidden states [B, T, E] (and the updated cache); `logits` projects them."""

  config: QwenConfig

  def setup(self):
    c = self.config
    self.embed = nn.Embed(c.vocab_size, c.hidden_size, dtype=c.jnp_dtype, param_dtype=c.jnp_param_dtype,
                          embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")))
    layer = nn.remat(DecoderLayer, prevent_cse=False) if c.remat else DecoderLayer
    self.layers = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True},
                          in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast), length=c.num_layers,
                          metadata_params={nn.PARTITION_NAME: "layers"})(c, name="layers")
    self.final_norm = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype)
    if not c.tie_word_embeddings:
      self.lm_head = _dense(c.vocab_size, ("embed", "vocab"), c, "lm_head")

  def __call__(self, tokens_BxT, positions_BxT=None, *, key_mask_BxS=None,
               cache: Optional[KVCache] = None, write_index_B=None):
    if positions_BxT is None:
      positions_BxT = jnp.broadcast_to(jnp.arange(tokens_BxT.shape[1]), tokens_BxT.shape)
    if cache is not None and write_index_B is None:
      write_index_B = positions_BxT[:, 0]
    x = self.embed(tokens_BxT)
    x = _constrain(x, ("activation_batch", "activation_length", "activation_embed"))
    x, (new_k, new_v) = self.layers(x, cache, positions_BxT, key_mask_BxS, write_index_B)
    new_cache = None if cache is None else write_cache(cache, new_k, new_v, write_index_B)
    return self.final_norm(x), new_cache

  def logits(self, hidden_BxTxE):
    if self.config.tie_word_embeddings:
      return self.embed.attend(hidden_BxTxE)
    return self.lm_head(hidden_BxTxE)


def logits(params, config: QwenConfig, tokens_BxT, positions_BxT=None, key_mask_BxS=None):
  """Full [B, T, V] logits in float32 (for parity tests and small batches)."""
  model = Qwen(config)
  hidden, _ = model.apply({"params": params}, tokens_BxT, positions_BxT, key_mask_BxS=key_mask_BxS)
  return model.apply({"params": params}, hidden, method=Qwen.logits).astype(jnp.float32)


def token_logprobs(params, config: QwenConfig, tokens_BxT, targets_BxT, positions_BxT=None, *,
                   key_mask_BxS=None, temperature: float = 1.0, with_entropy: bool = False):
  """log softmax(logits / temperature)[target] per position, float32 [B, T].

  The vocabulary projection runs in chunks of `config.logprob_chunk` positions under
  `jax.checkpoint`, so at most one float32 [B, chunk, V] block is alive, forward or backward.
  With `with_entropy`, also returns the per-position entropy of the same distribution.
  """
  model = Qwen(config)
  hidden_BxTxE, _ = model.apply({"params": params}, tokens_BxT, positions_BxT, key_mask_BxS=key_mask_BxS)
  B, T, E = hidden_BxTxE.shape
  chunk = min(config.logprob_chunk, T)
  pad = (-T) % chunk
  hidden_NxBxCxE = jnp.pad(hidden_BxTxE, ((0, 0), (0, pad), (0, 0))).reshape(B, -1, chunk, E).swapaxes(0, 1)
  targets_NxBxC = jnp.pad(targets_BxT, ((0, 0), (0, pad))).reshape(B, -1, chunk).swapaxes(0, 1)

  @jax.checkpoint
  def one_chunk(h_BxCxE, t_BxC):
    z = model.apply({"params": params}, h_BxCxE, method=Qwen.logits).astype(jnp.float32) / temperature
    logz = jax.nn.logsumexp(z, axis=-1)
    logp = jnp.take_along_axis(z, t_BxC[..., None], axis=-1)[..., 0] - logz
    ent = logz - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
    return logp, ent

  logp_NxBxC, ent_NxBxC = jax.lax.map(lambda xs: one_chunk(*xs), (hidden_NxBxCxE, targets_NxBxC))
  logp_BxT = logp_NxBxC.swapaxes(0, 1).reshape(B, -1)[:, :T]
  if not with_entropy:
    return logp_BxT
  return logp_BxT, ent_NxBxC.swapaxes(0, 1).reshape(B, -1)[:, :T]


def init_params(config: QwenConfig, rng) -> Any:
  """Boxed (nn.Partitioned) params; use parallel.init_sharded to get them born sharded."""
  def forward_and_project(module, tokens_BxT):
    return module.logits(module(tokens_BxT)[0])
  tokens = jnp.zeros((1, 1), jnp.int32)
  return Qwen(config).init(rng, tokens, method=forward_and_project)["params"]


def param_logical_axes(config: QwenConfig):
  """Pytree of logical-axis PartitionSpecs matching the params tree."""
  abstract = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
  return nn.get_partition_spec(abstract)
