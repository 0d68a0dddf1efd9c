"""The study's decisions before its main cells, each a rule stated in advance: the pilot (does the task
learn?), the headroom of every primary arm (else the primary metric is the area under the curve), and the
choice of each loss's setting (area under the validation curve).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

PILOT_GAIN = 0.15  # validation pass@1 at mid-run must exceed the warm start's by this much ...
PILOT_CEILING = 0.95  # ... and stay below this (not saturated: a claim needs room above and below)
HEADROOM = 0.9  # every primary arm's validation pass@1 at mid-run below this, else the primary metric is the AUC
PRIMARY_METRICS = {"final": "test pass@1 of the final policy (every primary arm had headroom at mid-run)",
                   "auc": f"the area under the validation pass@1 curve (an arm reached {HEADROOM} by mid-run: a final "
                          "pass@1 at the ceiling cannot separate methods)"}

# OAPL's beta2 grid by strength: beta2's share of the residual (beta2 x |log pi - log pi_sampler| over the
# advantage's spread, the pilot's mean over steps with a reward signal) at three targets a decade apart
STRENGTH_TARGETS = (0.03, 0.3, 3.0)  # negligible, balanced, dominant
PAPER_BETA2 = 1e-3  # added to the grid where its predicted share is at least the negligible target

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


def mean_auc_by_setting(runs) -> dict:
  """(cell, its result or None) pairs of a loss's tuning cells -> setting: its validation AUC, the mean over the
  tuning seeds (None until every seed's run finished)."""
  aucs: dict = {}
  for cell, result in runs:
    aucs.setdefault(cell.setting, []).append(auc(result.curve()) if result is not None else None)
  return {s: None if None in v else sum(v) / len(v) for s, v in aucs.items()}


def choose(scores: Mapping):
  """The setting ((lr, knob) or lr) with the largest AUC; ties go to the smaller setting (the smaller lr first)."""
  if not scores:
    raise ValueError("choose: no tuning point finished")
  return min(scores, key=lambda setting: (-scores[setting], setting))


@dataclasses.dataclass(frozen=True)
class Strength:
  share: float  # measured in the pilot at `beta2`
  beta2: float
  values: tuple[float, ...]  # the grid: one beta2 per target (two significant digits), the paper's where it counts
  paper_share: float  # the share predicted for the paper's beta2

  @property
  def message(self) -> str:
    said = "in the grid" if PAPER_BETA2 in self.values else f"below the negligible {STRENGTH_TARGETS[0]}: left out"
    return (f"beta2 by strength: the pilot's share {self.share:.3g} at beta2 {self.beta2:g}; targets "
            f"{', '.join(f'{t:g}' for t in STRENGTH_TARGETS)} -> beta2 {', '.join(f'{v:g}' for v in self.values)} "
            f"(the paper's {PAPER_BETA2:g}: predicted share {self.paper_share:.2g}, {said})")


def beta2_by_strength(share: float, beta2: float) -> Strength:
  """OAPL's beta2 grid from the share measured at `beta2`, taking the share as proportional to beta2 (a stronger
  beta2 also shrinks the log-ratio it multiplies, so the realised shares spread less than the targets: the
  report shows the measured ones)."""
  if not (share > 0 and math.isfinite(share)):
    raise ValueError(f"beta2 by strength needs a positive measured share, got {share} (did the pilot's OAPL run "
                     "have any step with a reward signal?)")
  values = [float(f"{beta2 * target / share:.2g}") for target in STRENGTH_TARGETS]
  paper_share = share * PAPER_BETA2 / beta2
  if paper_share >= STRENGTH_TARGETS[0] and PAPER_BETA2 not in values:
    values.append(PAPER_BETA2)
  return Strength(share, beta2, tuple(sorted(values)), paper_share)


MAX_EXTENSIONS = 3  # a winner still at an edge after this many extensions is reported as such


def _next_lr(lr: float, direction: int) -> float:
  """The learning-rate grid's own 1-3-10 series continued one step down (-1) or up (+1): 3e-5 -> 1e-5, 3e-4 -> 1e-3."""
  return float(f"{10 ** (round(2 * math.log10(lr)) / 2 + direction / 2):.0g}")


def extension(scores: Mapping[tuple[float, float], float], decade_knob: bool = False) -> list:
  """The points the winner (tuning.choose) adds when it sits at an edge (the rule fixed before the runs): on each
  axis where it is the smallest or largest value and beats its neighbour on that axis (a tie says the axis does
  not matter there: GRPO's clip on policy), the next value past it (lr: the 1-3-10 series; the knob: /2 or x2, or
  /10 or x10 for a grid spaced by decades, OAPL's beta2 by strength), crossed with every value of the other axis."""
  winner = choose(scores)
  lrs, knobs = sorted({lr for lr, _ in scores}), sorted({k for _, k in scores})
  factor = 10.0 if decade_knob else 2.0
  added = []
  for axis, values in ((0, lrs), (1, knobs)):
    side = edge(values, winner[axis])
    if not side:
      continue
    inner = values[1] if side == "low" else values[-2]
    neighbour = (inner, winner[1]) if axis == 0 else (winner[0], inner)
    if neighbour in scores and scores[neighbour] >= scores[winner]:
      continue
    if axis == 0:
      lr = _next_lr(winner[0], -1 if side == "low" else 1)
      added += [(lr, k) for k in knobs]
    else:
      knob = float(f"{winner[1] / factor if side == 'low' else winner[1] * factor:.3g}")
      added += [(lr, knob) for lr in lrs]
  return [p for p in dict.fromkeys(added) if p not in scores]


def edge(grid: Sequence[float], winner: float) -> str | None:
  """'low' / 'high' when the winner is the grid's smallest / largest point (a grid of one has no edge)."""
  if len(grid) < 2:
    return None
  return "low" if winner == min(grid) else "high" if winner == max(grid) else None


@dataclasses.dataclass(frozen=True)
class Pilot:
  ok: bool
  step: int  # the mid-run grid step read
  start: float  # validation pass@1 at step 0 (the warm start, same eval)
  mid: float
  message: str


def pilot_verdict(curve: Curve, total_steps: int, gain: float = PILOT_GAIN,
                  ceiling: float | None = PILOT_CEILING) -> Pilot:
  """Does the task learn? The curve's value at the grid step nearest S/2 (the earlier on a tie) against its
  step-0 value: ok iff mid >= start + gain and mid < ceiling (None: no ceiling; the headroom rule handles it)."""
  if not curve or curve[0][0] != 0:
    return Pilot(False, -1, float("nan"), float("nan"), "the pilot has no validation curve from step 0")
  step, mid = min(curve, key=lambda sv: (abs(sv[0] - total_steps / 2), sv[0]))
  start = curve[0][1]
  rule = f"(rule: pass@1 at mid-run >= warm start + {gain:.2f}" + (f" and < {ceiling:.2f})" if ceiling else ")")
  if ceiling is not None and mid >= ceiling:
    return Pilot(False, step, start, mid, f"the task saturates: validation pass@1 {mid:.3f} at step {step} (warm "
                 f"start {start:.3f}) {rule}; make it harder (raise task.base.teacher_slip_rate) or give each step "
                 f"less data (lower loop.batch_prompts), not the losses")
  if mid < start + gain:
    return Pilot(False, step, start, mid, f"the task does not learn enough: validation pass@1 {start:.3f} -> {mid:.3f} "
                 f"at step {step} {rule}; make it easier (lower the slip rate) or give each step more data (raise "
                 f"loop.batch_prompts), not the losses")
  return Pilot(True, step, start, mid, f"the task learns: validation pass@1 {start:.3f} -> {mid:.3f} at step {step} "
               f"{rule}")


@dataclasses.dataclass(frozen=True)
class Headroom:
  ok: bool
  step: int  # the mid-run grid step read
  mid: float  # validation pass@1 there
  message: str


def headroom(curve: Curve, total_steps: int, ceiling: float = HEADROOM) -> Headroom:
  """Is this arm off the ceiling? Its validation pass@1 at the grid step nearest S/2 (the earlier on a tie)
  must be below `ceiling`: a final pass@1 at a ceiling cannot separate methods."""
  if not curve:
    return Headroom(False, -1, float("nan"), "no validation curve")
  step, mid = min(curve, key=lambda sv: (abs(sv[0] - total_steps / 2), sv[0]))
  if mid >= ceiling:
    return Headroom(False, step, mid, f"at the ceiling: validation pass@1 {mid:.3f} at step {step} (rule: < "
                    f"{ceiling} at mid-run)")
  return Headroom(True, step, mid, f"headroom: validation pass@1 {mid:.3f} at step {step} (rule: < {ceiling} at "
                  "mid-run)")
