"""What every dense decoder family's config has: the fields models/decoder.py reads, and how the model runs.

A family's config (models/qwen/config.py QwenConfig, models/llama/config.py LlamaConfig) subclasses
`DecoderConfig`, sets its own defaults and presets, and says how it differs from the plain decoder through:
  qkv_bias, qk_norm   bools (class attributes here; a family may make them fields)
  rope_inv_freq()     the rotary frequencies (Llama 3 rescales them)
  model_type          its Hugging Face model_type, the key of models/families.FAMILIES
"""
import dataclasses

import jax.numpy as jnp

from oapl_jax.models.execution import DTYPES, EXECUTION_FIELDS, Execution

_POSITIVE_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                  "head_dim", "max_position_embeddings")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """One dense decoder: its architecture, and how it runs (`execution`; its fields read as attributes too:
  config.dtype, config.attention)."""

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  max_position_embeddings: int = 40960
  execution: Execution = Execution()

  qkv_bias = False  # a bias on the q, k and v projections
  qk_norm = False  # RMSNorm over head_dim on q and k before rotary

  def __post_init__(self):
    for name in _POSITIVE_INTS:
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be an integer >= 1")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")

  def __getattr__(self, name):  # only called for names that are not fields: the execution's fields
    if name in EXECUTION_FIELDS and "execution" in self.__dict__:
      return getattr(self.__dict__["execution"], name)
    raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

  @property
  def model_type(self) -> str:
    """The Hugging Face model_type of this architecture (the key of models/families.FAMILIES)."""
    raise NotImplementedError(f"{type(self).__name__} names no model_type")

  @property
  def architecture(self):
    """This config with the default execution: equal for any two configs whose weights are interchangeable."""
    return dataclasses.replace(self, execution=Execution())

  @property
  def jnp_dtype(self):
    return DTYPES[self.dtype]

  @property
  def jnp_param_dtype(self):
    return DTYPES[self.param_dtype]

  def replace(self, **changes):
    """Architecture fields and execution fields alike (e.g. replace(num_layers=4, dtype="bfloat16"))."""
    run = {k: changes.pop(k) for k in list(changes) if k in EXECUTION_FIELDS}
    execution = dataclasses.replace(changes.pop("execution", self.execution), **run)
    return dataclasses.replace(self, **changes, execution=execution)

  @classmethod
  def build(cls, **fields):
    """The config from architecture and execution fields mixed (a tiny preset's overrides)."""
    run = {k: fields.pop(k) for k in list(fields) if k in EXECUTION_FIELDS}
    return cls(**fields).replace(**run)

  def rope_inv_freq(self):
    """The rotary frequencies theta^(-2i / head_dim), float32 [head_dim / 2]."""
    half = self.head_dim // 2
    return 1.0 / (self.rope_theta ** (jnp.arange(0, half, dtype=jnp.float32) * 2.0 / (2 * half)))
