"""Qwen's `models.api.CausalLM`: the functions of models/qwen.py bound to one QwenConfig.

    model = QwenLM(QwenConfig.tiny())   # normally api.for_config(config)
"""
import jax

from oapl_jax.models import qwen
from oapl_jax.models.config import QwenConfig

Cache = qwen.Cache
Rotary = qwen.Rotary


class QwenLM:
  """models.api.CausalLM for one QwenConfig (models/qwen.py's functions, bound to it)."""

  def __init__(self, config: QwenConfig):
    self.config = config

  def __repr__(self):
    return f"QwenLM({self.config})"

  def init_params(self, rng):
    return qwen.init_params(self.config, rng)

  def param_logical_axes(self):
    return qwen.param_logical_axes(self.config)

  def with_execution(self, **changes) -> "QwenLM":
    return QwenLM(self.config.replace(**changes))

  def same_architecture(self, other) -> bool:
    return isinstance(other, QwenLM) and self.config.architecture == other.config.architecture

  def lora_inputs(self) -> dict[str, tuple[str, ...]]:
    return {**{name: ("embed",) for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
            "o_proj": ("q_heads", "head_dim"), "down_proj": ("mlp",)}

  def token_logprobs(self, params, tokens_BxT, targets_BxT, positions_BxT=None, *, temperature: float = 1.0,
                     with_entropy: bool = False, lora=None, needed_BxT=None):
    return qwen.token_logprobs(params, self.config, tokens_BxT, targets_BxT, positions_BxT,
                               temperature=temperature, with_entropy=with_entropy, lora=lora, needed_BxT=needed_BxT)

  decode_params = staticmethod(qwen.unstack_layers)
  is_decode_layout = staticmethod(qwen.is_per_layer)

  def decode_logical_axes(self):
    return qwen.unstacked_logical_axes(self.config)

  def init_cache(self, batch: int, max_len: int) -> Cache:
    return qwen.init_cache(self.config, batch, max_len)

  def cache_logical_axes(self) -> Cache:
    return tuple(qwen.KVCache(*(jax.sharding.PartitionSpec(*axes) for axes in qwen.CACHE_LOGICAL_AXES))
                 for _ in range(self.config.num_layers))

  cache_length = staticmethod(qwen.cache_length)
  grow_cache = staticmethod(qwen.grow_cache)
  copy_cache_rows = staticmethod(qwen.copy_cache_rows)

  def decode_constants(self, cache_len: int) -> Rotary:
    return qwen.rotary_table(self.config, cache_len)

  def forward_with_cache(self, params, tokens_BxT, positions_BxT, cache: Cache, constants=None):
    return qwen.forward_with_cache(params, self.config, tokens_BxT, positions_BxT, cache, constants)

  def logits(self, params, hidden_BxE):
    return qwen.Qwen(self.config).apply({"params": params}, hidden_BxE, method=qwen.Qwen.logits)
