"""Run health, read from each step's metrics on the host: skipped updates, divergence, collapse.

  skipped updates   the train step refuses a non-finite loss, gradient or update (trainer.py); a run
                    of `max_skipped_updates` in a row stops the run (DivergenceError).
  loss explosion    a loss whose magnitude is `loss_explosion_factor` times the median magnitude of the
                    recent nonzero ones (warning). Magnitudes, so a signed loss around 0 (GRPO's) is judged
                    by its scale, not its sign; zeros and rounding noise (steps with no signal) carry no scale.
  entropy collapse  mean token entropy below `entropy_floor`: a (nearly) deterministic policy (warning).
  no signal         every group had equal rewards (zero advantage everywhere) for
                    `no_signal_steps` steps in a row: the run trains on nothing (warning).
  reward failures   a reward that raises, times out or is not a finite number scores 0 and is counted
                    (tasks/rewards.Guarded); the rollout worker warns, and stops the run when more than
                    `max_reward_failure_fraction` of a chunk failed (check_reward_failures); the run's
                    summary gives their total (`reward_failures`, rl/loop.py).
  cut off           more than `max_truncated_fraction` of a chunk's responses hit sampler.max_new_tokens
                    (a cut-off answer usually scores 0): the rollout worker warns once per window, naming
                    the field to raise (RolloutChecks).
  zero reward       every reward of a whole window was 0: nothing to learn from (warning, per window).
  not checked       a run shorter than `no_signal_steps` never had the no-signal check: the summary says so
                    (run_notes, with the run's mean cut-off fraction when it is over the threshold).

Warnings go to the console once per kind and window, and to the summary with their counts.
"""
import collections
import dataclasses
import logging
import math
from typing import Mapping, Optional

import numpy as np

from oapl_jax import sections


# Loss magnitudes at or under this carry no scale, like zeros: a window's first steps on groups with (nearly) equal
# rewards give losses of 1e-14 to 1e-7, rounding noise, and a median of those would call any real loss an explosion.
LOSS_NOISE_FLOOR = 1e-6


class DivergenceError(FloatingPointError):
  """The run stopped because its updates kept diverging."""


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
  """The `monitors` section: run health read from each step's metrics (the module docstring says more)."""
  max_skipped_updates: int = sections.rule(3, low=1)  # non-finite updates in a row that stop the run
  loss_explosion_factor: float = sections.rule(1e4, low=1, low_open=True)  # x the recent median |loss|: a warning
  entropy_floor: float = sections.rule(1e-3, low=0)  # mean token entropy under it: a collapse warning
  no_signal_steps: int = sections.rule(20, low=1)  # steps in a row with equal rewards in every group: a warning
  max_reward_failure_fraction: float = sections.rule(0.5, low=0, high=1)  # of a chunk's rewards: more stops the run
  max_truncated_fraction: float = sections.rule(0.5, low=0, high=1)  # of a chunk's responses cut at the token
  # budget: more is a warning naming sampler.max_new_tokens

  def __post_init__(self):
    sections.enforce(self)


def check_reward_failures(num_failed: int, num_items: int, config: MonitorConfig, where: str) -> None:
  """Warn about failed rewards; raise when too many of them failed for the rewards to mean anything."""
  if not num_failed:
    return
  fraction = num_failed / max(num_items, 1)
  if fraction > config.max_reward_failure_fraction:
    raise RuntimeError(f"{where}: {num_failed} of {num_items} rewards failed (raised, timed out or were not finite "
                       f"numbers), more than monitors.max_reward_failure_fraction={config.max_reward_failure_fraction}"
                       "; the reward function is broken for this data (see the warnings above)")
  logging.warning("health: %s: %d of %d rewards failed and scored 0", where, num_failed, num_items)


class RolloutChecks:
  """The rollout worker's early warnings: most responses cut off at the token budget, a window of zero rewards."""

  def __init__(self, config: MonitorConfig, max_new_tokens: int):
    self.config, self.max_new_tokens = config, max_new_tokens
    self._warned: set[tuple[str, int]] = set()
    self._window, self._any_reward = -1, False

  def chunk(self, window: int, chunk: int, truncated_fraction: float, rewards) -> None:
    if window != self._window:
      self._window, self._any_reward = window, False
    self._any_reward |= bool(np.any(np.asarray(rewards) != 0))
    if truncated_fraction > self.config.max_truncated_fraction and ("cut", window) not in self._warned:
      self._warned.add(("cut", window))
      logging.warning("health: window %d, chunk %d: %.0f%% of the responses hit the token budget (sampler."
                      "max_new_tokens=%d) and were cut off, which usually scores 0; raise it (--config.sampler."
                      "max_new_tokens=N, and eval.max_new_tokens for the evals)", window, chunk,
                      100 * truncated_fraction, self.max_new_tokens)

  def window_end(self, window: int) -> None:
    if window == self._window and not self._any_reward and ("zero", window) not in self._warned:
      self._warned.add(("zero", window))
      logging.warning("health: every reward of window %d was 0: the run has nothing to learn from (check the "
                      "reward on a few responses: oapl-eval --show N, the token budget, the prompt format)", window)


