"""Typed Qwen config with named presets (Qwen2, Qwen2.5, Qwen3, R1-Distill); the network is models/decoder.py."""
import dataclasses

from oapl_jax.models.decoder_config import DecoderConfig


@dataclasses.dataclass(frozen=True)
class QwenConfig(DecoderConfig):
  """One dense Qwen decoder: its architecture, and how it runs (`execution`; its fields read as
  attributes too: config.dtype, config.attention). Qwen2/2.5: q/k/v bias, no q/k norm. Qwen3: q/k
  RMSNorm, no bias."""

  qkv_bias: bool = False
  qk_norm: bool = True

  @property
  def model_type(self) -> str:
    return "qwen3" if self.qk_norm else "qwen2"

  # ---- presets: the published architectures (weights come from a checkpoint directory) ----
  @classmethod
  def _qwen3(cls, hidden, inter, layers, heads, kv, tie, **kw):
    return cls(vocab_size=151936, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
               num_heads=heads, num_kv_heads=kv, head_dim=128, tie_word_embeddings=tie, **kw)

  @classmethod
  def qwen3_0p6b(cls):
    return cls._qwen3(1024, 3072, 28, 16, 8, True)

  @classmethod
  def qwen3_1p7b(cls):
    return cls._qwen3(2048, 6144, 28, 16, 8, True)

  @classmethod
  def qwen3_4b(cls):
    return cls._qwen3(2560, 9728, 36, 32, 8, True)

  @classmethod
  def qwen3_4b_thinking_2507(cls):
    return cls._qwen3(2560, 9728, 36, 32, 8, True, rope_theta=5_000_000.0, max_position_embeddings=262144)

  @classmethod
  def qwen3_8b(cls):
    return cls._qwen3(4096, 12288, 36, 32, 8, False)

  @classmethod
  def qwen3_14b(cls):
    return cls._qwen3(5120, 17408, 40, 40, 8, False)

  @classmethod
  def _qwen2(cls, hidden, inter, layers, heads, kv, tie, vocab=151936, **kw):
    kw.setdefault("max_position_embeddings", 32768)
    return cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
               num_heads=heads, num_kv_heads=kv, head_dim=hidden // heads, tie_word_embeddings=tie,
               qkv_bias=True, qk_norm=False, **kw)

  @classmethod
  def qwen2p5_0p5b(cls):
    return cls._qwen2(896, 4864, 24, 14, 2, True)

  @classmethod
  def qwen2p5_1p5b(cls):
    return cls._qwen2(1536, 8960, 28, 12, 2, True)

  @classmethod
  def qwen2p5_3b(cls):
    return cls._qwen2(2048, 11008, 36, 16, 2, True)

  @classmethod
  def qwen2p5_7b(cls):
    return cls._qwen2(3584, 18944, 28, 28, 4, False, vocab=152064)

  @classmethod
  def qwen2p5_14b(cls):
    return cls._qwen2(5120, 13824, 48, 40, 8, False, vocab=152064)

  @classmethod
  def deepseek_r1_distill_qwen_14b(cls):
    return cls._qwen2(5120, 13824, 48, 40, 8, False, vocab=152064, rms_norm_eps=1e-5,
                      max_position_embeddings=131072)

  @classmethod
  def tiny(cls, **kw):
    """A few-hundred-kB Qwen3-architecture model for tests and the CPU demo."""
    return cls.build(**{**dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                                num_kv_heads=2, head_dim=16, rope_theta=10_000.0, max_position_embeddings=512),
                        **kw})


# The registry's presets (models/families.py), by the model_type each one builds.
QWEN3_PRESETS = {name: getattr(QwenConfig, name) for name in (
    "qwen3_0p6b", "qwen3_1p7b", "qwen3_4b", "qwen3_4b_thinking_2507", "qwen3_8b", "qwen3_14b", "tiny")}
QWEN2_PRESETS = {name: getattr(QwenConfig, name) for name in (
    "qwen2p5_0p5b", "qwen2p5_1p5b", "qwen2p5_3b", "qwen2p5_7b", "qwen2p5_14b", "deepseek_r1_distill_qwen_14b")}
