"""The claims study's report: rules stated in advance, the pilot, tuning, one paired test per claim (Holm over
the five), descriptive tables, the pairing check, wall time, per-cell commands, and PNGs with 95% bands.
Every number comes from a run directory (final_eval.json, metrics.jsonl) or a warm start's eval.json."""
from __future__ import annotations

import os
from typing import Optional

import numpy as np

from experiments import claims, claims_plots, claims_stats, paired_stats, plan, results, tuning


def collect(study: plan.Study, runs_dir: str, state: claims.State) -> dict[str, dict[int, results.RunResult]]:
  """arm key -> main seed -> finished run (the arm's chosen learning rate)."""
  out = {}
  for key, arm in study.arms().items():
    if arm.loss not in state.chosen:
      continue
    found = {s: r for s in study.seeds if (r := results.load(runs_dir, plan.Cell(arm, state.chosen[arm.loss], s)))}
    if found:
      out[key] = found
  return out


def _f(x: Optional[float], digits: int = 3, sign: bool = False) -> str:
  return "nan" if x is None or not np.isfinite(x) else f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _interval(s: paired_stats.Paired) -> str:
  return f"[{_f(s.ci_low, 4, True)}, {_f(s.ci_high, 4, True)}]"


def _p(x: float) -> str:
  return "n/a" if not np.isfinite(x) else f"{x:.4f}"


def rules_lines(study: plan.Study) -> list[str]:
  return [
      "## Rules fixed before any run", "",
      f"- Pilot: OAPL at L = {study.lag}, the middle learning rate, the tuning seed {plan.TUNE_SEED}. The current "
      f"policy's validation pass@1 at mid-run (step {study.steps // 2}) must be at least the warm start's + "
      f"{tuning.PILOT_GAIN} and below {tuning.PILOT_CEILING}; else the study stops (change the task: slip rate or "
      "batch, never the losses).",
      f"- Tuning: learning rates {', '.join(f'{lr:g}' for lr in study.learning_rates)} per loss on seed "
      f"{plan.TUNE_SEED} (never a main seed), chosen by the area under the validation pass@1 curve (ties: the "
      f"smaller lr); a winner at a grid edge adds {dict(study.extension)} beyond that edge for every loss of the "
      "stage alike (one round). Every arm of a loss uses the loss's chosen lr (task B too).",
      f"- Power: {plan.PLANNED_N['claim']} RL seeds for every arm a claim reads, {plan.PLANNED_N['baseline']} for "
      f"the rest. The exact sign-flip p cannot fall below 2/2^n ({paired_stats.min_p(5):.4f} at n = 5, "
      f"{paired_stats.min_p(8):.4f} at n = 8), and Holm's first threshold is 0.05 / 5 = 0.01.",
      f"- Pairing: one warm start per task, seeds {', '.join(map(str, study.seeds))}; paired cells share the seed, "
      "so the prompt order and every eval draw; their configs may differ only in " + ", ".join(plan.METHOD_KEYS) + ".",
      f"- Verdicts: {paired_stats.VERDICT_RULE}", ""]


