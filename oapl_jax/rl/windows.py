"""What varies in Algorithm 1 around one fixed loop (rl/loop.py), each a value the assembler chooses.

Window policies: which params a window's sampler gets, and when a window ends before its L steps.
    FixedWindows      every window L steps, sampling from the params at its start (the paper's OAPL)
    DelayedWindows    sampling from the params at the previous window's start (loop.sampler_delay_windows = 1:
                      off-by-one asynchronous RL, the paper's GRPO baseline; a resumed run's first window
                      samples from its restored params)
    AdaptiveWindows   a window ends after the step that follows one whose drift from the sampler passed a
                      threshold (loop.refresh_drift; read one step late, so the trainer never waits)

Step hooks: work before a trainer step, given the step and the trainer's state.
    PolicyProbe       the trainer's current policy on the eval sets every eval.every_steps steps (rl/policy_eval)
    OldPolicyScorer   pi_old's per-token log-probs of each new chunk, with the params that start its round (GRPO)
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Protocol

import jax
import numpy as np

from oapl_jax import parallel, reporting
from oapl_jax.rl import policy_eval
from oapl_jax.rl.buffer import RolloutBuffer
from oapl_jax.rl.schedule import WindowSchedule
from oapl_jax.rl.trainer import Params, TrainState

PolicyParams = Callable[[TrainState], Params]
ScoreChunk = Callable[[Params, dict[str, np.ndarray]], np.ndarray]  # (params, chunk) -> per-token log-probs


class WindowPolicy(Protocol):
  lookahead: Optional[int]  # chunks the threaded sampler may run ahead of the trainer (None: freely)

  def sampler_params(self, params: Params) -> Params:
    """The params the window's sampler takes, given the trainer's at its start."""

  def ends_after(self, metrics: Mapping[str, float]) -> bool:
    """Whether the window ends after the step that follows the one with these (fetched) metrics."""

  def window_metrics(self, steps: int) -> dict[str, float]:
    """Scalars logged at a finished window's first step, given how many steps it took."""

  def planned_windows(self, num_syncs: int) -> Optional[int]:
    """How many windows the console line announces (None: not known in advance)."""

  def resumed_length(self, planned: int, steps_done: int, ended_last: bool) -> int:
    """The length of a window resumed after `steps_done` of its steps (saved inside it); `ended_last`: whether the
    last saved step asked the policy to end the window."""


class FixedWindows:
  lookahead: Optional[int] = None

  def sampler_params(self, params: Params) -> Params:
    return params

  def ends_after(self, metrics: Mapping[str, float]) -> bool:
    return False

  def window_metrics(self, steps: int) -> dict[str, float]:
    return {}

  def planned_windows(self, num_syncs: int) -> Optional[int]:
    return num_syncs

  def resumed_length(self, planned: int, steps_done: int, ended_last: bool) -> int:
    return planned


class DelayedWindows(FixedWindows):
  """Samples each window from a copy of the params at the previous window's start (a copy: the step donates
  the state)."""

  def __init__(self):
    self._previous: Optional[Params] = None

  def sampler_params(self, params: Params) -> Params:
    previous = params if self._previous is None else self._previous
    self._previous = parallel.reshard(params, jax.tree.map(lambda x: x.sharding, params))
    return previous


class AdaptiveWindows(FixedWindows):
  lookahead: Optional[int] = 1  # a window that may end early wastes at most one chunk

  def __init__(self, threshold: float, metric: str):
    self.threshold, self.metric = threshold, metric

  def ends_after(self, metrics: Mapping[str, float]) -> bool:
    return float(metrics[self.metric]) > self.threshold

  def window_metrics(self, steps: int) -> dict[str, float]:
    return {"sampler/window_steps": float(steps)}

  def planned_windows(self, num_syncs: int) -> Optional[int]:
    return None

  def resumed_length(self, planned: int, steps_done: int, ended_last: bool) -> int:
    return steps_done + 1 if ended_last else planned  # its last step was due one after the saved ones


def window_policy(refresh_drift: float, drift_metric: str, sampler_delay_windows: int) -> WindowPolicy:
  """The policy the loop section asks for (schedule.LoopConfig allows at most one of the two)."""
  if refresh_drift:
    return AdaptiveWindows(refresh_drift, drift_metric)
  return DelayedWindows() if sampler_delay_windows else FixedWindows()


class StepHook(Protocol):
  phase: str  # what its before_step's time is called in summary.md's 'Where the time went'

  def new_window(self) -> None:
    """A window begins (its buffer is empty)."""

  def probes(self, step: int) -> bool:
    """Whether before_step at `step` runs a probe whose time is no step's (the loop logs the step in flight
    first)."""

  def before_step(self, step: int, step_in_window: int, state: TrainState) -> None:
    """Work before trainer step `step`, once the chunks it may draw are being made."""

  def final(self, step: int, state: TrainState) -> Callable[[], None]:
    """Work on the trained policy before the final eval; returns what records it once that eval is done."""


class PolicyProbe:
  phase = "eval"

  def __init__(self, probe: policy_eval.PolicyEval, reporter: reporting.Reporter, policy_params: PolicyParams):
    self.probe, self.reporter, self.policy_params = probe, reporter, policy_params

  def new_window(self) -> None:
    pass

  def probes(self, step: int) -> bool:
    return self.probe.due(step)

  def before_step(self, step: int, step_in_window: int, state: TrainState) -> None:
    if self.probe.due(step):
      policy_eval.report(self.probe, self.reporter, step, self.policy_params(state))

  def final(self, step: int, state: TrainState) -> Callable[[], None]:
    metrics = self.probe(self.policy_params(state), step)

    def record() -> None:
      policy_eval.log(step, metrics)
      self.reporter.scalars(step, metrics)
    return record


class OldPolicyScorer:
  """For a loss that reads pi_old (GRPO's ratio): each chunk scored once, with the params as the step that first
  sees it starts, so the PPO clip acts on the later steps of that round."""
  phase = "old-policy scores"

  def __init__(self, score: ScoreChunk, buffer: RolloutBuffer, schedule: WindowSchedule,
               policy_params: PolicyParams):
    self.score, self.buffer, self.schedule, self.policy_params = score, buffer, schedule, policy_params
    self.scored = 0

  def new_window(self) -> None:
    self.scored = 0

  def probes(self, step: int) -> bool:
    return False

  def before_step(self, step: int, step_in_window: int, state: TrainState) -> None:
    params, visible = self.policy_params(state), self.schedule.chunks_visible(step_in_window)
    for index in range(self.scored, visible):
      chunk = self.buffer.chunk(index)
      if chunk is None:
        return  # closed: the trainer's sample will surface why
      inputs = {k: chunk[k] for k in ("tokens", "targets", "positions", "response_mask")}
      self.buffer.annotate(index, "old_policy_token_logp", np.asarray(self.score(params, inputs)))
      self.scored = index + 1

  def final(self, step: int, state: TrainState) -> Callable[[], None]:
    return lambda: None