def run_notes(history: list[dict], trainer_steps: int, config: MonitorConfig) -> dict[str, str]:
  """The summary's notes on checks a run could not make or that stayed true all run, from its metrics."""
  notes = {}
  if trainer_steps < config.no_signal_steps:
    notes["health/not checked"] = (f"no_signal: the run's {trainer_steps} trainer steps are fewer than monitors."
                                   f"no_signal_steps={config.no_signal_steps}, so a run with no reward signal would "
                                   "not have been told")
  cut = [h["rollout/truncated_fraction"] for h in history if "rollout/truncated_fraction" in h]
  if cut and sum(cut) / len(cut) > config.max_truncated_fraction:
    notes["health/cut off"] = (f"{100 * sum(cut) / len(cut):.0f}% of the rollouts hit sampler.max_new_tokens "
                               "on average: raise it")
  rewards = [h["rollout/reward_mean"] for h in history if "rollout/reward_mean" in h]
  if rewards and not any(rewards):
    notes["health/zero reward"] = "every training reward was 0: the run learned from nothing"
  return notes


class HealthMonitor:

  def __init__(self, config: MonitorConfig):
    self.config = config
    self.counts: collections.Counter = collections.Counter()
    self._skipped_in_a_row = 0
    self._no_signal_in_a_row = 0
    self._recent_magnitudes: collections.deque = collections.deque(maxlen=20)  # of nonzero finite losses
    self._warned_this_window: set[str] = set()

  @property
  def diverging(self) -> bool:
    """Whether the latest update was skipped (a checkpoint now could hold params that diverge)."""
    return self._skipped_in_a_row > 0

  def new_window(self) -> None:
    self._warned_this_window.clear()

  def observe(self, step: int, metrics: Mapping[str, float], last_good_checkpoint: Optional[int]) -> None:
    """Raises DivergenceError after too many skipped updates in a row; warns on the rest."""
    c, loss = self.config, float(metrics["loss"])
    if metrics.get("update_skipped", 0.0) > 0:
      self._skipped_in_a_row += 1
      self.counts["skipped_updates"] += 1
      self._warn("skipped", f"trainer step {step}: the loss became {loss} (or a gradient/update was not finite); "
                            f"the update was skipped ({self._skipped_in_a_row} in a row)")
      if self._skipped_in_a_row >= c.max_skipped_updates:
        where = (f"The last good checkpoint (step {last_good_checkpoint}) is kept" if last_good_checkpoint is not None
                 else "No checkpoint was saved yet")
        raise DivergenceError(
            f"the loss became {loss} at trainer step {step}, and {self._skipped_in_a_row} updates in a row were "
            f"not finite (monitors.max_skipped_updates={c.max_skipped_updates}); stopping. {where}; no checkpoint "
            f"holds a non-finite update. Try a larger beta2 or a lower learning rate.")
      return
    self._skipped_in_a_row = 0
    if len(self._recent_magnitudes) >= 5:
      median = sorted(self._recent_magnitudes)[len(self._recent_magnitudes) // 2]
      if abs(loss) > c.loss_explosion_factor * median:
        self._warn("loss_explosion", f"trainer step {step}: loss {loss:.3g} is over {c.loss_explosion_factor:g}x the "
                                     f"recent median magnitude {median:.3g}: the run may be diverging")
    if math.isfinite(loss) and abs(loss) > LOSS_NOISE_FLOOR:
      self._recent_magnitudes.append(abs(loss))
    if "entropy" in metrics and float(metrics["entropy"]) < c.entropy_floor:
      self._warn("entropy_collapse", f"trainer step {step}: token entropy {float(metrics['entropy']):.2e} is below "
                                     f"{c.entropy_floor:g}: the policy has (nearly) collapsed to one answer")
    if metrics.get("frac_groups_all_equal_reward", 0.0) >= 1.0:
      self._no_signal_in_a_row += 1
      if self._no_signal_in_a_row >= c.no_signal_steps:
        self._warn("no_signal", f"trainer step {step}: every group had equal rewards for {self._no_signal_in_a_row} "
                                f"steps in a row: zero advantage, nothing to learn from (check the reward and G)")
    else:
      self._no_signal_in_a_row = 0

  def _warn(self, kind: str, message: str) -> None:
    self.counts[kind] += 1
    if kind not in self._warned_this_window:
      self._warned_this_window.add(kind)
      logging.warning("health: %s", message)

  def summary(self) -> dict[str, int]:
    return {f"health/{kind}": n for kind, n in sorted(self.counts.items())}
