"""Flax (linen) dense decoder, shared by the families (Qwen2 / 2.5 / 3, Llama 3): one DecoderConfig subclass
per family (models/qwen/config.py, models/llama/config.py) says what differs: q/k/v bias, q/k RMSNorm, the
rotary frequencies (config.rope_inv_freq), tied embeddings.

Training runs `Decoder`: layers stacked with `nn.scan` (parameters carry a leading 'layers' axis),
logical axis names on every parameter and main activation. The sampler runs models/decoder_cached.py's
`forward_with_cache` on the same weights split per layer, over per-layer KV caches (`KVCache`).

Attention uses key index == absolute position, so right-padded prompts need only a causal mask:
garbage written past a row's true length is never visible to a query at an earlier position.
With a cache, each layer first scatters this call's keys/values into its cache in place, then
attends over the cache (key index <= query position); no stale entry is ever visible.
"""
import functools
from typing import Any, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from oapl_jax import parallel
from oapl_jax.models import projection_grad, prompt_groups, vocab_logprobs
from oapl_jax.models.attention import attend
from oapl_jax.models.decoder_config import DecoderConfig
from oapl_jax.models.execution import remat_policy
from oapl_jax.models.prompt_groups import PromptGroups

Array = jax.Array


class KVCache(NamedTuple):
  """One layer's cache. Keys are stored position-minor, [batch, kv_heads, head_dim, max_len]: the
  [head_dim, positions] right-hand side of the scores matmul, read without a transpose; values are
  [batch, kv_heads, max_len, head_dim], the right-hand side of the value mix. A model's cache is a
  tuple of these, one per layer.
  """

  k: Array
  v: Array


Cache = tuple  # tuple[KVCache, ...], one per layer


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


class Rotary(NamedTuple):
  """cos / sin of the rotary angles, [B, T, 1, head_dim / 2]: made once per forward and shared by
  every layer's q and k. (Or, from `rotary_table`, [L, head_dim / 2] for positions 0..L-1.)"""

  cos: Array
  sin: Array


def _rotary_at(config: DecoderConfig, positions_f32) -> Rotary:
  """cos / sin of positions * config.rope_inv_freq() (theta^(-2i / head_dim), or a family's rescaling of it),
  shaped positions.shape + [head_dim / 2]."""
  angles = positions_f32[..., None] * config.rope_inv_freq()
  return Rotary(jnp.cos(angles).astype(config.jnp_dtype), jnp.sin(angles).astype(config.jnp_dtype))


def rotary_table(config: DecoderConfig, length: int) -> Rotary:
  """cos / sin for positions 0..length-1, [length, head_dim / 2]."""
  return _rotary_at(config, jnp.arange(length, dtype=jnp.float32))


def rotary(config: DecoderConfig, positions_BxT, table: Optional[Rotary] = None) -> Rotary:
  """The angles at `positions_BxT`, [B, T, 1, head_dim / 2]: computed, or looked up in a
  `rotary_table` (a decode loop builds the table once; XLA:CPU would otherwise re-evaluate the
  trig inside every fused consumer, for each layer, head and q/k)."""
  if table is not None:
    return Rotary(table.cos[positions_BxT][:, :, None], table.sin[positions_BxT][:, :, None])
  return _rotary_at(config, positions_BxT.astype(jnp.float32)[..., None])


def rope(x_BxTxHxD, rot: Rotary):
  """Rotary embedding, HF's rotate-half layout (first half / second half of head_dim)."""
  half = x_BxTxHxD.shape[-1] // 2
  cos, sin = rot.cos.astype(x_BxTxHxD.dtype), rot.sin.astype(x_BxTxHxD.dtype)
  x1, x2 = x_BxTxHxD[..., :half], x_BxTxHxD[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class Projection(nn.DenseGeneral):
  """nn.DenseGeneral (the same 'kernel' / 'bias' params), plus x·A·B when the 'lora' collection holds adapters
  for this module (models/lora.py's tree, B already scaled by alpha / rank): LoRA inside the layer, so neither
  merged weights nor their full-size gradient are ever materialized."""

  @nn.compact
  def __call__(self, inputs):
    y = nn.DenseGeneral.__call__(self, inputs)
    if not self.has_variable("lora", "lora_a"):
      return y
    a = self.get_variable("lora", "lora_a").astype(self.dtype)
    b = self.get_variable("lora", "lora_b").astype(self.dtype)
    n_in = a.ndim - 1
    z = jnp.tensordot(inputs.astype(self.dtype), a, axes=(tuple(range(inputs.ndim - n_in, inputs.ndim)),
                                                          tuple(range(n_in))))
    return y + jnp.tensordot(z, b, axes=1).astype(y.dtype)


def _dense(features, axes, config, name, bias=False, in_axes=-1):
  return Projection(
      features, axis=in_axes, use_bias=bias, dtype=config.jnp_dtype, param_dtype=config.jnp_param_dtype,
      kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]), dot_general=projection_grad.dot_general,
      name=name)


