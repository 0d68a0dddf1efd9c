"""How to sample: one typed value from config to results (rollouts, eval, the JetStream engine)."""
import dataclasses

from oapl_jax import sections

DTYPES = ("bfloat16", "float16", "float32")
BACKENDS = ("jax", "scripted")  # core.Sampler, scripted.ScriptedSampler


@dataclasses.dataclass(frozen=True)
class SamplingFields:
  """The sampling fields, written once: the runtime SamplingSettings and the config sections that sample (the
  `sampler` section here, `eval` in evaluation.py) all derive from it, and restate a field only where its
  default or range differs from these."""
  max_new_tokens: int = sections.rule(1024, low=1)  # a response's token budget
  temperature: float = sections.rule(1.0, low=0)  # 0 = greedy
  top_p: float = sections.rule(1.0, low=0, high=1, low_open=True)  # nucleus sampling's mass (1 = off)
  top_k: int = sections.rule(0, low=0)  # 0 = off
  steps_per_sync: int = sections.rule(16, low=1)  # decode steps the device runs per host visit
  grow_cache: bool = True  # attend over a KV cache that grows with the batch (faster decode, a compile per length)

  def __post_init__(self):
    sections.enforce(self)

  def sampling(self, stop_tokens=(), **changes) -> "SamplingSettings":
    """These fields as the runtime settings, with `stop_tokens` and any `changes`."""
    values = {f.name: getattr(self, f.name) for f in dataclasses.fields(SamplingFields)}
    return SamplingSettings(**{**values, **changes}, stop_tokens=stop_tokens)


@dataclasses.dataclass(frozen=True)
class SamplingSettings(SamplingFields):
  """How one batch is sampled; no default length (every caller states its budget)."""
  max_new_tokens: int = sections.rule(low=1)
  stop_tokens: tuple[int, ...] = ()  # a sample ends at the first of these (kept in the response)

  def __post_init__(self):
    object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))
    sections.enforce(self)

  def replace(self, **changes) -> "SamplingSettings":
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class SamplerConfig(SamplingFields):
  """The `sampler` section: the rollout sampler's slots, prompt bucket, dtype and sampling. Its temperature
  is also the trainer's (policy log-probs use logits / temperature), so it cannot be 0 (greedy)."""
  temperature: float = sections.rule(1.0, low=0, low_open=True)  # also the trainer's (no greedy)
  num_slots: int = sections.rule(64, low=1)  # sequences decoded at once (continuous batching)
  max_prefill_length: int = sections.rule(1024, low=1)  # the longest prompt in tokens (validation.on_oversized)
  # prompts per prefill call at most (0 = as many as the free slots take): one program per power of two up to it,
  # so rollouts, evals and the entropy probe share their prefill and insert programs, and a prefix holds that many rows
  max_prefill_batch: int = sections.rule(16, low=0)
  dtype: str = sections.rule("float32", choices=DTYPES)  # the snapshot's params and its compute
  backend: str = sections.rule("jax", choices=BACKENDS)  # sampler/api.py: 'scripted' decodes nothing (tests)
