"""The claims report's PNGs: curves on the policy-eval step grid with 95% t-bands over seeds (the band of the
arm's mean; the claims' inference is the paired one in the report), the claims' intervals, pass@k per half."""
from __future__ import annotations

import math
import os

import numpy as np

from experiments import paired_stats, plan, results, tuning


def _band(values_SxN: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(mean, low, high) over seeds (rows) per column; no band for one seed."""
  mean = values_SxN.mean(axis=0)
  n = values_SxN.shape[0]
  if n < 2:
    return mean, mean, mean
  half = paired_stats.t_quantile_975(n - 1) * values_SxN.std(axis=0, ddof=1) / math.sqrt(n)
  return mean, mean - half, mean + half


def _draw(ax, curves: list[list[tuple[float, float]]], label: str, color: str, x_scale: float = 1.0) -> None:
  """Mean and 95% band of several (x, y) curves over the x values they all have."""
  common = sorted(set.intersection(*(set(x for x, _ in c) for c in curves))) if curves else []
  if not common:
    return
  ys = np.array([[dict(c)[x] for x in common] for c in curves])
  mean, low, high = _band(ys)
  xs = np.asarray(common, np.float64) * x_scale
  ax.plot(xs, mean, color=color, label=f"{label} (n={len(curves)})")
  ax.fill_between(xs, low, high, color=color, alpha=0.2)


def plot_all(study: plan.Study, runs_dir: str, runs, state, outcomes, out_dir: str) -> list[str]:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  names = []

  def save(fig, name):
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=110)
    plt.close(fig)
    names.append(name)

  pilot = results.load(runs_dir, plan.pilot_cell(study))
  if pilot is not None and state.pilot is not None:
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    steps, values = zip(*pilot.curve())
    ax.plot(steps, values, "o-", label="pilot: OAPL, validation pass@1")
    ax.axhline(state.pilot.start + tuning.PILOT_GAIN, color="g", ls="--", label=f"warm start + {tuning.PILOT_GAIN}")
    ax.axhline(tuning.PILOT_CEILING, color="r", ls=":", label=f"ceiling {tuning.PILOT_CEILING}")
    ax.axvline(state.pilot.step, color="k", lw=0.8)
    ax.set(xlabel="trainer step", ylabel="pass@1 (T 0.6, top-p 0.95)",
           title=f"pilot: {'ok' if state.pilot.ok else 'failed'}")
    ax.legend(fontsize=7)
    save(fig, "pilot.png")

  if state.tuning:
    losses = list(state.tuning)
    fig, axes = plt.subplots(1, len(losses), figsize=(4.2 * len(losses), 3.4), squeeze=False, sharey=True)
    for ax, loss in zip(axes[0], losses):
      for i, lr in enumerate(sorted(state.tuning[loss])):
        r = results.load(runs_dir, plan.tuning_cells(study, loss, [lr])[0])
        if r is not None:
          ax.plot(*zip(*r.curve()), color=f"C{i}", lw=2.5 if state.chosen.get(loss) == lr else 1, label=f"lr {lr:g}")
      ax.set(title=f"tuning: {loss}", xlabel="trainer step", ylabel="val pass@1")
      ax.legend(fontsize=7)
    save(fig, "tuning.png")

  task_a = [k for k, a in study.arms().items() if a.task == "arithmetic" and k in runs]
  for metric, name, ylabel in (("pass@1", "val_pass1.png", "validation pass@1"),
                               ("token_entropy", "entropy.png", "policy's entropy per token (T = 1 samples)")):
    if not task_a:
      break
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for i, key in enumerate(task_a):
      rs = list(runs[key].values())
      _draw(axes[0], [r.curve(metric) for r in rs], key, f"C{i % 10}")
      _draw(axes[1], [r.curve(metric) for r in rs], key, f"C{i % 10}", x_scale=rs[0].generations_per_step)
    axes[0].set(xlabel="trainer step", ylabel=ylabel, title=f"task A: {ylabel} (mean, 95% band)")
    axes[1].set(xlabel="generations sampled", title="the same against generations")
    axes[0].legend(fontsize=6)
    save(fig, name)

  if outcomes:
    fig, axes = plt.subplots(1, len(outcomes), figsize=(2.6 * len(outcomes), 3.4), squeeze=False)
    for ax, o in zip(axes[0], outcomes):
      s = o.summary
      if s.n:
        ax.scatter([0] * s.n, s.diffs, s=12, color="0.5")
        if np.isfinite(s.ci_low):
          ax.errorbar([0.25], [s.mean], yerr=[[s.mean - s.ci_low], [s.ci_high - s.mean]], fmt="o", color="C0",
                      capsize=4)
      ax.axhline(0, color="k", lw=0.8)
      if o.claim.margin is not None:
        ax.axhline(o.claim.margin, color="g", ls="--", lw=0.8)
      ax.set(xticks=[], title=f"claim {o.claim.key} (n={s.n})\n{o.verdict.split(' ')[0]}", xlim=(-0.5, 0.75))
      ax.title.set_fontsize(8)
    save(fig, "claims.png")

  hard = [k for k, a in study.arms().items() if a.task == "hard_tail" and k in runs]
  if hard:
    warm = state.warm.get("hard_tail") or {}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, split in zip(axes, ("test_easy", "test_hard")):
      for i, key in enumerate(hard):
        curves = [[(int(k[5:]), v) for k, v in r.final["test"][split].items() if k.startswith("pass@")]
                  for r in runs[key].values()]
        _draw(ax, curves, key.split("/")[1], f"C{i}")
      start = warm.get("test", {}).get(split)
      if start:
        ks = sorted(int(k[5:]) for k in start if k.startswith("pass@"))
        ax.plot(ks, [start[f"pass@{k}"] for k in ks], "k--", label="warm start")
      ax.set(xscale="log", xlabel="k", ylabel="pass@k", title=f"task B {split.split('_')[1]} half (mean, 95% band)")
      ax.legend(fontsize=7)
    save(fig, "passk_hard_tail.png")
  return names