def _write_cache(layer_cache: KVCache, new_k_BxKxTxD, new_v_BxKxTxD, positions_BxT) -> KVCache:
  """Scatter a call's T new entries into the cache, each at its own position (in place)."""
  rows_Bx1 = jnp.arange(positions_BxT.shape[0])[:, None]
  # Advanced indices (rows, positions) around sliced axes: the indexed block is [B, T, K, D].
  block_k = new_k_BxKxTxD.swapaxes(1, 2).astype(layer_cache.k.dtype)
  block_v = new_v_BxKxTxD.swapaxes(1, 2).astype(layer_cache.v.dtype)
  return KVCache(layer_cache.k.at[rows_Bx1, :, :, positions_BxT].set(block_k, mode="drop"),
                 layer_cache.v.at[rows_Bx1, :, positions_BxT, :].set(block_v, mode="drop"))


# Both products are batched matmuls over [B, K] with the G query heads and T positions folded
# into one query axis: no separate decode path, and XLA:CPU runs this 4-d form several times
# faster than one with a separate unit T axis (and takes bf16 x bf16 -> f32 only query-major).
def _attention_dot(q_BxTxKxGxD, kt_BxKxDxS):
  """Scores [B, K, G, T, S] in float32."""
  B, T, K, G, D = q_BxTxKxGxD.shape
  q_BxKxQxD = q_BxTxKxGxD.transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, D)
  scores_BxKxQxS = jnp.einsum("bkqd,bkds->bkqs", q_BxKxQxD, kt_BxKxDxS, preferred_element_type=jnp.float32)
  return scores_BxKxQxS.reshape(B, K, G, T, kt_BxKxDxS.shape[-1])


def _attention_mix(probs_BxKxGxTxS, v_BxKxSxD):
  """Attention output [B, T, K, G, D]."""
  B, K, G, T, S = probs_BxKxGxTxS.shape
  probs_BxKxQxS = probs_BxKxGxTxS.reshape(B, K, G * T, S)
  # "bkqs,bksd->bkqd"; bf16 accumulates in f32 (projection_grad.low_precision_dot says why)
  out_BxKxQxD = projection_grad.low_precision_dot(probs_BxKxQxS, v_BxKxSxD, (((3,), (2,)), ((0, 1), (0, 1))))
  return out_BxKxQxD.reshape(B, K, G, T, v_BxKxSxD.shape[-1]).transpose(0, 3, 1, 2, 4)


