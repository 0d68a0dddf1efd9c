"""The sampler's side of the shared decoder (models/decoder.py): its KV cache, its layout of the weights and the
cached forward.

`forward_with_cache` runs the training `Decoder`'s layers on the same weights split per layer (`unstack_layers`,
once per snapshot) over per-layer caches, as a Python loop over layers: inside a scan, slicing one layer out of a
stacked cache (or stacked weights) costs a copy of it every decode step.
"""
from typing import Optional

import jax
import jax.numpy as jnp

from oapl_jax.models import projection_grad
from oapl_jax.models.decoder import (Cache, Decoder, DecoderLayer, KVCache, Rotary, param_logical_axes,
                                     rotary)
from oapl_jax.models.decoder_config import DecoderConfig


def init_cache(config: DecoderConfig, batch: int, max_len: int, dtype=None) -> Cache:
  B, K, D = batch, config.num_kv_heads, config.head_dim
  dtype = dtype or config.jnp_dtype
  return tuple(KVCache(jnp.zeros((B, K, D, max_len), dtype), jnp.zeros((B, K, max_len, D), dtype))
               for _ in range(config.num_layers))


def cache_length(cache: Cache) -> int:
  return cache[0].k.shape[-1]


def grow_cache(cache: Cache, max_len: int) -> Cache:
  """Zero-pad every layer's cache to `max_len` positions. Entries keep their positions, so the
  longer cache attends exactly like the shorter one."""
  extra = max_len - cache_length(cache)
  if extra < 0:
    raise ValueError(f"cannot shrink a cache of length {cache_length(cache)} to {max_len}")
  return tuple(KVCache(jnp.pad(c.k, ((0, 0), (0, 0), (0, 0), (0, extra))),
                       jnp.pad(c.v, ((0, 0), (0, 0), (0, extra), (0, 0)))) for c in cache)


CACHE_LOGICAL_AXES = KVCache(("cache_batch", "cache_kv_heads", "head_dim", "cache_length"),
                             ("cache_batch", "cache_kv_heads", "cache_length", "head_dim"))


def copy_cache_rows(dst: Cache, src: Cache, dst_rows_M, src_rows_M) -> Cache:
  """dst rows dst_rows_M <- src rows src_rows_M over src's positions (out-of-range dst rows dropped)."""
  T = cache_length(src)
  return tuple(KVCache(d.k.at[dst_rows_M, :, :, :T].set(s.k[src_rows_M], mode="drop"),
                       d.v.at[dst_rows_M, :, :T].set(s.v[src_rows_M], mode="drop")) for d, s in zip(dst, src))


def unstack_layers(params):
  """The sampler's layout: the scan's stacked layer params split into a tuple of per-layer trees
  (once per snapshot), so a decode loop never slices stacked weights."""
  stacked = params["layers"]
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  return {**params, "layers": tuple(jax.tree.map(lambda p, i=i: p[i], stacked) for i in range(num_layers))}


TRANSPOSED_TABLE = "embed_transposed_ExV"  # the decode layout's [E, V] copy of a tied table (decode_transposed_table)


def _keeps_transposed_table(config: DecoderConfig) -> bool:
  return config.tie_word_embeddings and config.decode_transposed_table


def decode_layout(params, config: DecoderConfig):
  """unstack_layers, and with config.decode_transposed_table a tied table's [E, V] transpose beside it (the
  logits' operand; the lookups keep reading the [V, E] table)."""
  out = unstack_layers(params)
  if _keeps_transposed_table(config):
    out[TRANSPOSED_TABLE] = params["embed"]["embedding"].T
  return out


def is_per_layer(params) -> bool:
  """Whether `params` are in the unstack_layers layout."""
  return isinstance(params, dict) and isinstance(params.get("layers"), tuple)


def unstacked_logical_axes(config: DecoderConfig):
  """param_logical_axes in the unstack_layers layout (the leading 'layers' name dropped)."""
  axes = param_logical_axes(config)
  one_layer = jax.tree.map(lambda spec: jax.sharding.PartitionSpec(*spec[1:]), axes["layers"],
                           is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  out = {**axes, "layers": (one_layer,) * config.num_layers}
  if _keeps_transposed_table(config):
    out[TRANSPOSED_TABLE] = jax.sharding.PartitionSpec("embed", "vocab")
  return out


@jax.named_scope("decode_logits")  # a profile's name for the projection, through either table
def decode_logits(params, config: DecoderConfig, hidden_BxE):
  """The vocabulary projection in the decode layout (through the [E, V] copy where decode_layout made one)."""
  if TRANSPOSED_TABLE in params:
    table_ExV = params[TRANSPOSED_TABLE]
    hidden_BxE, table_ExV = hidden_BxE.astype(config.jnp_dtype), table_ExV.astype(config.jnp_dtype)
    return projection_grad.low_precision_dot(hidden_BxE, table_ExV, (((hidden_BxE.ndim - 1,), (0,)), ((), ())))
  return Decoder(config).apply({"params": params}, hidden_BxE, method=Decoder.logits)


def forward_with_cache(params, config: DecoderConfig, tokens_BxT, positions_BxT, cache: Cache,
                       rope_table: Optional[Rotary] = None):
  """Prefill or decode: (final-norm hidden [B, T, E], updated cache). `params` in the
  unstack_layers layout; layers run as a Python loop over the per-layer caches. Each token's
  key/value is written at its position (cache index == absolute position). A decode loop passes
  a `rotary_table` covering the cache, built once outside the loop."""
  if len(cache) != config.num_layers or len(params["layers"]) != config.num_layers:
    raise ValueError(f"cache has {len(cache)} layers and params {len(params['layers'])}; "
                     f"the model has {config.num_layers}")
  model, layer = Decoder(config), DecoderLayer(config)
  x = model.apply({"params": params}, tokens_BxT, method=Decoder.embed_tokens)
  rot = rotary(config, positions_BxT, rope_table)
  new_cache = []
  for layer_params, layer_cache in zip(params["layers"], cache):
    x, layer_cache = layer.apply({"params": layer_params}, x, positions_BxT, rot, None, layer_cache)
    new_cache.append(layer_cache)
  return model.apply({"params": params}, x, method=Decoder.finish), tuple(new_cache)
