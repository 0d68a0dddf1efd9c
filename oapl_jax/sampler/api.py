"""The sampler interface: everything `rl/`, eval, offline and the demo mixer may ask of a sampling backend (the
twin of models/api.CausalLM).

    sampler.refresh(trainer_params)                      # a new snapshot: version += 1
    sampler.refresh(saved_snapshot, version=7)           # a resume: the saved snapshot, at its own version
    groups = sampler.generate(prompts, 8, settings, seed=step)   # RolloutGroups of the current snapshot
    logp = sampler.score(sampler.params, prompts, responses, temperature=1.0)   # given responses, per token

A backend keeps its snapshot and its version inside: nothing outside sets `snapshot_version`. Two ship:
core.Sampler (ours: jitted prefill and decode on the sampler's mesh, behind JetStream's Engine in engine.py) and
scripted.ScriptedSampler (no decoding: fixed groups, for tests of the loop's contract). `sampler.backend` in a
run config picks one (run/assemble.build_sampler). A vLLM or SGLang-JAX backend would be a third subclass.
"""
import abc
import dataclasses
from typing import Any, Callable, Optional, Sequence

import numpy as np

from oapl_jax.sampler.settings import SamplingSettings

FINISH_NONE, FINISH_STOP, FINISH_LENGTH = 0, 1, 2
FINISH_NAMES = ("none", "stop", "length")


@dataclasses.dataclass
class RolloutGroups:
  """G sampled responses for each of P prompts (numpy arrays on host)."""

  prompt_tokens: np.ndarray  # [P, max prompt length] int32, right-padded with 0
  prompt_lengths: np.ndarray  # [P] int32
  response_tokens: np.ndarray  # [P, G, max_new_tokens] int32, 0 where masked
  response_mask: np.ndarray  # [P, G, max_new_tokens] bool; includes the stop token when one ended it
  sampler_logp: np.ndarray  # [P, G, max_new_tokens] float32, 0 where masked
  lengths: np.ndarray  # [P, G] int32, generated tokens (stop token included)
  finish_reason: np.ndarray  # [P, G] int8: FINISH_STOP or FINISH_LENGTH
  snapshot_version: int  # the sampler snapshot that produced every group (-1: unversioned params)
  seed: int
  settings: SamplingSettings
  wall_seconds: float = 0.0  # whole call, prefill + decode + host work
  num_tokens: int = 0  # generated tokens, summed
  num_decode_calls: int = 0  # host visits to the device decode loop
  num_prefill_calls: int = 0

  @classmethod
  def empty(cls, prompts: Sequence[Sequence[int]], group_size: int, settings: SamplingSettings, *,
            snapshot_version: int, seed: int) -> "RolloutGroups":
    P, G, N = len(prompts), group_size, settings.max_new_tokens
    out = cls(prompt_tokens=np.zeros((P, max(len(p) for p in prompts)), np.int32),
              prompt_lengths=np.array([len(p) for p in prompts], np.int32),
              response_tokens=np.zeros((P, G, N), np.int32), response_mask=np.zeros((P, G, N), bool),
              sampler_logp=np.zeros((P, G, N), np.float32), lengths=np.zeros((P, G), np.int32),
              finish_reason=np.zeros((P, G), np.int8), snapshot_version=snapshot_version, seed=int(seed),
              settings=settings)
    for i, p in enumerate(prompts):
      out.prompt_tokens[i, :len(p)] = p
    return out

  @property
  def tokens_per_second(self) -> float:
    return self.num_tokens / self.wall_seconds if self.wall_seconds > 0 else float("nan")

  @property
  def finish_reason_names(self) -> np.ndarray:
    return np.asarray(FINISH_NAMES)[self.finish_reason]

  @property
  def sequence_logp(self) -> np.ndarray:
    """[P, G] log pi_sampler(y | x): the sum over response tokens."""
    return self.sampler_logp.sum(axis=-1)