class Attention(nn.Module):
  """Causal self-attention by position. Without a cache it attends over this call's own tokens
  (with the optional key mask); with one it first writes this call's keys/values into the cache
  at their positions, then attends over the cache (key index <= the query's position), and
  returns the updated cache."""

  config: DecoderConfig
  groups: Optional[PromptGroups] = None  # rows packed as prompt-sharing groups (models/prompt_groups.py)

  @nn.compact
  def __call__(self, x_BxTxE, positions_BxT, rot: Rotary, key_mask_BxS=None, layer_cache: Optional[KVCache] = None):
    c = self.config
    q = _dense((c.num_heads, c.head_dim), ("embed", "q_heads", "head_dim"), c, "q_proj", c.qkv_bias)(x_BxTxE)
    k = _dense((c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), c, "k_proj", c.qkv_bias)(x_BxTxE)
    v = _dense((c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), c, "v_proj", c.qkv_bias)(x_BxTxE)
    if c.qk_norm:
      q = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, "head_dim", name="q_norm")(q)
      k = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, "head_dim", name="k_norm")(k)
    q = _constrain(rope(q, rot), ("activation_batch", "activation_length", "activation_heads", None))
    k = rope(k, rot)

    B, T, H, D = q.shape
    kernel = dict(implementation=c.attention, block_q=c.attention_block_q, block_kv=c.attention_block_kv,
                  platform=parallel.current_platform())
    if layer_cache is None and self.groups is not None:  # training on packed groups
      out = prompt_groups.attend_grouped(self.groups, q, k, v, positions_BxT, key_mask_BxS, **kernel)
      return self._project(out), None
    if layer_cache is None:  # training: the configured kernel (flash-style off the reference path)
      out = attend(q, k, v, q_positions_BxT=positions_BxT, kv_positions_BxS=positions_BxT,
                   kv_valid_BxS=key_mask_BxS, **kernel)
      return self._project(out), None
    layer_cache = _write_cache(layer_cache, k.swapaxes(1, 2), v.swapaxes(1, 2), positions_BxT)
    keys_BxKxDxS, values_BxKxSxD = layer_cache
    S = keys_BxKxDxS.shape[-1]
    if T > 1 and c.attention != "reference":  # prefill: linear memory in T; cache index == position
      out = attend(q, keys_BxKxDxS.transpose(0, 3, 1, 2), values_BxKxSxD.swapaxes(1, 2),
                   q_positions_BxT=positions_BxT, kv_positions_BxS=jnp.broadcast_to(jnp.arange(S), (B, S)),
                   **dict(kernel, implementation="blockwise"))
      return self._project(out), layer_cache
    # Decode (one query per row): one [B, K, G, 1, S] block of scores, linear in the cache length.
    q_BxTxKxGxD = q.reshape(B, T, c.num_kv_heads, H // c.num_kv_heads, D)
    visible_BxTxS = jnp.arange(S)[None, None, :] <= positions_BxT[:, :, None]
    scores = _attention_dot(q_BxTxKxGxD, keys_BxKxDxS.astype(q.dtype))
    scores = jnp.where(visible_BxTxS[:, None, None], scores / jnp.sqrt(jnp.float32(D)), jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = _attention_mix(probs, values_BxKxSxD.astype(q.dtype)).reshape(B, T, H, D)
    return self._project(out), layer_cache

  def _project(self, out_BxTxHxD):
    c = self.config
    return _dense(c.hidden_size, ("q_heads", "head_dim", "embed"), c, "o_proj", in_axes=(-2, -1))(out_BxTxHxD)


def _mlp(c: DecoderConfig, x_BxTxE):
  """The gated MLP's projections, as submodules of the compact module calling this."""
  gate = _dense(c.intermediate_size, ("embed", "mlp"), c, "gate_proj")(x_BxTxE)
  up = _dense(c.intermediate_size, ("embed", "mlp"), c, "up_proj")(x_BxTxE)
  h = _constrain(nn.silu(gate) * up, ("activation_batch", "activation_length", "activation_mlp"))
  return _dense(c.hidden_size, ("mlp", "embed"), c, "down_proj")(h)


class MLP(nn.Module):
  config: DecoderConfig

  @nn.compact
  def __call__(self, x_BxTxE):
    return _mlp(self.config, x_BxTxE)


class MLPPiece(nn.Module):
  """The MLP as nn.scan's body over pieces of positions: (carry, x [B, C, E]) -> (carry, [B, C, E])."""
  config: DecoderConfig

  @nn.compact
  def __call__(self, carry, x_BxCxE):
    return carry, _mlp(self.config, x_BxCxE)


def mlp_over_pieces(c: DecoderConfig, x_BxTxE, name: str = "mlp"):
  """The MLP over `c.mlp_chunks` pieces of the positions, each rematerialised (call inside a compact method).
  Same parameters (broadcast to every piece) as MLP(c, name=name); padded positions are cut off."""
  B, T, E = x_BxTxE.shape
  n = min(c.mlp_chunks, T)
  if n == 1:
    return MLP(c, name=name)(x_BxTxE)
  C = -(-T // n)
  x_BxNxCxE = jnp.pad(x_BxTxE, ((0, 0), (0, n * C - T), (0, 0))).reshape(B, n, C, E)
  pieces = nn.scan(nn.remat(MLPPiece, prevent_cse=False), variable_broadcast=["params", "lora"],
                   split_rngs={"params": False},
                   in_axes=1, out_axes=1, length=n)
  _, out_BxNxCxE = pieces(c, name=name)(None, x_BxNxCxE)
  return out_BxNxCxE.reshape(B, n * C, E)[:, :T]


class DecoderLayer(nn.Module):
  """One block: (x, positions, rotary, key mask, [layer cache]) -> (x, updated cache or None)."""

  config: DecoderConfig
  groups: Optional[PromptGroups] = None

  @nn.compact
  def __call__(self, x_BxTxE, positions_BxT, rot: Rotary, key_mask_BxS=None, layer_cache=None):
    c = self.config
    x_BxTxE = checkpoint_name(x_BxTxE, "layer_input")  # what remat_policy="offload_layer_input" moves to host
    h = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name="input_norm")(x_BxTxE)
    attn, layer_cache = Attention(c, self.groups, name="attn")(h, positions_BxT, rot, key_mask_BxS, layer_cache)
    x_BxTxE = x_BxTxE + attn
    h = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name="post_attn_norm")(x_BxTxE)
    x_BxTxE = x_BxTxE + mlp_over_pieces(c, h)
    x_BxTxE = _constrain(x_BxTxE, ("activation_batch", "activation_length", "activation_embed"))
    return x_BxTxE, layer_cache


class Decoder(nn.Module):
  """The training forward: final-norm hidden states [B, T, E] over scanned layers; `logits`
  projects them. The sampler's cached forward is decoder_cached.forward_with_cache (same parameters). With
  `groups`, each row is a group packed by models/prompt_groups.pack (its prompt run once)."""

  config: DecoderConfig
  groups: Optional[PromptGroups] = None

  def setup(self):
    c = self.config
    self.embed = nn.Embed(c.vocab_size, c.hidden_size, dtype=c.jnp_dtype, param_dtype=c.jnp_param_dtype,
                          embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")))
    layer = nn.remat(DecoderLayer, prevent_cse=False, policy=remat_policy(c.remat_policy)) if c.remat else DecoderLayer
    self.layers = nn.scan(layer, variable_axes={"params": 0, "lora": 0}, split_rngs={"params": True},
                          in_axes=(nn.broadcast,) * 3, length=c.num_layers,
                          metadata_params={nn.PARTITION_NAME: "layers"})(c, self.groups, name="layers")
    self.final_norm = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype)
    if not c.tie_word_embeddings:
      self.lm_head = _dense(c.vocab_size, ("embed", "vocab"), c, "lm_head")

  def __call__(self, tokens_BxT, positions_BxT=None, *, key_mask_BxS=None):
    if positions_BxT is None:
      positions_BxT = jnp.broadcast_to(jnp.arange(tokens_BxT.shape[1]), tokens_BxT.shape)
    x, _ = self.layers(self.embed_tokens(tokens_BxT), positions_BxT, rotary(self.config, positions_BxT), key_mask_BxS)
    return self.finish(x)

  def embed_tokens(self, tokens_BxT):
    return _constrain(self.embed(tokens_BxT), ("activation_batch", "activation_length", "activation_embed"))

  def finish(self, x_BxTxE):
    return self.final_norm(x_BxTxE)

  def logits(self, hidden_BxTxE):
    if self.config.tie_word_embeddings:  # Embed.attend's value, contracted in the table's own [V, E] order
      return _attend(self.embed, hidden_BxTxE)
    return self.lm_head(hidden_BxTxE)


def _attend(embed: nn.Embed, hidden_BxTxE):
  """hidden . table over E, as nn.Embed.attend, without its explicit transpose of the table. XLA:CPU runs
  `h @ table.T` at one row as a transposing loop fusion: 26.3 ms against 21.5 ms for this dot at Qwen3-0.6B's
  vocabulary (1 x 1,024 by 151,936 x 1,024, float32, Intel AVX-512 host, 2026-11-27), the batch-1 decode step's
  largest op."""
  hidden_BxTxE, table_VxE = embed.promote_dtype(hidden_BxTxE, embed.embedding, dtype=embed.dtype)
  return projection_grad.low_precision_dot(hidden_BxTxE, table_VxE, (((hidden_BxTxE.ndim - 1,), (1,)), ((), ())))


def logits(params, config: DecoderConfig, tokens_BxT, positions_BxT=None, key_mask_BxS=None):
  """Full [B, T, V] logits in float32 (for parity tests and small batches)."""
  model = Decoder(config)
  hidden = model.apply({"params": params}, tokens_BxT, positions_BxT, key_mask_BxS=key_mask_BxS)
  return model.apply({"params": params}, hidden, method=Decoder.logits).astype(jnp.float32)


def token_logprobs(params, config: DecoderConfig, tokens_BxT, targets_BxT, positions_BxT=None, *,
                   key_mask_BxS=None, temperature: float = 1.0, with_entropy: bool = False, lora=None,
                   needed_BxT=None, prompt_groups: Optional[PromptGroups] = None):
  """log softmax(logits / temperature)[target] per position, float32 [B, T].

  The vocabulary projection runs through models/vocab_logprobs.token_logprobs: chunks of at most
  `config.logprob_chunk_tokens` tokens per row shard, each with a hand-written VJP (one log-normaliser kept
  per token, the logits recomputed in the backward unless `config.logprob_recompute` is False or the kept
  blocks fit in `config.logprob_keep_bytes`), so when recomputing one float32 [chunk tokens, V] block is alive
  per device however many rows the batch has. `needed_BxT`: the positions
  whose values are read (a loss's response mask); the others give 0 and cost no projection (unless
  `config.logprob_skip_unread` is False: then they are projected and still give 0). With
  `with_entropy`, also returns the per-position entropy. `lora`: adapters applied inside the layers (see
  Projection), B pre-scaled; None for the plain model. `prompt_groups`: the rows are groups packed by
  models/prompt_groups.pack (their key mask given), each prompt run once.
  """
  model = Decoder(config, prompt_groups)
  variables = {"params": params} if lora is None else {"params": params, "lora": lora}
  hidden_BxTxE = model.apply(variables, tokens_BxT, positions_BxT, key_mask_BxS=key_mask_BxS)
  # Only the weights the projection reads go through the chunks' custom VJP (their gradient is summed over chunks).
  vocab_params = {k: params[k] for k in (("embed",) if config.tie_word_embeddings else ("lm_head",))}
  out = vocab_logprobs.token_logprobs(
      functools.partial(_project_vocab, config), vocab_params, hidden_BxTxE, targets_BxT,
      needed_BxT if config.logprob_skip_unread else None,
      chunk_tokens=config.logprob_chunk_tokens, temperature=temperature, with_entropy=with_entropy,
      recompute=config.logprob_recompute, tail_levels=config.logprob_tail_levels,
      keep_bytes=config.logprob_keep_bytes)
  if needed_BxT is None or config.logprob_skip_unread:
    return out
  return jax.tree.map(lambda x_BxT: jnp.where(needed_BxT, x_BxT, 0.0), out)  # projected, but unread: 0 as skipped


def _project_vocab(config: DecoderConfig, vocab_params, hidden_BxTxE):
  """Logits from the final hidden states, given only the vocabulary projection's weights."""
  return Decoder(config).apply({"params": vocab_params}, hidden_BxTxE, method=Decoder.logits)


def init_params(config: DecoderConfig, rng) -> Any:
  """Boxed (nn.Partitioned) params; use parallel.init_sharded to get them born sharded."""
  def forward_and_project(module, tokens_BxT):
    return module.logits(module(tokens_BxT))
  tokens = jnp.zeros((1, 1), jnp.int32)
  return Decoder(config).init(rng, tokens, method=forward_and_project)["params"]


def param_logical_axes(config: DecoderConfig):
  """Pytree of logical-axis PartitionSpecs matching the params tree."""
  abstract = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
  return nn.get_partition_spec(abstract)
