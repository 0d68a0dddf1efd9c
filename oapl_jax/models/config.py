"""Typed Qwen model config with named presets (Qwen2, Qwen2.5, Qwen3, R1-Distill)."""
import dataclasses

import jax.numpy as jnp

from oapl_jax import sections
from oapl_jax.models.attention import IMPLEMENTATIONS

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
REMAT_POLICIES = ("full", "offload_layer_input", "save_dots_no_batch")  # models/qwen.py remat_policy


@dataclasses.dataclass(frozen=True)
class Execution:
  """How a model runs, not what it is: two configs with equal architectures and different executions
  hold the same weights (a checkpoint trained with one kernel loads with another)."""
  param_dtype: str = sections.rule("float32", choices=tuple(_DTYPES))  # master weights
  dtype: str = sections.rule("float32", choices=tuple(_DTYPES))  # compute dtype
  remat: bool = False  # rematerialise each layer in the backward pass
  # What a rematerialised layer keeps for its backward (with remat only): "full" keeps its input (the scan stacks
  # it, [layers, B, T, E]) and recomputes the rest; "offload_layer_input" moves that stack to pinned host memory
  # (TPU/GPU; the transfers overlap the layers); "save_dots_no_batch" also keeps its weight matmuls' outputs.
  remat_policy: str = sections.rule("full", choices=REMAT_POLICIES)
  # the MLP runs over the positions in this many pieces, each rematerialised in its own backward: one piece's
  # [B, T / pieces, intermediate] temporaries alive instead of the whole [B, T, intermediate] (1: unchunked)
  mlp_chunks: int = sections.rule(1, low=1)
  # tokens (rows x positions) per row shard in one chunk of the vocabulary projection: one float32
  # [tokens, vocab] block is alive per device, forward or backward, however many rows a batch has
  logprob_chunk_tokens: int = sections.rule(512, low=1)
  # with a needed-positions mask (the trainer's response tokens), the needed tokens past the last whole chunk run
  # in up to this many smaller chunks (halves, quarters, ... of one) instead of a whole chunk: the projection's
  # excess over the needed tokens falls from up to a chunk to a chunk / 2^levels (0: whole chunks only)
  logprob_tail_levels: int = sections.rule(3, low=0)
  # False: the vocabulary projection's backward reuses the forward's logits instead of recomputing them (one
  # matmul of 2 x tokens x hidden x vocab FLOPs fewer per step, but float32 [tokens, vocab] kept for the whole
  # batch: for small batches on CPU or GPU with memory to spare, not the paper's 16K-token sequences)
  logprob_recompute: bool = True
  # Training and prefill attention kernel (models/attention.py): auto | splash | cudnn | blockwise | reference;
  # "auto" picks by the platform of the mesh being traced for (so a TPU compile check gets splash).
  attention: str = sections.rule("auto", choices=IMPLEMENTATIONS)
  attention_block_q: int = sections.rule(512, low=1)
  attention_block_kv: int = sections.rule(512, low=1)

  def __post_init__(self):
    sections.enforce(self)


EXECUTION_FIELDS = tuple(f.name for f in dataclasses.fields(Execution))


@dataclasses.dataclass(frozen=True)
class QwenConfig:
  """One dense Qwen decoder: its architecture, and how it runs (`execution`; its fields read as
  attributes too: config.dtype, config.attention). Qwen2/2.5: q/k/v bias, no q/k norm. Qwen3: q/k
  RMSNorm, no bias."""

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
  qkv_bias: bool = False
  qk_norm: bool = True
  max_position_embeddings: int = 40960
  execution: Execution = Execution()

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "max_position_embeddings"):
      if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool) or getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)!r} must be an integer >= 1")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")

  def __getattr__(self, name):  # only called for names that are not fields: the execution's fields
    if name in EXECUTION_FIELDS and "execution" in self.__dict__:
      return getattr(self.__dict__["execution"], name)
    raise AttributeError(f"QwenConfig has no attribute {name!r}")

  @property
  def architecture(self) -> "QwenConfig":
    """This config with the default execution: equal for any two configs whose weights are interchangeable."""
    return dataclasses.replace(self, execution=Execution())

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def jnp_param_dtype(self):
    return _DTYPES[self.param_dtype]

  @property
  def family(self) -> str:
    return "qwen3" if self.qk_norm else "qwen2"

  def replace(self, **changes) -> "QwenConfig":
    """Architecture fields and execution fields alike (e.g. replace(num_layers=4, dtype="bfloat16"))."""
    run = {k: changes.pop(k) for k in list(changes) if k in EXECUTION_FIELDS}
    execution = dataclasses.replace(changes.pop("execution", self.execution), **run)
    return dataclasses.replace(self, **changes, execution=execution)

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
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=16, rope_theta=10_000.0, max_position_embeddings=512)
    run = {k: kw.pop(k) for k in list(kw) if k in EXECUTION_FIELDS}
    base.update(kw)
    return cls(**base).replace(**run)


PRESETS = {
    name: getattr(QwenConfig, name)
    for name in ("qwen3_0p6b", "qwen3_1p7b", "qwen3_4b", "qwen3_4b_thinking_2507", "qwen3_8b",
                 "qwen3_14b", "qwen2p5_0p5b", "qwen2p5_1p5b", "qwen2p5_3b", "qwen2p5_7b",
                 "qwen2p5_14b", "deepseek_r1_distill_qwen_14b", "tiny")
}


def preset(name: str, **overrides) -> QwenConfig:
  if name not in PRESETS:
    raise ValueError(f"Unknown Qwen preset {name!r}; known: {sorted(PRESETS)}")
  return PRESETS[name]().replace(**overrides)
