"""The study's decisions before its main cells, each a rule stated in advance: the pilot (does the task
learn?), the learning-rate choice (area under the validation curve, an edge winner extends the grid), and
task B's check (the warm start never succeeds on the hard half).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

PILOT_GAIN = 0.15  # validation pass@1 at mid-run must exceed the warm start's by this much ...
PILOT_CEILING = 0.95  # ... and stay below this (not saturated: a claim needs room above and below)
HARD_TAIL_MAX = 0.5  # task B: the warm start's hard-half test pass@k_max at most this (at least half the hard
#                     problems never solved in all k_max samples: the warm start never succeeds on part of them)
EASY_MIN = 0.05  # ... and its easy-half test pass@1 at least this (the easy half gives RL a signal)

Curve = Sequence[tuple[int, float]]  # (trainer step, value), steps ascending


def auc(curve: Curve) -> float:
  """The trapezoid area under the curve over its step span, divided by that span: the curve's mean level
  over training (a fast riser scores above a slow one that ends at the same value)."""
  steps = np.asarray([s for s, _ in curve], np.float64)
  values = np.asarray([v for _, v in curve], np.float64)
  if len(steps) < 2 or steps[-1] <= steps[0]:
    raise ValueError(f"auc needs at least two distinct steps, got {list(curve)}")
  area = float(np.sum((values[1:] + values[:-1]) / 2 * np.diff(steps)))
  return area / float(steps[-1] - steps[0])


def choose(scores: Mapping[float, float]) -> float:
  """The learning rate with the largest AUC; ties go to the smaller learning rate."""
  if not scores:
    raise ValueError("choose: no tuning point finished")
  return min(scores, key=lambda lr: (-scores[lr], lr))


def edge(grid: Sequence[float], winner: float) -> str | None:
  """'low' / 'high' when the winner is the grid's smallest / largest point (a grid of one has no edge)."""
  if len(grid) < 2:
    return None
  return "low" if winner == min(grid) else "high" if winner == max(grid) else None


def extension(grids_winners: Mapping[str, tuple[Sequence[float], float]],
              points: Mapping[str, float]) -> list[float]:
  """The points every loss gets added when any loss's winner sits at an edge of its grid: one beyond each
  edge some winner touched (`points`: 'low' / 'high' -> lr), for every loss alike. One round only."""
  touched = {edge(grid, winner) for grid, winner in grids_winners.values()} - {None}
  return sorted(points[side] for side in touched)


@dataclasses.dataclass(frozen=True)
class Pilot:
  ok: bool
  step: int  # the mid-run grid step read
  start: float  # validation pass@1 at step 0 (the warm start, same eval)
  mid: float
  message: str


def pilot_verdict(curve: Curve, total_steps: int, gain: float = PILOT_GAIN, ceiling: float = PILOT_CEILING) -> Pilot:
  """Does the task learn? The curve's value at the grid step nearest S/2 (the earlier on a tie) against its
  step-0 value: ok iff mid >= start + gain and mid < ceiling."""
  if not curve or curve[0][0] != 0:
    return Pilot(False, -1, float("nan"), float("nan"), "the pilot has no validation curve from step 0")
  step, mid = min(curve, key=lambda sv: (abs(sv[0] - total_steps / 2), sv[0]))
  start = curve[0][1]
  rule = f"(rule: pass@1 at mid-run >= warm start + {gain:.2f} and < {ceiling:.2f})"
  if mid >= ceiling:
    return Pilot(False, step, start, mid, f"the task saturates: validation pass@1 {mid:.3f} at step {step} (warm "
                 f"start {start:.3f}) {rule}; make it harder (raise task.base.teacher_slip_rate) or give each step "
                 f"less data (lower loop.batch_prompts), not the losses")
  if mid < start + gain:
    return Pilot(False, step, start, mid, f"the task does not learn enough: validation pass@1 {start:.3f} -> {mid:.3f} "
                 f"at step {step} {rule}; make it easier (lower the slip rate) or give each step more data (raise "
                 f"loop.batch_prompts), not the losses")
  return Pilot(True, step, start, mid, f"the task learns: validation pass@1 {start:.3f} -> {mid:.3f} at step {step} "
               f"{rule}")


def hard_tail_verdict(warm_eval: Mapping[str, Mapping[str, float]]) -> tuple[bool, str]:
  """Task B's warm start ({'test_easy': metrics, 'test_hard': metrics}): never succeeds on a part of the hard
  half (pass@k_max at most HARD_TAIL_MAX), does succeed on the easy half (pass@1 at least EASY_MIN)."""
  kmax = max(int(k[5:]) for k in warm_eval["test_hard"] if k.startswith("pass@"))
  hard, hard1 = warm_eval["test_hard"][f"pass@{kmax}"], warm_eval["test_hard"]["pass@1"]
  easy = warm_eval["test_easy"]["pass@1"]
  rule = f"(rule: hard-half test pass@{kmax} <= {HARD_TAIL_MAX} and easy-half pass@1 >= {EASY_MIN})"
  numbers = f"hard half pass@1 {hard1:.3f}, pass@{kmax} {hard:.3f}; easy half pass@1 {easy:.3f}"
  if hard > HARD_TAIL_MAX or easy < EASY_MIN:
    return False, (f"task B's warm start does not give a hard tail: {numbers} {rule}; lengthen the warm start "
                   f"(warmstart.steps) or change task.hard_slip_rate; task B's cells are skipped")
  return True, f"task B's warm start gives a hard tail: {numbers} {rule}"
