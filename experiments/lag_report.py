"""The lag curve's report: report.md (rules, GRPO's lr choice, the per-lag table, OAPL - GRPO paired at each lag,
what the knobs did, generations to a validation target, what the lag buys in wall time), lag_curve.png,
walltime.png and stats.json (every run's numbers, for the pooled summary)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Optional

import numpy as np

from experiments import claims_stats, lag_plan, lag_plots, lag_stats, paired_stats, plan, results, tuning, walltime

COST_RATIOS = (0.5, 1.0, 2.0, 4.0)  # t_sample / t_train for the projection beside this host's measured costs
# the README's GSM8K recipe on one H100 (an estimate from measured decode and train rates, not a run): at most
# 16 s sampling and about 9 s training a step; a refresh a device-side copy (taken as 1 s)
GSM8K_H100 = walltime.Costs(16.0, 9.0, 1.0, "GSM8K on an H100 (estimate)")
TARGET_ABOVE_WARM = 0.15  # the wall-time target: validation pass@1 of the warm start + this


def _fmt(x: float, digits: int = 3) -> str:
  return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _ci(mean: float, low: float, high: float) -> str:
  return f"{_fmt(mean)} [{_fmt(low)}, {_fmt(high)}]" if not math.isnan(low) else _fmt(mean)


def _by_loss(stats: list[lag_stats.RunStats], lag: int) -> dict[str, lag_stats.Summary]:
  return {loss: lag_stats.summarize([x for x in stats if x.loss == loss and x.lag == lag]) for loss in ("oapl", "grpo")}


def load(runs_dir: str, cells: list[plan.Cell]) -> tuple[dict[tuple[str, int], list[results.RunResult]], dict]:
  """({(loss, lag): finished runs}, {cell name: its summary.json})."""
  out: dict[tuple[str, int], list[results.RunResult]] = {}
  summaries = {}
  for cell in cells:
    r = results.load(runs_dir, cell)
    if r is not None:
      out.setdefault((cell.arm.loss, cell.arm.lag), []).append(r)
      summaries[cell.name] = results.read_json(os.path.join(runs_dir, cell.name, "summary.json")) or {}
  return out, summaries


def _best_lag(runs, loss: str) -> Optional[int]:
  """The loss's lag with the largest mean validation AUC (chosen on validation, never on test)."""
  aucs = {lag: np.mean([tuning.auc(r.curve()) for r in rs]) for (l, lag), rs in runs.items() if l == loss}
  return max(aucs, key=lambda lag: (aucs[lag], -lag)) if aucs else None


def generations_lines(runs) -> list[str]:
  """Claim 5 on the lag curve: OAPL at its best lag against GRPO at its best lag, and both at L = 50."""
  lines = ["## Generations to a validation target (claim 5 on these runs)", "",
           f"Per seed: {claims_stats.CLAIM5_RULE} (targets {claims_stats.TARGETS}). Positive: OAPL needs fewer. "
           "Each loss's best lag is chosen by mean validation AUC.", "",
           "| OAPL arm | GRPO arm | n | mean log2(GRPO / OAPL) | 95% t-interval | sign-flip p | as a ratio |",
           "|---|---|---|---|---|---|---|"]
  best = {loss: _best_lag(runs, loss) for loss in ("oapl", "grpo")}
  pairs = [(best["oapl"], best["grpo"])] + ([(50, 50)] if (best["oapl"], best["grpo"]) != (50, 50) else [])
  for lo, lg in pairs:
    if lo is None or lg is None:
      continue
    o = {r.cell.seed: r for r in runs.get(("oapl", lo), [])}
    g = {r.cell.seed: r for r in runs.get(("grpo", lg), [])}
    diffs = [claims_stats.claim5_log_ratio(o[s], g[s]) for s in sorted(set(o) & set(g))]
    diffs = [d for d in diffs if not math.isnan(d)]
    p = paired_stats.paired(diffs)
    lines.append(f"| oapl L = {lo} | grpo L = {lg} | {p.n} | {_fmt(p.mean, 2)} | [{_fmt(p.ci_low, 2)}, "
                 f"{_fmt(p.ci_high, 2)}] | {_fmt(p.p, 3)} | "
                 + (f"GRPO needs {2 ** p.mean:.2f}x OAPL's generations |" if p.n else "no complete pair |"))
  return lines + [""]