def check_request(prompts, group_size: int, settings: SamplingSettings, *, vocab_size: int,
                  max_prefill_length: int) -> None:
  """What every backend refuses before any work (the settings check themselves)."""
  if group_size < 1:
    raise ValueError(f"group_size must be >= 1, got {group_size}")
  if not len(prompts):
    raise ValueError("prompts is empty: nothing to generate")
  for i, p in enumerate(prompts):
    p = np.asarray(p)
    if p.ndim != 1 or p.size == 0:
      raise ValueError(f"prompt {i} is empty (or not a flat list of token ids): {p.tolist()}")
    if p.size > max_prefill_length:
      raise ValueError(f"prompt {i} has {p.size} tokens, more than max_prefill_length={max_prefill_length}")
    if not np.issubdtype(p.dtype, np.integer) or p.min() < 0 or p.max() >= vocab_size:
      bad = [t for t in p.tolist() if not (isinstance(t, (int, np.integer)) and 0 <= t < vocab_size)]
      raise ValueError(f"prompt {i} has token ids that are not integers in the vocabulary [0, {vocab_size}): "
                       f"{bad[:5]}")
  for t in settings.stop_tokens:
    if not 0 <= t < vocab_size:
      raise ValueError(f"stop token {t} is outside the vocabulary [0, {vocab_size})")


class Interrupted(Exception):
  """A generate call stopped early because the sampler's `interrupt` said so (a stop signal): what it had
  made is dropped, and the caller's resume makes it again."""


class GroupSampler(abc.ABC):
  """A sampling backend holding one frozen parameter snapshot and its version.

  Attributes every backend sets: `params` (the current snapshot, None before the first refresh),
  `snapshot_version`, `layout` (the sampler's devices), `max_prefill_length`, `max_new_tokens`,
  `last_refresh_seconds` and `last_refresh_bytes` (the last refresh's wall time and size).
  `interrupt`, set by the caller (the RL loop: a stop signal on one process), is asked between a generate
  call's pieces of work (core: each visit to the decode loop); True ends the call with Interrupted."""

  interrupt: Optional[Callable[[], bool]] = None
  params: Any
  snapshot_version: int
  layout: Any
  max_prefill_length: int
  max_new_tokens: int
  last_refresh_seconds: float
  last_refresh_bytes: int

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Token ids a prompt or a stop token may use: [0, vocab_size)."""

  @abc.abstractmethod
  def prepare(self, trainer_params) -> Any:
    """The trainer's params as a snapshot in this sampler's layout, not installed (e.g. a policy eval's copy)."""

  @abc.abstractmethod
  def refresh(self, trainer_params, *, version: Optional[int] = None) -> Any:
    """Install `prepare(trainer_params)` as the snapshot, at `version` (default: one more than the last).
    Params already in the sampler's layout (a saved snapshot) are installed as they are."""

  def load(self, path: str) -> Any:
    """Install a Hugging Face checkpoint as the snapshot (version += 1)."""
    raise NotImplementedError(f"{type(self).__name__} cannot load a checkpoint from disk ({path})")

  @abc.abstractmethod
  def generate(self, prompts: Sequence[Sequence[int]], group_size: int, settings: SamplingSettings, *,
               seed: int, prompt_ids: Optional[Sequence[int]] = None, params=None) -> RolloutGroups:
    """`group_size` responses per prompt with the sampler's own per-token log-probs. `params`: another snapshot
    (reported with snapshot_version -1); default the current one. Sample g of prompt p depends only on
    (seed, prompt_ids[p], g), never on what else is in the call (prompt_ids default 0..P-1)."""

  def check_interrupt(self) -> None:
    """Raises Interrupted where `interrupt` says to stop; a backend's generate calls it between its pieces."""
    if self.interrupt is not None and self.interrupt():
      raise Interrupted("a stop was asked for")

  @abc.abstractmethod
  def score(self, params, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
            temperature: float) -> list[np.ndarray]:
    """The snapshot's log-probs (float32, at `temperature`) of each given response token after its prompt."""
