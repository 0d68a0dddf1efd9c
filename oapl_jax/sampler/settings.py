"""How to sample: one typed value from config to results (rollouts, eval, the JetStream engine)."""
import dataclasses

from oapl_jax import sections

DTYPES = ("bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  max_new_tokens: int = sections.rule(low=1)
  temperature: float = sections.rule(1.0, low=0)  # 0 = greedy
  top_p: float = sections.rule(1.0, low=0, high=1, low_open=True)
  top_k: int = sections.rule(0, low=0)  # 0 = off
  stop_tokens: tuple[int, ...] = ()  # a sample ends at the first of these (kept in the response)
  steps_per_sync: int = sections.rule(16, low=1)  # decode steps the device runs per host visit
  grow_cache: bool = True  # attend over a KV cache that grows with the batch (see rollout.py)

  def __post_init__(self):
    object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))
    sections.enforce(self)

  def replace(self, **changes) -> "SamplingSettings":
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """The `sampler` section: the rollout sampler's slots, prompt bucket, dtype and sampling. Its temperature
  is also the trainer's (policy log-probs use logits / temperature), so it cannot be 0 (greedy)."""
  num_slots: int = sections.rule(64, low=1)
  max_prefill_length: int = sections.rule(1024, low=1)
  max_new_tokens: int = sections.rule(1024, low=1)
  temperature: float = sections.rule(1.0, low=0, low_open=True)
  top_p: float = sections.rule(1.0, low=0, high=1, low_open=True)
  top_k: int = sections.rule(0, low=0)
  steps_per_sync: int = sections.rule(16, low=1)
  grow_cache: bool = True  # attend over a KV cache that grows with the batch (faster decode, a compile per length)
  dtype: str = sections.rule("float32", choices=DTYPES)

  def __post_init__(self):
    sections.enforce(self)

  def sampling(self, stop_tokens=()) -> SamplingSettings:
    return SamplingSettings(self.max_new_tokens, self.temperature, self.top_p, self.top_k, stop_tokens,
                            self.steps_per_sync, self.grow_cache)
