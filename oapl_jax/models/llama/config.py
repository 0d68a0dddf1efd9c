"""Typed Llama 3 config with named presets; the network is models/decoder.py (no q/k norm, no biases) with the
llama3 rotary frequency scaling below (Llama 3.1 / 3.2)."""
import dataclasses
import math
from typing import Optional

import jax.numpy as jnp

from oapl_jax.models.decoder_config import DecoderConfig


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
  """HF rope_type "llama3": wavelengths longer than original_max_position_embeddings / low_freq_factor are
  stretched by `factor`, shorter than original / high_freq_factor kept, and those between interpolated."""
  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int

  def __post_init__(self):
    if not self.factor > 0 or not self.high_freq_factor > self.low_freq_factor > 0:
      raise ValueError(f"llama3 rope scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0: {self}")
    if self.original_max_position_embeddings < 1:
      raise ValueError(f"original_max_position_embeddings={self.original_max_position_embeddings} must be >= 1")

  def rescale(self, inv_freq):
    """The llama3 frequencies from the plain ones (float32 [head_dim / 2]), in HF's order of operations."""
    old_len, low, high = self.original_max_position_embeddings, self.low_freq_factor, self.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > old_len / low, inv_freq / self.factor, inv_freq)  # long waves: stretched
    smooth = (old_len / wavelen - low) / (high - low)  # 0 at the long end of the middle band, 1 at the short end
    smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return jnp.where(medium, smoothed, scaled)

  def as_hf(self) -> dict:
    return {"rope_type": "llama3", **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class LlamaConfig(DecoderConfig):
  """One dense Llama 3 decoder: its architecture, and how it runs (`execution`). GQA, SwiGLU, RMSNorm, no q/k
  norm and no biases; rope_scaling None is plain rotary (Llama 3.0), else the llama3 scaling (3.1 and later)."""

  rope_theta: float = 500_000.0
  rms_norm_eps: float = 1e-5
  max_position_embeddings: int = 131072
  rope_scaling: Optional[Llama3RopeScaling] = None

  def __post_init__(self):
    super().__post_init__()
    if isinstance(self.rope_scaling, dict):  # from a run's model.overrides
      object.__setattr__(self, "rope_scaling", Llama3RopeScaling(**self.rope_scaling))

  @property
  def model_type(self) -> str:
    return "llama"

  def rope_inv_freq(self):
    inv_freq = super().rope_inv_freq()
    return inv_freq if self.rope_scaling is None else self.rope_scaling.rescale(inv_freq)

  # ---- presets: the published architectures (weights come from a checkpoint directory) ----
  @classmethod
  def llama3_2_1b(cls):
    return cls(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
               num_kv_heads=8, head_dim=64, tie_word_embeddings=True,
               rope_scaling=Llama3RopeScaling(32.0, 1.0, 4.0, 8192))

  @classmethod
  def llama3_1_8b(cls):
    return cls(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
               num_kv_heads=8, head_dim=128, tie_word_embeddings=False,
               rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 8192))

  @classmethod
  def tiny(cls, **kw):
    """A few-hundred-kB Llama 3 model for tests, with the llama3 scaling (its 64-position original context
    puts head_dim 16's frequencies in all three bands)."""
    return cls.build(**{**dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                                num_kv_heads=2, head_dim=16, rope_theta=10_000.0, max_position_embeddings=512,
                                rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 64)), **kw})


# The registry's presets (models/families.py).
LLAMA_PRESETS = {"llama_tiny": LlamaConfig.tiny, "llama3_2_1b": LlamaConfig.llama3_2_1b,
                 "llama3_1_8b": LlamaConfig.llama3_1_8b}
