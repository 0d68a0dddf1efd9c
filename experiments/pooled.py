"""A claim pooled over tasks, the task as a block (issue 51): per task the paired per-seed differences; pooled,
the mean of the task means (every task weighs the same, whatever its seed count), its 95% interval from the
within-task seed variance (conditional on these tasks), the spread between tasks, and a stratified sign-flip
test (each seed's difference flips sign independently; the statistic is the mean of task means). A forest plot.

  python -m experiments.pooled reports/claims_v4/claim1_inputs.json --out reports/claims_v4/pooled_claim1
  python -m experiments.pooled --lag 50 reports/claims_v4/lag_*/stats.json --out reports/claims_v4/pooled_same_lag50

The input JSON: {"claim": TEXT, "comparisons": [{"task": NAME, "comparison": TEXT, "source": WHERE THE
NUMBERS ARE, "diffs": {SEED: A - B, ...}}, ...]}.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
import textwrap
from typing import Sequence

import numpy as np

from experiments import paired_stats

EXACT_UP_TO = 20  # seeds in all: exact enumeration of 2^n sign patterns; Monte Carlo beyond
MONTE_CARLO = 200_000


@dataclasses.dataclass(frozen=True)
class Pooled:
  tasks: int
  mean: float  # mean of the task means
  ci_low: float  # +- z * sqrt(sum_k var_k / n_k) / K (normal: the per-task variances add)
  ci_high: float
  between_sd: float  # sd of the task means (how much the task changes the answer)
  p: float  # stratified sign-flip, two-sided
  tasks_below: int
  tasks_above: int


def stratified_sign_flip(diffs_by_task: Sequence[Sequence[float]], seed: int = 0) -> float:
  """P(|mean of task means| >= observed) when every seed's difference flips sign independently."""
  blocks = [np.asarray(d, np.float64) for d in diffs_by_task if len(d)]
  observed = abs(np.mean([b.mean() for b in blocks]))
  n = sum(b.size for b in blocks)
  weights = np.concatenate([b / b.size / len(blocks) for b in blocks])  # statistic = sum(sign * weight)
  if n <= EXACT_UP_TO:
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
  else:
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(MONTE_CARLO, n))
  stats = np.abs(signs @ weights)
  return float(np.mean(stats >= observed - 1e-12 * max(1.0, observed)))


def pool(diffs_by_task: Sequence[Sequence[float]]) -> Pooled:
  blocks = [np.asarray(d, np.float64) for d in diffs_by_task if len(d)]
  if not blocks:
    raise ValueError("pool: no task has a paired difference")
  k = len(blocks)
  means = np.array([b.mean() for b in blocks])
  var_of_mean = sum(b.var(ddof=1) / b.size if b.size > 1 else float("nan") for b in blocks) / k**2
  half = 1.959964 * math.sqrt(var_of_mean)
  return Pooled(k, float(means.mean()), float(means.mean() - half), float(means.mean() + half),
                float(means.std(ddof=1)) if k > 1 else float("nan"), stratified_sign_flip(blocks),
                int(np.sum(means < 0)), int(np.sum(means > 0)))


