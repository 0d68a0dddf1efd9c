"""The lag curve's PNGs: final test pass@1 against L for both losses (mean and 95% t-interval over seeds, the
warm start dashed) beside the drift to the sampler; and the wall-time projection."""
from __future__ import annotations

import os

import numpy as np

from experiments import lag_stats, walltime

COLORS = {"oapl": "C0", "grpo": "C3"}


def _plt():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def lag_plot(stats: list[lag_stats.RunStats], warm_test: float, task: str, out_dir: str) -> str:
  plt = _plt()
  fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
  for loss, color in COLORS.items():
    lags = sorted({s.lag for s in stats if s.loss == loss})
    if not lags:
      continue
    per = [lag_stats.summarize([s for s in stats if s.loss == loss and s.lag == lag]) for lag in lags]
    mean = np.array([p.mean for p in per])
    low = np.array([p.ci_low if np.isfinite(p.ci_low) else p.mean for p in per])
    high = np.array([p.ci_high if np.isfinite(p.ci_high) else p.mean for p in per])
    ax.errorbar(lags, mean, yerr=[mean - low, high - mean], fmt="o-", color=color, capsize=3,
                label=f"{loss} (n={per[0].n})")
    for s in stats:
      if s.loss == loss:
        ax.plot(s.lag * (1.06 if loss == "grpo" else 0.94), s.test_pass1, ".", color=color, alpha=0.35)
    bx.plot(lags, [p.drift_max for p in per], "o-", color=color, label=f"{loss}: largest")
    bx.plot(lags, [p.drift_window_end for p in per], "s--", color=color, alpha=0.6, label=f"{loss}: at window end")
  ax.axhline(warm_test, color="k", ls="--", lw=0.8, label="warm start")
  ax.set(xscale="log", xlabel="lag L (trainer steps per sampler refresh)", ylabel="final test pass@1",
         title=f"{task}: pass@1 against the sampler's lag")
  bx.set(xscale="log", xlabel="lag L", ylabel="mean |log pi - log pi_sampler| per response (nats)",
         title="drift from the sampler")
  ax.legend(fontsize=7)
  bx.set_yscale("symlog", linthresh=1e-3)
  bx.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "lag_curve.png"), dpi=110)
  plt.close(fig)
  return "lag_curve.png"


def walltime_plot(curves: dict, costs: list[walltime.Costs], target: float, base, out_dir: str) -> str:
  """Time to the target relative to synchronous on-policy GRPO, against L, one panel per loss, a line per cost."""
  plt = _plt()
  losses = sorted({loss for loss, _ in curves})
  fig, axes = plt.subplots(1, len(losses), figsize=(5 * len(losses), 3.8), squeeze=False)
  for ax, loss in zip(axes[0], losses):
    lags = sorted(lag for l, lag in curves if l == loss)
    for i, c in enumerate(costs):
      rel = [walltime.relative_to_synchronous(c, lag, curves[(loss, lag)], base, target) for lag in lags]
      shown = [(lag, r) for lag, r in zip(lags, rel) if np.isfinite(r)]
      if shown:
        ax.plot(*zip(*shown), "o-", color=f"C{i}", label=c.label)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    if not ax.lines[:-1]:
      ax.text(0.5, 0.5, "target not reached (or no on-policy GRPO reference)", ha="center", transform=ax.transAxes)
    ax.set(xscale="log" if ax.lines[:-1] else "linear", xlabel="lag L",
           ylabel="wall time to target / synchronous on-policy GRPO's",
           title=f"{loss}: time to val pass@1 {target:.2f} (overlapped at L)")
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "walltime.png"), dpi=110)
  plt.close(fig)
  return "walltime.png"