def _headroom_lines(study: plan.Study, runs_dir: str) -> list[str]:
  """Each primary loss at the grid's middle lr (tuning seed): validation pass@1 at mid-run and at the end, a
  warning where it reaches the pilot's ceiling (a final pass@1 at a ceiling cannot separate the methods)."""
  lrs = study.learning_rates
  lines = ["| loss (middle lr, tuning seed) | val pass@1 at step 0 | at mid-run | at the end | headroom |",
           "|---|---|---|---|---|"]
  for loss in plan.PRIMARY_LOSSES:
    r = results.load(runs_dir, plan.tuning_cells(study, loss, [lrs[len(lrs) // 2]])[0])
    if r is None or not r.curve():
      continue
    curve = dict(r.curve())
    mid = min(curve, key=lambda s: (abs(s - study.steps / 2), s))
    top = max(curve[mid], curve[max(curve)])
    note = f"saturates (>= {tuning.PILOT_CEILING})" if top >= tuning.PILOT_CEILING else "ok"
    lines.append(f"| {loss} | {curve[0]:.3f} | {curve[mid]:.3f} (step {mid}) | {curve[max(curve)]:.3f} | {note} |")
  return lines if len(lines) > 2 else []


def _warm_lines(state: claims.State) -> list[str]:
  lines = ["## Warm starts (one checkpoint per task, every run starts from it)", "",
           "| task | set | " + " | ".join(["pass@1", "pass@k (largest k)"]) + " |", "|---|---|---|---|"]
  for task, ev in state.warm.items():
    for split in ("val", "test"):
      for name, m in (ev or {}).get(split, {}).items():
        kmax = max(int(k[5:]) for k in m if k.startswith("pass@"))
        lines.append(f"| {task} | {name} | {m['pass@1']:.3f} | pass@{kmax} {m[f'pass@{kmax}']:.3f} |")
  if state.hard_tail is not None:
    lines += ["", state.hard_tail[1]]
  return lines + [""]


def _tuning_lines(study: plan.Study, runs_dir: str, state: claims.State) -> list[str]:
  lines = ["## Tuning (seed %d; validation pass@1 of the current policy on the step grid)" % plan.TUNE_SEED, "",
           "| loss | tuned in | lr | AUC (mean val pass@1) | final val pass@1 | chosen |", "|---|---|---|---|---|---|"]
  for loss, scores in state.tuning.items():
    for lr in sorted(scores):
      r = results.load(runs_dir, plan.tuning_cells(study, loss, [lr])[0])
      final = r.curve()[-1][1] if r is not None and r.curve() else float("nan")
      score = _f(scores[lr]) if scores[lr] is not None else "not run"
      lines.append(f"| {loss} | {study.tuning_arm(loss).name} | {lr:g} | {score} | {_f(final)} | "
                   f"{'yes' if state.chosen.get(loss) == lr else ''} |")
  for stage, extra in state.extended.items():
    lines.append(f"\n{stage}: edge extension {', '.join(f'{x:g}' for x in extra) if extra else 'none needed'}.")
  edge_winners = [loss for loss, lr in state.chosen.items()
                  if tuning.edge(sorted(state.tuning.get(loss, {})), lr) and len(state.tuning.get(loss, {})) > 1]
  if edge_winners:
    lines.append("\nStill at an edge after the extension round (reported, not extended again): "
                 f"{', '.join(edge_winners)}.")
  return lines + [""]


def _claim_lines(outcomes: list[claims_stats.Outcome]) -> list[str]:
  lines = ["## The five claims (paired by seed; Holm over the five)", "",
           "| # | claim | arm vs comparator | n (planned) | mean diff | 95% t-interval | sign-flip p | Holm p | "
           "verdict |",
           "|---|---|---|---|---|---|---|---|---|"]
  for o in outcomes:
    s, c = o.summary, o.claim
    lines.append(f"| {c.key} | {c.title} | {c.arm} vs {c.comparator} | {s.n} ({o.planned_n}) | {_f(s.mean, 4, True)} | "
                 f"{_interval(s)} | {_p(s.p)} | {_p(o.holm_p)} | **{o.verdict}** |")
  lines.append("")
  for o in outcomes:
    per = ", ".join(f"seed {s}: {d:+.4f}" for s, d in zip(o.seeds, o.summary.diffs)) or "none"
    extra = ""
    if o.claim.key == "5" and o.summary.n:
      extra = (f" As a ratio: GRPO needs {2 ** o.summary.mean:.2f}x the generations "
               f"(95% interval {2 ** o.summary.ci_low:.2f}x to {2 ** o.summary.ci_high:.2f}x; the paper reports ~3x)."
               if np.isfinite(o.summary.ci_low) else f" As a ratio: {2 ** o.summary.mean:.2f}x.")
    lines.append(f"{o.claim.key}. {o.claim.statistic}{' (' + o.claim.units + ')' if o.claim.units else ''}. "
                 f"Differences: {per}.{extra}")
  return lines + [""]


def _secondary_lines(study: plan.Study, runs) -> list[str]:
  lines = ["## Other paired comparisons (outside the Holm family: unadjusted, descriptive)", "",
           "| comparison | n | mean diff | 95% t-interval | sign-flip p |", "|---|---|---|---|---|"]
  for label, arm, comparator, value in claims_stats.secondary_pairs(study):
    seeds, diffs = paired_stats.differences(claims_stats.per_seed(runs, arm, value),
                                            claims_stats.per_seed(runs, comparator, value))
    if not seeds:
      continue
    s = paired_stats.paired(diffs)
    lines.append(f"| {label} | {s.n} | {_f(s.mean, 4, True)} | {_interval(s)} | {_p(s.p)} |")
  return lines + [""]


def _arm_lines(study: plan.Study, runs, state: claims.State) -> list[str]:
  lines = ["## Arms (means over seeds, for orientation only: the claims above rest on paired differences)", "",
           "| arm | loss | shape | L | lr | generations/step | n | test pass@1 | late entropy | "
           + " | ".join(f"gens to {t}" for t in claims_stats.TARGETS) + " | GRPO clip fraction |",
           "|---|---|---|---|---|---|---|---|---|" + "---|" * len(claims_stats.TARGETS) + "---|"]
  for key, arm in study.arms().items():
    rs = list(runs.get(key, {}).values())
    if not rs:
      lines.append(f"| {key} | {arm.loss} | {arm.shape} | {arm.lag} | {state.chosen.get(arm.loss, 'untuned')} | | 0 | "
                   + "| " * (3 + len(claims_stats.TARGETS)))
      continue
    split = "test" if arm.task == "arithmetic" else "test_hard"
    gens = [f"{np.median([r.generations_to(t) for r in rs]):.0f}" for t in claims_stats.TARGETS]
    clip = np.mean([r.train_mean("clip_fraction") for r in rs]) if arm.loss.startswith("grpo") else float("nan")
    pass1 = f"{np.mean([r.test(split, 'pass@1') for r in rs]):.3f}{' (hard half)' if split != 'test' else ''}"
    lines.append(f"| {key} | {arm.loss} | {arm.shape} | {arm.lag} | {rs[0].cell.lr:g} | "
                 f"{rs[0].generations_per_step:g} | {len(rs)} | {pass1} | "
                 f"{np.mean([claims_stats.late_entropy(r) for r in rs]):.3f} | " + " | ".join(gens)
                 + f" | {_f(clip, 4) if np.isfinite(clip) else ''} |")
  lines.append("\ngens to t: median over seeds of the generations before validation pass@1 first reached t (inf: "
               "never; nan: the warm start was already there).")
  return lines + [""]


def pairing_problems(study: plan.Study, runs_dir: str, runs) -> list[str]:
  """Differences beyond the method's fields between the recorded configs of cells paired by seed."""
  pairs = [(c.arm, c.comparator) for c in claims_stats.claims(study)]
  pairs += [(a, b) for _, a, b, _ in claims_stats.secondary_pairs(study)]
  problems = []
  for arm, comparator in pairs:
    for seed in sorted(set(runs.get(arm, {})) & set(runs.get(comparator, {}))):
      records = [results.read_json(os.path.join(runs_dir, runs[a][seed].cell.name, "config.json"))
                 for a in (arm, comparator)]
      diff = plan.config_differences(*records)
      if diff:
        problems.append(f"{arm} vs {comparator} seed {seed}: {', '.join(diff)}")
  return problems


def _wall_lines(runs_dir: str, study: plan.Study, state: claims.State, elapsed: Optional[float]) -> list[str]:
  finals = [results.read_json(os.path.join(d, results.FINAL_EVAL)) for d, _, files in os.walk(runs_dir)
            if results.FINAL_EVAL in files]
  warm = sum((w or {}).get("wall_seconds", 0.0) for w in state.warm.values())
  total = sum(f["wall_seconds"] for f in finals) + warm
  per_step = [f["train_seconds"] / f["trainer_steps"] for f in finals if f.get("trainer_steps")]
  median = lambda xs: float(np.median(xs)) if xs else float("nan")  # noqa: E731
  lines = ["## Wall time", "", f"{len(finals)} runs: {total / 60:.1f} min of run time, warm starts included "
           f"({warm / 60:.1f} min); per run {median([f['wall_seconds'] for f in finals]):.0f} s median, "
           f"{median(per_step):.2f} s per trainer step (evals and the test eval included)."]
  if elapsed is not None:
    lines.append(f"This invocation: {elapsed / 60:.1f} min.")
  return lines + [""]


def _command_lines(study: plan.Study, runs_dir: str, runs, state: claims.State) -> list[str]:
  cells = [r.cell for by_seed in runs.values() for r in by_seed.values()]
  cells += [c for loss, scores in state.tuning.items() for c in plan.tuning_cells(study, loss, sorted(scores))]
  task = "arithmetic"
  lines = ["## Rerunning one cell", "",
           f"The harness, training and the test eval: `python -m experiments.study --task {task} --out <dir> --runs "
           f"{runs_dir}{' --smoke' if study.smoke else ''} --cell <cell>` (the cell names below). Training alone, the "
           "same config exactly (metrics.jsonl holds the validation curve; the test eval is the harness's):", "",
           "<details><summary>python -m oapl_jax.main commands, one per cell</summary>", ""]
  for cell in cells:
    warm = claims.warm_dir_of(runs_dir, cell.arm.task)
    lines.append(f"- `{cell.name}`: `{plan.command(study, cell, warm, os.path.join(runs_dir, cell.name))}`")
  return lines + ["", "</details>", ""]


def write_report(study: plan.Study, runs_dir: str, out_dir: str, state: claims.State,
                 elapsed: Optional[float] = None) -> str:
  os.makedirs(out_dir, exist_ok=True)
  runs = collect(study, runs_dir, state)
  outcomes = claims_stats.evaluate_claims(study, runs, state.warm)
  lines = [f"# The paper's claims in miniature{' (smoke)' if study.smoke else ''}", "",
           f"Tasks: A `configs/claims.py:arithmetic` (the demo's slip-fix addition), B `configs/claims.py:hard_tail` "
           f"(the teacher always wrong on odd first operands). S = {study.steps} trainer steps per run, "
           f"B = {study.batch} prompts x 8 per step, policy eval every {study.every_steps} steps. "
           f"Runs in `{runs_dir}`.", ""]
  if state.stopped:
    lines += [f"**The study stopped: {state.stopped}**", ""]
  if state.pilot is not None:
    went_on = "" if state.pilot.ok or not study.smoke else " (smoke: went on)"
    lines += ["## Pilot", "", state.pilot.message + went_on, "", *_headroom_lines(study, runs_dir), ""]
  lines += rules_lines(study) + _warm_lines(state) + _tuning_lines(study, runs_dir, state)
  lines += _claim_lines(outcomes) + _secondary_lines(study, runs) + _arm_lines(study, runs, state)
  problems = pairing_problems(study, runs_dir, runs)
  lines += ["## Pairing check", "", "Recorded configs of cells paired by seed differ only in the method's fields."
            if not problems else "**Paired cells differ beyond the method:** " + "; ".join(problems), ""]
  lines += _wall_lines(runs_dir, study, state, elapsed)
  names = claims_plots.plot_all(study, runs_dir, runs, state, outcomes, out_dir)
  lines += ["## Plots", "", *(f"![{n}]({n})" for n in names), ""]
  lines += _command_lines(study, runs_dir, runs, state)
  path = os.path.join(out_dir, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path