def forest(rows: list[tuple[str, paired_stats.Paired]], pooled: Pooled, claim: str, path: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(7.5, 0.55 * (len(rows) + 2) + 1))
  for i, (_, s) in enumerate(rows):
    y = len(rows) - i
    ax.errorbar(s.mean, y, xerr=[[s.mean - s.ci_low], [s.ci_high - s.mean]], fmt="s", color="C0", capsize=3)
    ax.plot(s.diffs, [y] * len(s.diffs), ".", color="C0", alpha=0.3)
  for i, (label, s) in enumerate(rows):  # x in axes fractions: the label starts inside the frame
    ax.text(0.01, len(rows) - i + 0.25, f"{label} (n={s.n})", fontsize=7, transform=ax.get_yaxis_transform())
  ax.errorbar(pooled.mean, 0, xerr=[[pooled.mean - pooled.ci_low], [pooled.ci_high - pooled.mean]], fmt="D",
              color="k", capsize=4)
  ax.text(0.01, -0.55, f"pooled over {pooled.tasks} tasks: {pooled.mean:+.3f} [{pooled.ci_low:+.3f}, "
          f"{pooled.ci_high:+.3f}], stratified p {pooled.p:.3g}", fontsize=7, transform=ax.get_yaxis_transform())
  ax.axvline(0, color="k", lw=0.8, ls="--")
  ax.set(yticks=[], ylim=(-1, len(rows) + 0.8), xlabel="paired difference per seed (A - B)")
  ax.set_title(textwrap.fill(claim, 100), fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def report(spec: dict, out: str) -> str:
  os.makedirs(out, exist_ok=True)
  rows = [(f"{c['task']}: {c['comparison']}", paired_stats.paired(list(c["diffs"].values())))
          for c in spec["comparisons"]]
  p = pool([s.diffs for _, s in rows])
  lines = [f"# {spec['claim']}: pooled over tasks", "", __doc__.split("\n\n")[0].replace("\n", " "), "",
           "| task: comparison | n | mean diff | 95% t-interval | sign-flip p | seeds below 0 | source |",
           "|---|---|---|---|---|---|---|"]
  for (label, s), c in zip(rows, spec["comparisons"]):
    lines.append(f"| {label} | {s.n} | {s.mean:+.3f} | [{s.ci_low:+.3f}, {s.ci_high:+.3f}] | {s.p:.4f} | "
                 f"{sum(d < 0 for d in s.diffs)}/{s.n} | {c['source']} |")
  lines += ["", f"**Pooled** (task as a block, {p.tasks} tasks, each weighing the same): {p.mean:+.3f} "
            f"[{p.ci_low:+.3f}, {p.ci_high:+.3f}], stratified sign-flip p {p.p:.4f}; task means below 0 on "
            f"{p.tasks_below} of {p.tasks} tasks; their sd across tasks {p.between_sd:.3f}.", "",
            "The interval is conditional on these tasks (seed noise only). With this few tasks the spread between "
            "them is the honest measure of how far another task may land: a task's mean is not predicted by the "
            "pooled one within the interval.", "", "![forest](forest.png)", ""]
  forest(rows, p, spec["claim"], os.path.join(out, "forest.png"))
  path = os.path.join(out, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def from_lag_stats(lag_stats: Sequence[dict], lag: int, paths: Sequence[str]) -> dict:
  """The spec of OAPL - GRPO at one lag, paired by seed, from lag curves' stats.json (experiments/lag_report)."""
  comparisons = []
  for stats, path in zip(lag_stats, paths):
    by = {loss: {r["seed"]: r["test_pass1"] for r in stats["runs"] if r["loss"] == loss and r["lag"] == lag}
          for loss in ("oapl", "grpo")}
    seeds = sorted(set(by["oapl"]) & set(by["grpo"]))
    comparisons.append({"task": stats["task"], "comparison": f"oapl - grpo, both at L = {lag}", "source": path,
                        "diffs": {str(s): by["oapl"][s] - by["grpo"][s] for s in seeds}})
  return {"claim": f"OAPL against GRPO at the same lag L = {lag}, final test pass@1 (OAPL - GRPO)",
          "comparisons": comparisons}


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m experiments.pooled", description=__doc__.split("\n")[0])
  parser.add_argument("inputs", nargs="+", help="the JSON of per-task paired differences (or, with --lag, "
                                                 "lag curves' stats.json files)")
  parser.add_argument("--lag", type=int, help="pool OAPL - GRPO at this lag from lag curves' stats.json")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  try:
    loaded = []
    for path in args.inputs:
      with open(os.path.expanduser(path)) as f:
        loaded.append(json.load(f))
  except (OSError, json.JSONDecodeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.lag is not None:
    spec = from_lag_stats(loaded, args.lag, args.inputs)
  elif len(loaded) == 1:
    spec = loaded[0]
  else:
    print("error: give one inputs JSON, or lag curves' stats.json files with --lag", file=sys.stderr)
    return 2
  print(open(report(spec, os.path.expanduser(args.out))).read())
  return 0


if __name__ == "__main__":
  sys.exit(main())
