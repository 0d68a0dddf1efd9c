"""The shared decoder's `models.api.CausalLM`: the functions of models/decoder.py and decoder_cached.py bound to one
family config (QwenConfig, LlamaConfig, ...: any models/decoder_config.DecoderConfig).

    model = DecoderLM(QwenConfig.tiny())   # normally api.for_config(config)
"""
import jax

from oapl_jax.models import decoder, decoder_cached
from oapl_jax.models.decoder_config import DecoderConfig

Cache = decoder.Cache
Rotary = decoder.Rotary


class DecoderLM:
  """models.api.CausalLM for one DecoderConfig (models/decoder.py's functions, bound to it)."""

  def __init__(self, config: DecoderConfig):
    self.config = config

  def __repr__(self):
    return f"DecoderLM({self.config})"

  def init_params(self, rng):
    return decoder.init_params(self.config, rng)

  def param_logical_axes(self):
    return decoder.param_logical_axes(self.config)

  def with_execution(self, **changes) -> "DecoderLM":
    return DecoderLM(self.config.replace(**changes))

  def same_architecture(self, other) -> bool:
    return isinstance(other, DecoderLM) and self.config.architecture == other.config.architecture

  def lora_inputs(self) -> dict[str, tuple[str, ...]]:
    return {**{name: ("embed",) for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
            "o_proj": ("q_heads", "head_dim"), "down_proj": ("mlp",)}

  def token_logprobs(self, params, tokens_BxT, targets_BxT, positions_BxT=None, *, temperature: float = 1.0,
                     with_entropy: bool = False, lora=None, needed_BxT=None, key_mask_BxT=None, prompt_groups=None):
    return decoder.token_logprobs(params, self.config, tokens_BxT, targets_BxT, positions_BxT,
                                  temperature=temperature, with_entropy=with_entropy, lora=lora,
                                  needed_BxT=needed_BxT, key_mask_BxS=key_mask_BxT, prompt_groups=prompt_groups)

  def decode_params(self, params):
    return decoder_cached.decode_layout(params, self.config)

  is_decode_layout = staticmethod(decoder_cached.is_per_layer)

  def decode_logical_axes(self):
    return decoder_cached.unstacked_logical_axes(self.config)

  def init_cache(self, batch: int, max_len: int) -> Cache:
    return decoder_cached.init_cache(self.config, batch, max_len)

  def cache_logical_axes(self) -> Cache:
    return tuple(decoder.KVCache(*(jax.sharding.PartitionSpec(*axes) for axes in decoder_cached.CACHE_LOGICAL_AXES))
                 for _ in range(self.config.num_layers))

  cache_length = staticmethod(decoder_cached.cache_length)
  grow_cache = staticmethod(decoder_cached.grow_cache)
  copy_cache_rows = staticmethod(decoder_cached.copy_cache_rows)

  def decode_constants(self, cache_len: int) -> Rotary:
    return decoder.rotary_table(self.config, cache_len)

  def forward_with_cache(self, params, tokens_BxT, positions_BxT, cache: Cache, constants=None):
    return decoder_cached.forward_with_cache(params, self.config, tokens_BxT, positions_BxT, cache, constants)

  def logits(self, params, hidden_BxE):
    return decoder_cached.decode_logits(params, self.config, hidden_BxE)
