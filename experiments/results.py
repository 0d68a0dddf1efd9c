"""What a finished run of the claims study left: its final test eval (final_eval.json, the harness's) and its
metrics.jsonl (the loop's policy-eval curve on the step grid, its per-step trainer metrics)."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

import numpy as np

from experiments import plan
from oapl_jax.run.sweep import read_history  # a run's metrics.jsonl, as the sweep reads it

FINAL_EVAL = "final_eval.json"
PREFIX = "policy_eval/"


def is_done(workdir: str) -> bool:
  return os.path.exists(os.path.join(workdir, FINAL_EVAL))


def write_json(path: str, value: Any) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(value, f, indent=2)
  os.replace(path + ".tmp", path)


def read_json(path: str) -> Optional[dict]:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def series(history: list[dict], key: str) -> list[tuple[int, float]]:
  """(step, value) of `key`, steps ascending, the last value logged at a step winning."""
  by_step = {int(h["step"]): float(h[key]) for h in history if key in h}
  return sorted(by_step.items())


@dataclasses.dataclass
class RunResult:
  cell: plan.Cell
  final: dict
  history: list[dict]

  def curve(self, metric: str = "pass@1", sets: Optional[list[str]] = None) -> list[tuple[int, float]]:
    """The current policy's `metric` on the step grid, averaged over `sets` (default every validation set;
    task B's two halves have equal sizes) at the steps all of them have."""
    sets = sets or sorted({k[len(PREFIX):].split("/")[0] for h in self.history for k in h if k.startswith(PREFIX)})
    per_set = [dict(series(self.history, f"{PREFIX}{s}/{metric}")) for s in sets]
    steps = sorted(set.intersection(*(set(c) for c in per_set))) if per_set else []
    return [(step, float(np.mean([c[step] for c in per_set]))) for step in steps]

  @property
  def generations_per_step(self) -> float:
    return self.final["generations"] / max(self.final["trainer_steps"], 1)

  def test(self, split: str, metric: str) -> float:
    return float(self.final["test"][split][metric])

  def test_mean(self, metric: str) -> float:
    """The final policy's test `metric`, averaged over the test sets."""
    return float(np.mean([m[metric] for m in self.final["test"].values()]))

  def test_kmax(self) -> int:
    return min(max(int(k[5:]) for k in m if k.startswith("pass@")) for m in self.final["test"].values())

  def val_kmax(self) -> int:
    """The largest k the loop's policy eval logs (policy_eval/<set>/pass@k)."""
    ks = {int(k.rsplit("@", 1)[1]) for h in self.history for k in h if k.startswith(PREFIX) and "/pass@" in k}
    return max(ks) if ks else 1

  def late_mean(self, metric: str, from_fraction: float = 0.5) -> float:
    """The curve's mean over grid steps at or after `from_fraction` of the run (claim 2's entropy)."""
    curve = self.curve(metric)
    last = self.final["trainer_steps"]
    values = [v for s, v in curve if s >= from_fraction * last]
    return float(np.mean(values)) if values else float("nan")

  def generations_to(self, target: float) -> float:
    """Generations sampled when the validation pass@1 curve first reaches `target`, the crossing step
    interpolated linearly between grid points; inf if it never does; nan if it starts there."""
    curve = self.curve()
    if not curve or curve[0][1] >= target:
      return float("nan")
    for (s0, v0), (s1, v1) in zip(curve, curve[1:]):
      if v1 >= target:
        return (s0 + (target - v0) / (v1 - v0) * (s1 - s0)) * self.generations_per_step
    return float("inf")

  def train_mean(self, key: str) -> float:
    values = [v for _, v in series(self.history, f"train/{key}")]
    return float(np.mean(values)) if values else float("nan")


def load(runs_dir: str, cell: plan.Cell) -> Optional[RunResult]:
  workdir = os.path.join(runs_dir, cell.name)
  if not is_done(workdir):
    return None
  return RunResult(cell, read_json(os.path.join(workdir, FINAL_EVAL)), read_history(workdir))
