"""The claims report's PNGs: curves on the policy-eval step grid with 95% t-bands over seeds (the band of the
arm's mean; the claims' inference is the paired one in the report), entropy against the run's own pass@1,
the claims' intervals."""
from __future__ import annotations

import math
import os

import numpy as np

from experiments import paired_stats, plan, results, tuning, tuning_record


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

  pilots = {c.arm.name: r for c in plan.pilot_cells(study) if (r := results.load(runs_dir, c)) is not None}
  if pilots and state.pilot is not None:
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, (arm, r) in enumerate(pilots.items()):
      ax.plot(*zip(*r.curve()), "o-", ms=3, color=f"C{i}", label=arm)
    ax.axhline(state.pilot.start + tuning.PILOT_GAIN, color="g", ls="--", label=f"warm start + {tuning.PILOT_GAIN}")
    ax.axhline(tuning.HEADROOM, color="r", ls=":", label=f"headroom rule {tuning.HEADROOM}")
    ax.axvline(state.pilot.step, color="k", lw=0.8)
    ax.set(xlabel="trainer step", ylabel="val pass@1 (T 0.6, top-p 0.95)",
           title=f"pilot: every primary arm at its middle grid point")
    ax.legend(fontsize=7)
    save(fig, "pilot.png")

  curves = {loss: {s: tuning_record.point(study, runs_dir, state.recorded, loss, s)[0] for s in sorted(scores)}
            for loss, scores in state.tuning.items()}
  losses = [loss for loss, by_setting in curves.items() if any(by_setting.values())]  # no curves: no panel
  if losses:
    fig, axes = plt.subplots(1, len(losses), figsize=(4.2 * len(losses), 3.4), squeeze=False, sharey=True)
    for ax, loss in zip(axes[0], losses):
      for i, (setting, curve) in enumerate(curves[loss].items()):
        if curve:
          ax.plot(*zip(*curve), color=f"C{i}", lw=2.5 if state.chosen.get(loss) == setting else 1,
                  label=f"lr {setting[0]:g}, {plan.KNOBS[loss][0].rsplit('.', 1)[1]} {setting[1]:g}")
      ax.set(title=f"tuning: {loss}", xlabel="trainer step", ylabel="val pass@1")
      ax.legend(fontsize=6)
    save(fig, "tuning.png")

  arms = [k for k in study.arms() if k in runs]
  for metric, name, ylabel in (("pass@1", "val_pass1.png", "validation pass@1"),
                               ("token_entropy", "entropy.png", "policy's entropy per token (T = 1 samples)")):
    if not arms:
      break
    fig, axes = plt.subplots(1, 3 if metric != "pass@1" else 2, figsize=(15 if metric != "pass@1" else 11, 3.8))
    for i, key in enumerate(arms):
      rs = list(runs[key].values())
      _draw(axes[0], [r.curve(metric) for r in rs], key, f"C{i % 10}")
      _draw(axes[1], [r.curve(metric) for r in rs], key, f"C{i % 10}", x_scale=rs[0].generations_per_step)
      if metric != "pass@1":  # against the run's own validation pass@1: the matched-progress view
        for r in rs:
          axes[2].plot([v for _, v in r.curve()], [v for _, v in r.curve(metric)], ".-", color=f"C{i % 10}", lw=0.6,
                       ms=2, alpha=0.6, label=key if r is rs[0] else None)
        axes[2].set(xlabel="validation pass@1 (the run's own)", ylabel=ylabel, title="at matched pass@1 (per seed)")
    axes[0].set(xlabel="trainer step", ylabel=ylabel, title=f"{study.name}: {ylabel} (mean, 95% band)")
    axes[1].set(xlabel="generations sampled", title="the same against generations")
    axes[0].legend(fontsize=6)
    save(fig, name)

  if outcomes:
    fig, axes = plt.subplots(1, len(outcomes), figsize=(2.6 * len(outcomes), 3.4), squeeze=False)
    for ax, o in zip(axes[0], outcomes):
      s = o.measured()
      if s.n:
        ax.scatter([0] * s.n, s.diffs, s=12, color="0.5")
        if np.isfinite(s.ci_low):
          ax.errorbar([0.25], [s.mean], yerr=[[s.mean - s.ci_low], [s.ci_high - s.mean]], fmt="o", color="C0",
                      capsize=4)
      ax.axhline(0, color="k", lw=0.8)
      if o.claim.shift:  # non-inferiority: the claim holds above minus the margin
        ax.axhline(-o.claim.shift, color="C3", lw=0.8, ls="--")
      ax.set(xticks=[], title=f"claim {o.claim.key} (n={s.n})\n{o.verdict.split(' ')[0]}", xlim=(-0.5, 0.75))
      ax.title.set_fontsize(8)
    save(fig, "claims.png")
  return names
