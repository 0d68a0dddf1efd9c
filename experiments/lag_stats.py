"""The lag curve's numbers: per run (final test pass@1, collapse, drift, grad-norm spikes, what each loss's
knob did) and per lag (means with 95% t-intervals, OAPL - GRPO paired by seed)."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from experiments import paired_stats, results, tuning

SPIKE_FACTOR = 5.0  # a grad-norm spike: a step's grad norm above this many times the run's median over the
# steps with a reward signal (a batch whose groups all have equal rewards has next to no gradient)


def _spikes(grad: np.ndarray, all_equal: np.ndarray) -> int:
  signal = grad[all_equal < 1.0] if all_equal.size == grad.size else grad[grad > 0]
  return int(np.sum(signal > SPIKE_FACTOR * np.median(signal))) if signal.size else 0


def _values(r: results.RunResult, key: str) -> np.ndarray:
  return np.asarray([v for _, v in results.series(r.history, key)], np.float64)


def beta2_share(r: results.RunResult, beta2: float) -> float:
  """OAPL's beta2 x |log pi - log pi_sampler| over the advantage's spread: the mean over steps with a reward signal
  (nan with none), how much of the residual the trust region is."""
  ratio, spread = _values(r, "train/log_ratio_abs_mean"), _values(r, "train/advantage_std")
  signal = spread > 1e-6
  return float(np.mean(beta2 * ratio[signal] / spread[signal])) if signal.any() else float("nan")


@dataclasses.dataclass(frozen=True)
class RunStats:
  seed: int
  loss: str
  lag: int
  test_pass1: float
  val_auc: float
  collapsed: bool  # final test pass@1 below the warm start's
  drift_max: float  # the largest per-step mean |log pi - log pi_sampler| over a response (nats)
  drift_window_end: float  # the same at each window's last step, averaged over windows
  grad_spikes: int  # steps with grad norm > SPIKE_FACTOR x the run's median
  skipped: int  # updates the step's guard refused
  knob: float  # OAPL: beta2 * |log-ratio| / advantage spread (mean over steps with signal); GRPO: clip fraction
  tis_weight: float  # GRPO's mean truncated importance weight (nan for OAPL)
  sample_seconds: float  # median seconds per step's chunk (sampling and scoring)
  train_seconds: float  # median seconds per update
  refresh_seconds: float  # median seconds per snapshot refresh
  measured_trainer_wait: float = float("nan")  # share of the loop's time outside evals the trainer waited for data
  measured_sampler_wait: float = float("nan")  # ... and the sampler waited for the trainer (summary.json's phases)
  loop_seconds_outside_eval: float = float("nan")


TRAIN_PHASES = ("train step: dispatch", "host sync: a step's metrics fetched (waits for its compute)",
                "packing: the batch onto the trainer's devices", "old-policy scores")
SAMPLE_PHASES = ("sampling", "scoring", "packing: groups into the buffer")


def phase_costs(summary: dict) -> Optional[dict]:
  """Per-step costs and waiting shares from a run's summary.json phases (reporting.PhaseClock), or None. The
  shares are of the loop's time outside the trainer's evals (the model has no evals)."""
  phases, steps = summary.get("phase_seconds"), summary.get("trainer_steps")
  if not phases or not steps:
    return None
  trainer, sampler = phases.get("trainer", {}), phases.get("sampler", {})
  outside = summary["loop_seconds"] - trainer.get("eval", 0.0)
  return {"train": sum(trainer.get(p, 0.0) for p in TRAIN_PHASES) / steps,
          "sample": sum(sampler.get(p, 0.0) for p in SAMPLE_PHASES) / steps,
          "trainer_wait": trainer.get("waiting for samples", 0.0) / outside,
          # the sampler also waits while the trainer evaluates: that part is not the schedule's
          "sampler_wait": max(sampler.get("waiting for the trainer", 0.0) - trainer.get("eval", 0.0), 0.0) / outside,
          "outside_eval": outside}


def run_stats(r: results.RunResult, warm_test_pass1: float, beta2: Optional[float],
              summary: Optional[dict] = None) -> RunStats:
  lag = r.cell.arm.lag
  drift = _values(r, "train/seq_log_ratio_abs_mean")
  steps = [s for s, _ in results.series(r.history, "train/seq_log_ratio_abs_mean")]
  window_end = [v for s, v in zip(steps, drift) if s % lag == lag - 1]
  grad = _values(r, "train/grad_norm")
  if r.cell.arm.loss == "oapl":
    knob, tis = beta2_share(r, beta2), float("nan")
  else:
    knob, tis = float(np.mean(_values(r, "train/clip_fraction"))), float(np.mean(_values(r, "train/tis_weight_mean")))
  tokens, rate = _values(r, "train/tokens"), _values(r, "train/tokens_per_second")
  test = r.test_mean("pass@1")
  costs = phase_costs(summary or {})
  timing = dict(sample_seconds=float(np.median(_values(r, "rollout/seconds"))),
                train_seconds=float(np.median(tokens / np.maximum(rate, 1e-9))) if rate.size else float("nan"))
  if costs:  # the phase clock's per-step costs: the sampler's own time, the trainer's step without its waits
    timing = dict(sample_seconds=costs["sample"], train_seconds=costs["train"],
                  measured_trainer_wait=costs["trainer_wait"], measured_sampler_wait=costs["sampler_wait"],
                  loop_seconds_outside_eval=costs["outside_eval"])
  return RunStats(
      seed=r.cell.seed, loss=r.cell.arm.loss, lag=lag, test_pass1=test, val_auc=tuning.auc(r.curve()),
      collapsed=test < warm_test_pass1,
      drift_max=float(drift.max()) if drift.size else float("nan"),
      drift_window_end=float(np.mean(window_end)) if window_end else float("nan"),
      grad_spikes=_spikes(grad, _values(r, "train/frac_groups_all_equal_reward")),
      skipped=int(np.sum(_values(r, "train/update_skipped"))), knob=knob, tis_weight=tis,
      refresh_seconds=float(np.median(_values(r, "sampler/refresh_seconds"))), **timing)


@dataclasses.dataclass(frozen=True)
class Summary:
  """One (loss, lag) over seeds."""
  n: int
  mean: float
  ci_low: float
  ci_high: float
  collapse_fraction: float
  drift_max: float  # mean over seeds of each run's largest
  drift_window_end: float
  grad_spikes: float  # mean per run
  knob: float
  tis_weight: float


def interval(values: list[float]) -> tuple[float, float, float]:
  v = np.asarray(values, np.float64)
  if v.size < 2:
    m = float(v.mean()) if v.size else float("nan")
    return m, float("nan"), float("nan")
  half = paired_stats.t_quantile_975(v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
  return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def summarize(stats: list[RunStats]) -> Summary:
  mean, low, high = interval([s.test_pass1 for s in stats])
  avg = lambda f: float(np.mean([f(s) for s in stats])) if stats else float("nan")  # noqa: E731
  return Summary(len(stats), mean, low, high, avg(lambda s: s.collapsed), avg(lambda s: s.drift_max),
                 avg(lambda s: s.drift_window_end), avg(lambda s: s.grad_spikes), avg(lambda s: s.knob),
                 avg(lambda s: s.tis_weight))


def paired_difference(stats: list[RunStats], lag: int, value=lambda s: s.test_pass1) -> paired_stats.Paired:
  """OAPL - GRPO at one lag, paired by seed (complete pairs only)."""
  by = {loss: {s.seed: value(s) for s in stats if s.loss == loss and s.lag == lag} for loss in ("oapl", "grpo")}
  _, diffs = paired_stats.differences(by["oapl"], by["grpo"])
  return paired_stats.paired(diffs)
