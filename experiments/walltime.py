"""What the lag buys in wall time: a schedule model of the loop, fed by per-phase costs and learning curves.

Costs per trainer step: t_sample (the sampler generates and scores one step's chunk of B x G), t_train (one
update), t_refresh (a snapshot refresh). Assumptions, stated once:
  - one sampler and one trainer, each doing one thing at a time, on separate devices (no contention: on one
    shared CPU the two slow each other down, so a measured overlap there is below this model's);
  - synchronous: the sampler waits for the trainer every step (sample, then train; the classic on-policy loop);
  - lagged at L: after each refresh the sampler generates the window's L chunks back to back while the trainer
    takes each as soon as it is ready (Algorithm 1); the buffer is cleared at the refresh, so the trainer waits
    for the window's first chunk, and the sampler waits for the window's last update before it refreshes;
  - the learning curve per trainer step is the lag's own (measured); the schedule changes only the time axis.
Window time at lag L: t_refresh + min(t_s, t_t) + L * max(t_s, t_t) (the later of the two streams sets the pace,
the other's first or last item is not hidden); synchronous: L * (t_s + t_t) + t_refresh.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Costs:
  sample: float  # seconds per step's chunk
  train: float  # seconds per update
  refresh: float = 0.0  # seconds per snapshot refresh
  label: str = ""


def window_seconds(c: Costs, lag: int, overlapped: bool = True) -> float:
  if overlapped:
    return c.refresh + min(c.sample, c.train) + lag * max(c.sample, c.train)
  return c.refresh + lag * (c.sample + c.train)


def simulate_window(c: Costs, lag: int) -> tuple[float, float, float]:
  """(window seconds, trainer idle seconds, sampler idle seconds), event by event: chunk i is ready at
  refresh + i * t_s; update i starts when its chunk is ready and update i - 1 is done. The closed form above
  must equal it (a test checks)."""
  ready = c.refresh + c.sample * np.arange(1, lag + 1)
  done, trainer_idle = c.refresh, c.refresh
  for r in ready:
    start = max(r, done)
    trainer_idle += start - done
    done = start + c.train
  sampler_idle = c.refresh + (done - ready[-1])  # refreshing, then waiting for the window's last update
  return float(done), float(trainer_idle), float(sampler_idle)


def seconds_at_step(c: Costs, lag: int, step: float, overlapped: bool = True) -> float:
  """Wall time until trainer step `step` is done: whole windows, then the part of the next one."""
  whole, part = divmod(step, lag)
  t = whole * window_seconds(c, lag, overlapped)
  if part:
    t += window_seconds(c, int(np.ceil(part)), overlapped) * part / np.ceil(part)
  return float(t)


def steps_to(curve: Sequence[tuple[int, float]], target: float) -> float:
  """The first step the curve reaches `target` (linear between grid points); inf if never; 0 if at start."""
  if not curve:
    return float("inf")
  if curve[0][1] >= target:
    return 0.0
  for (s0, v0), (s1, v1) in zip(curve, curve[1:]):
    if v1 >= target:
      return s0 + (target - v0) / (v1 - v0) * (s1 - s0)
  return float("inf")


def median_curve(curves: Sequence[Sequence[tuple[int, float]]]) -> list[tuple[int, float]]:
  """The median over runs at each step every run has."""
  if not curves:
    return []
  steps = sorted(set.intersection(*(set(s for s, _ in c) for c in curves)))
  per = [dict(c) for c in curves]
  return [(s, float(np.median([p[s] for p in per]))) for s in steps]


def time_to_target(c: Costs, lag: int, curve: Sequence[tuple[int, float]], target: float,
                   overlapped: bool = True) -> float:
  step = steps_to(curve, target)
  return seconds_at_step(c, lag, step, overlapped) if np.isfinite(step) else float("inf")


def relative_to_synchronous(c: Costs, lag: int, curve, base_curve, target: float) -> float:
  """Time to target overlapped at `lag` over synchronous on-policy time (base_curve at L = 1, no overlap);
  nan without a usable reference (none, never reached, or reached at the start)."""
  if not base_curve:
    return float("nan")
  ref = time_to_target(c, 1, base_curve, target, overlapped=False)
  if not (np.isfinite(ref) and ref > 0):
    return float("nan")
  return time_to_target(c, lag, curve, target) / ref