def walltime_lines(runs, stats, warm_val: float, out_dir: str) -> tuple[list[str], Optional[str]]:
  measured = walltime.Costs(float(np.median([s.sample_seconds for s in stats])),
                            float(np.median([s.train_seconds for s in stats])),
                            float(np.nanmedian([s.refresh_seconds for s in stats])), "this host (measured)")
  target = warm_val + TARGET_ABOVE_WARM
  curves = {key: walltime.median_curve([r.curve() for r in rs]) for key, rs in runs.items()}
  costs = [measured] + [walltime.Costs(r * measured.train, measured.train, measured.refresh, f"t_s/t_t = {r:g}")
                        for r in COST_RATIOS] + [GSM8K_H100]
  base = curves.get(("grpo", 1))
  lines = ["## What the lag buys in wall time (a projection; walltime.png)", "",
           "```", walltime.__doc__.strip(), "```", "",
           f"Measured here (medians over every run): sampling and scoring a step's chunk {measured.sample:.3f} s, "
           f"an update {measured.train:.3f} s, a refresh {measured.refresh:.3f} s. Target: median validation pass@1 "
           f"{target:.3f} (the warm start + {TARGET_ABOVE_WARM}). Rows: time to the target relative to synchronous "
           "on-policy GRPO (L = 1, the sampler waiting for every update) under each cost ratio; inf: not reached.", "",
           "| loss, L | steps to target | " + " | ".join(c.label for c in costs) + " |",
           "|---|---|" + "---|" * len(costs)]
  for (loss, lag), curve in sorted(curves.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    steps = walltime.steps_to(curve, target)
    rel = [walltime.relative_to_synchronous(c, lag, curve, base, target) for c in costs]
    cells = ["inf" if math.isinf(x) else _fmt(x, 2) for x in rel]
    lines.append(f"| {loss} L = {lag} | {_fmt(steps, 0) if np.isfinite(steps) else 'inf'} | " + " | ".join(cells) + " |")
  name = lag_plots.walltime_plot(curves, costs, target, base, out_dir)
  return lines + [""] + check_lines(stats), name


def check_lines(stats: list[lag_stats.RunStats]) -> list[str]:
  """The model against the runs' own phase clocks (summary.json), each (loss, L) with its own measured costs."""
  timed = [s for s in stats if np.isfinite(s.measured_trainer_wait)]
  if not timed:
    return []
  lines = ["### The model against the measured runs", "",
           "Each arm's own per-step costs (medians over its seeds, from the phase clock) put into the model, against "
           "what its runs measured, as shares of the loop's time outside the trainer's evals. On this host the "
           "sampler and the trainer share 2 CPU cores (and other jobs ran beside), which the model does not assume.",
           "", "| loss, L | t_sample (s) | t_train (s) | s/step: model | s/step: measured | trainer waits: model | "
           "measured | sampler waits: model | measured |", "|---|---|---|---|---|---|---|---|---|"]
  for key in sorted({(s.loss, s.lag) for s in timed}):
    arm = [s for s in timed if (s.loss, s.lag) == key]
    c = walltime.Costs(*(float(np.median([getattr(s, f) for s in arm]))
                         for f in ("sample_seconds", "train_seconds", "refresh_seconds")))
    total, trainer_idle, sampler_idle = walltime.simulate_window(c, key[1])
    per_step = float(np.median([s.loop_seconds_outside_eval / lag_plan.STEPS for s in arm]))
    lines.append(f"| {key[0]} L = {key[1]} | {c.sample:.3f} | {c.train:.3f} | {total / key[1]:.3f} | {per_step:.3f} | "
                 f"{trainer_idle / total:.0%} | {np.mean([s.measured_trainer_wait for s in arm]):.0%} | "
                 f"{sampler_idle / total:.0%} | {np.mean([s.measured_sampler_wait for s in arm]):.0%} |")
  return lines + [""]


def write(task: lag_plan.LagTask, study: plan.Study, runs_dir: str, out_dir: str, warm: Optional[dict],
          aucs: dict, grpo_lr: Optional[float], cells: list[plan.Cell]) -> str:
  os.makedirs(out_dir, exist_ok=True)
  warm_test = float(np.mean([m["pass@1"] for m in warm["test"].values()])) if warm else float("nan")
  warm_val = float(np.mean([m["pass@1"] for m in warm["val"].values()])) if warm else float("nan")
  runs, summaries = load(runs_dir, cells)
  stats = [lag_stats.run_stats(r, warm_test, task.oapl[1], summaries[r.cell.name]) for rs in runs.values() for r in rs]
  lags = sorted({lag for _, lag in runs})
  lines = [f"# The lag curve: {task.name}{' (smoke)' if study.smoke else ''}", "",
           f"Config `{study.config}`{' with ' + ', '.join(f'{k}={v}' for k, v in task.sets) if task.sets else ''}. "
           f"S = {study.steps} trainer steps, B = {study.batch} prompts x G per step, every arm 'fresh' at lag L "
           f"(one chunk per step from the window's snapshot). Runs in `{runs_dir}`.", "",
           "## Rules fixed before the runs", "", "```", lag_plan.__doc__.split("Rules fixed before the runs:")[1].strip("\n"),
           "```", "",
           f"OAPL: lr {task.oapl[0]:g}, beta2 {task.oapl[1]:g}. GRPO: clip {task.grpo_clip:g}, lr chosen at L = 50 "
           f"from {task.grpo_lrs} on seeds {lag_plan.TUNE_SEEDS}: mean validation AUC "
           + ", ".join(f"lr {lr:g}: {_fmt(float(np.mean(v)) if all(x is not None for x in v) else float('nan'))}"
                       for lr, v in aucs.items()) + f" -> **{grpo_lr}**.", "",
           f"Warm start: test pass@1 {_fmt(warm_test)}, validation pass@1 {_fmt(warm_val)}.", "",
           "## Final test pass@1 per lag (mean [95% t-interval] over seeds)", "",
           "| L | OAPL | GRPO | OAPL - GRPO (paired) | sign-flip p | collapsed OAPL / GRPO | largest drift OAPL / "
           "GRPO (nats) | grad-norm spikes OAPL / GRPO |", "|---|---|---|---|---|---|---|---|"]
  for lag in lags:
    s = _by_loss(stats, lag)
    d = lag_stats.paired_difference(stats, lag)
    lines.append(f"| {lag} | {_ci(s['oapl'].mean, s['oapl'].ci_low, s['oapl'].ci_high)} (n={s['oapl'].n}) | "
                 f"{_ci(s['grpo'].mean, s['grpo'].ci_low, s['grpo'].ci_high)} (n={s['grpo'].n}) | "
                 f"{_ci(d.mean, d.ci_low, d.ci_high)} (n={d.n}) | {_fmt(d.p)} | "
                 f"{_fmt(s['oapl'].collapse_fraction, 2)} / {_fmt(s['grpo'].collapse_fraction, 2)} | "
                 f"{_fmt(s['oapl'].drift_max, 2)} / {_fmt(s['grpo'].drift_max, 2)} | "
                 f"{_fmt(s['oapl'].grad_spikes, 1)} / {_fmt(s['grpo'].grad_spikes, 1)} |")
  lines += ["", "Collapsed: final test pass@1 below the warm start's. Drift: a step's mean over responses of "
            "|log pi(y) - log pi_sampler(y)|, the largest in the run, averaged over seeds. Spikes: steps whose "
            f"grad norm exceeds {lag_stats.SPIKE_FACTOR:g}x the run's median.", "",
            "## What the knobs did (means over steps and seeds)", "",
            "| L | OAPL drift at a window's end (nats) | OAPL beta2 share: beta2 x drift / advantage spread | "
            "GRPO drift at a window's end | GRPO clip fraction | GRPO mean TIS weight |", "|---|---|---|---|---|---|"]
  for lag in lags:
    s = _by_loss(stats, lag)
    lines.append(f"| {lag} | {_fmt(s['oapl'].drift_window_end)} | {_fmt(s['oapl'].knob)} | "
                 f"{_fmt(s['grpo'].drift_window_end)} | {_fmt(s['grpo'].knob)} | {_fmt(s['grpo'].tis_weight)} |")
  lines += [""] + generations_lines(runs)
  wall, wall_png = walltime_lines(runs, stats, warm_val, out_dir) if stats else ([], None)
  curve_png = lag_plots.lag_plot(stats, warm_test, task.name, out_dir) if stats else None
  lines += wall + ["## Plots", ""] + [f"![{n}]({n})" for n in (curve_png, wall_png) if n] + [""]
  lines += ["## Commands", "", "```bash", f"python -m experiments.lag_curve --task {task.name} --runs {runs_dir} "
            f"--out {out_dir}{' --smoke' if study.smoke else ''}", "```", "", "One run of each arm, as run:", ""]
  for rs in runs.values():
    lines.append(f"- `{rs[0].cell.name}`: `{rs[0].final['command']}`")
  path = os.path.join(out_dir, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(out_dir, "stats.json"), "w") as f:
    json.dump({"task": task.name, "warm_test_pass1": warm_test, "warm_val_pass1": warm_val, "grpo_lr": grpo_lr,
               "runs": [dataclasses.asdict(s) for s in stats]}, f, indent=1)
  return path
