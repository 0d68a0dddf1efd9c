"""The claims study's report: rules stated in advance, the pilot, tuning, one paired test per claim (Holm over
the five), descriptive tables, the pairing check, wall time, per-cell commands, and PNGs with 95% bands.
Every number comes from a run directory (final_eval.json, metrics.jsonl) or a warm start's eval.json."""
from __future__ import annotations

import os
from typing import Optional

import numpy as np

from experiments import claims, claims_plots, claims_stats, paired_stats, plan, results, tuning, tuning_record


def collect(study: plan.Study, runs_dir: str, state: claims.State) -> dict[str, dict[int, results.RunResult]]:
  """arm key -> main seed -> finished run (the arm's chosen learning rate)."""
  out = {}
  for key, arm in study.arms().items():
    if arm.loss not in state.chosen:
      continue
    found = {s: r for s in study.seeds if (r := results.load(runs_dir, study.cell(arm, state.chosen[arm.loss], s)))}
    if found:
      out[key] = found
  return out


def _f(x: Optional[float], digits: int = 3, sign: bool = False) -> str:
  return "nan" if x is None or not np.isfinite(x) else f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _interval(s: paired_stats.Paired) -> str:
  return f"[{_f(s.ci_low, 4, True)}, {_f(s.ci_high, 4, True)}]"


def _p(x: float) -> str:
  return "n/a" if not np.isfinite(x) else f"{x:.4f}"


def _setting(loss: str, setting) -> str:
  return f"lr {setting[0]:g}, {plan.KNOBS[loss][0].rsplit('.', 1)[1]} {setting[1]:g}"


def rules_lines(study: plan.Study) -> list[str]:
  grids = "; ".join(f"{loss}: lr {{{', '.join(f'{lr:g}' for lr in study.learning_rates)}}} x "
                    f"{plan.KNOBS[loss][0].rsplit('.', 1)[1]} {{{', '.join(f'{v:g}' for v in sorted({v for _, v in study.grid(loss)}))}}}"
                    for loss in study.losses())
  return [
      "## Rules fixed before any run", "",
      f"- Pilot: every primary arm ({', '.join(a.name for a in study.primary_arms())}) at its loss's middle grid "
      f"point on the tuning seed {study.tune_seeds[0]}. The main OAPL arm's validation pass@1 at mid-run (step "
      f"{study.steps // 2}) must be at least the warm start's + {tuning.PILOT_GAIN}, else the study stops (change the "
      f"task, never the losses). Headroom: each primary arm's validation pass@1 at mid-run must be below "
      f"{tuning.HEADROOM}; if any arm is not, the primary metric is the area under the validation pass@1 curve "
      "instead of the final test pass@1.",
      f"- Tuning, the same budget for every method: {len(study.grid('oapl'))} points per loss on "
      f"seed{'s' if len(study.tune_seeds) > 1 else ''} {', '.join(map(str, study.tune_seeds))} (never a main seed), "
      f"each loss's learning rate x its own binding knob ({grids})"
      + (f"; OAPL's beta2 set by strength from the pilot (targets {', '.join(map(str, tuning.STRENGTH_TARGETS))} "
         "for beta2's share of the residual)" if study.beta2_by_strength else "") + ". The winner is the point with "
      "the largest area under the validation pass@1 curve (mean over the tuning seeds; ties: the smaller lr, then "
      "the smaller knob). Every arm of a loss uses the loss's chosen point. A winner at an edge of its grid adds "
      f"the next point on that axis (lr: the 1-3-10 series; the knob: /2 or x2, by decades for beta2 by strength), "
      f"at most {tuning.MAX_EXTENSIONS} times.",
      f"- Claims 2 and 4 compare at matched validation pass@1 (per seed: the highest level both arms reached, each "
      "arm's metric interpolated on the eval grid at its first crossing); their matched-steps forms are reported "
      f"beside them. Claim 3 is L = {study.long_lag} ({study.steps // study.long_lag} windows) against "
      f"L = {study.lag} with a non-inferiority margin of {claims_stats.NONINFERIORITY}. Claim 5 takes OAPL at its "
      "best of its three arms (p x 3 for that choice).",
      f"- Power: {plan.PLANNED_N['claim']} RL seeds for every arm a claim reads, {plan.PLANNED_N['baseline']} for "
      f"the rest. The exact sign-flip p cannot fall below 2/2^n ({paired_stats.min_p(5):.4f} at n = 5, "
      f"{paired_stats.min_p(8):.4f} at n = 8), and Holm's first threshold is 0.05 / 5 = 0.01.",
      f"- Pairing: one warm start, seeds {', '.join(map(str, study.seeds))}; paired cells share the seed, "
      "so the prompt order and every eval draw; their configs may differ only in " + ", ".join(plan.METHOD_KEYS) + ".",
      f"- Verdicts: {paired_stats.VERDICT_RULE}", ""]


def _pilot_lines(study: plan.Study, runs_dir: str, state: claims.State) -> list[str]:
  lines = ["## Pilot (every primary arm, its middle grid point, the tuning seed)", "", state.pilot.message, "",
           "| arm | setting | val pass@1 at step 0 | at mid-run | at the end | headroom |", "|---|---|---|---|---|---|"]
  for cell in plan.pilot_cells(study):
    r = results.load(runs_dir, cell)
    h = state.headroom.get(cell.arm.name)
    if r is None or not r.curve() or h is None:
      lines.append(f"| {cell.arm.name} | {_setting(cell.arm.loss, cell.setting)} | not run | | | |")
      continue
    curve = r.curve()
    lines.append(f"| {cell.arm.name} | {_setting(cell.arm.loss, cell.setting)} | {curve[0][1]:.3f} | {h.mid:.3f} "
                 f"(step {h.step}) | {curve[-1][1]:.3f} | {'ok' if h.ok else f'**no** (>= {tuning.HEADROOM})'} |")
  lines += ["", f"Primary metric: {tuning.PRIMARY_METRICS[state.primary_metric]}."]
  if state.pilot_missing:
    lines[-1] = (lines[-1][:-1] + f", but only among the arms whose pilot ran: **not run yet: "
                 f"{', '.join(state.pilot_missing)}**.")
  return lines + [""]


def smoke_line(state: claims.State) -> str:
  """What a smoke study is, and whether it went on past the pilot's stop rule (a smoke does; a study stops)."""
  failed = state.pilot is not None and not state.pilot.ok
  return ("**A smoke study**: tiny runs that check every stage works, not the claims; its verdicts say nothing."
          + (f" Its pilot failed the stop rule ({state.pilot.message}) and it went on, as only a smoke does."
             if failed else ""))


def _warm_lines(state: claims.State) -> list[str]:
  lines = ["## The warm start (one checkpoint, every run starts from it)", "",
           "| set | pass@1 | pass@k (largest k) |", "|---|---|---|"]
  for split in ("val", "test"):
    for name, m in (state.warm or {}).get(split, {}).items():
      kmax = max(int(k[5:]) for k in m if k.startswith("pass@"))
      lines.append(f"| {split}: {name} | {m['pass@1']:.3f} | pass@{kmax} {m[f'pass@{kmax}']:.3f} |")
  if state.warm and "command" in state.warm:
    lines += ["", f"Made in {state.warm.get('build_seconds', float('nan')):.0f} s by `{state.warm['command']}`."]
  return lines + [""]


def _tuning_lines(study: plan.Study, runs_dir: str, state: claims.State) -> list[str]:
  seeds = ", ".join(map(str, study.tune_seeds))
  lines = [f"## Tuning (seed{'s' if len(study.tune_seeds) > 1 else ''} {seeds}; validation pass@1 of the current "
           "policy on the step grid; with several seeds the AUC is their mean, the final pass@1 the first's)", "",
           *([state.strength.message, ""] if state.strength else []),
           "| loss | tuned in | lr | knob | AUC (mean val pass@1) | final val pass@1 | chosen |",
           "|---|---|---|---|---|---|---|"]
  unrun = [loss for loss, scores in state.tuning.items() if all(v is None for v in scores.values())]
  partial = [loss for loss, scores in state.tuning.items() if loss not in unrun and None in scores.values()]
  for loss, scores in state.tuning.items():
    if loss in unrun:
      continue
    for setting in sorted(scores):
      cells = plan.tuning_cells(study, loss, [setting])
      _, final = tuning_record.point(study, runs_dir, state.recorded, loss, setting)
      ran = sum(results.is_done(os.path.join(runs_dir, c.name)) for c in cells)
      score = _f(scores[setting]) if scores[setting] is not None else (
          f"{ran} of {len(cells)} seeds run" if ran else "not run")
      lines.append(f"| {loss} | {study.tuning_arm(loss).name} | {setting[0]:g} | "
                   f"{plan.KNOBS[loss][0].rsplit('.', 1)[1]} {setting[1]:g} | {score} | {_f(final)} | "
                   f"{'yes' if tuple(state.chosen.get(loss, ())) == tuple(setting) else ''} |")
  if partial:
    lines.append(f"\n**Grid not finished** for {', '.join(partial)}: the point marked chosen is the best of the "
                 "points that ran (interim; the rule picks among all of them).")
  if unrun:
    done = []
    for loss in unrun:
      cells = plan.tuning_cells(study, loss)
      ran = sum(results.is_done(os.path.join(runs_dir, c.name)) for c in cells)
      done.append(f"{loss} ({len(study.grid(loss))} points, {ran} of {len(cells)} runs done)")
    lines.append(f"\nNo point finished on every tuning seed yet: {', '.join(done)}.")
  for loss, added in state.extended.items():
    lines.append(f"\n{loss}: the winner sat at an edge; added {', '.join(map(str, added))}.")
  if state.record is not None:
    record = state.record
    lines.append(f"\n**Tuning taken from a record, not run here** ({', '.join(record.losses)}): "
                 f"{record.path}{f' ({record.source})' if record.source else ''}. The main seeds use its chosen "
                 "points.")
    for loss, r in state.recorded.items():
      if off_grid := [p for p in study.grid(loss) if p not in r.scores]:
        lines.append(f"\n{loss}: this study's grid (after its pilot) has points the record lacks: {off_grid}.")
  edges = [loss for loss, scores in state.tuning.items() if loss in state.chosen and tuning.extension(
      {p: v for p, v in scores.items() if v is not None}, loss == "oapl" and study.beta2_by_strength)]
  if edges and not study.smoke:
    lines.append(f"\nWinners still at an edge of their grid: {', '.join(edges)}.")
  return lines + [""]


def write_tuning_record(study: plan.Study, runs_dir: str, state: claims.State, out_dir: str) -> Optional[str]:
  """OUT/tuning.json with every loss whose grid finished (tuning_record), or None when none has."""
  losses = {}
  for loss, scores in state.tuning.items():
    if loss not in state.chosen or not scores or None in scores.values():
      continue
    points = {s: tuning_record.point(study, runs_dir, state.recorded, loss, s) for s in scores}
    losses[loss] = tuning_record.Recorded(scores=dict(scores), chosen=tuple(state.chosen[loss]),
                                          extended=list(state.extended.get(loss, [])),
                                          finals={s: final for s, (_, final) in points.items()},
                                          curves={s: curve for s, (curve, _) in points.items() if curve})
  if not losses:
    return None
  from_runs = [loss for loss in losses if loss not in state.recorded]
  recorded = state.record.source or state.record.path if state.record is not None else ""
  source = (f"the tuning runs in {runs_dir}" if not recorded else recorded if not from_runs else
            f"{', '.join(state.recorded)}: {recorded}; {', '.join(from_runs)}: the tuning runs in {runs_dir}")
  path = os.path.join(out_dir, tuning_record.FILE)
  tuning_record.write(path, tuning_record.Record(study.name, tuple(study.tune_seeds), source, losses))
  return path


def _claim_lines(outcomes: list[claims_stats.Outcome]) -> list[str]:
  count = "five" if len(outcomes) == 5 else f"{len(outcomes)} of the five (a claim-1 study has no L = 100 arm)"
  lines = [f"## The claims (paired by seed; Holm over the {count})", "",
           "| # | claim | arm vs comparator | n (planned) | mean diff | 95% t-interval | sign-flip p | Holm p | "
           "verdict |",
           "|---|---|---|---|---|---|---|---|---|"]
  for o in outcomes:
    s, c = o.measured(), o.claim
    lines.append(f"| {c.key} | {c.title} | {o.arm} vs {c.comparator} | {s.n} ({o.planned_n}) | {_f(s.mean, 4, True)} | "
                 f"{_interval(s)} | {_p(s.p)} | {_p(o.holm_p)} | **{o.verdict}** |")
  lines.append("")
  for o in outcomes:
    per = ", ".join(f"seed {s}: {d:+.4f}" for s, d in zip(o.seeds, o.measured().diffs)) or "none"
    extra = f" The test adds the margin {o.claim.shift:+.4f} to each." if o.claim.shift else ""
    if o.claim.key == "5" and o.summary.n:
      extra = (f" As a ratio: GRPO needs {2 ** o.summary.mean:.2f}x the generations "
               f"(95% interval {2 ** o.summary.ci_low:.2f}x to {2 ** o.summary.ci_high:.2f}x; the paper reports ~3x)."
               if np.isfinite(o.summary.ci_low) else f" As a ratio: {2 ** o.summary.mean:.2f}x.")
    lines.append(f"{o.claim.key}. {o.claim.statistic}{' (' + o.claim.units + ')' if o.claim.units else ''}. "
                 f"Differences: {per}.{extra}")
  return lines + [""]


def _secondary_lines(study: plan.Study, runs, primary: str) -> list[str]:
  lines = ["## Other paired comparisons (outside the Holm family: unadjusted, descriptive)", "",
           "| comparison | n | mean diff | 95% t-interval | sign-flip p |", "|---|---|---|---|---|"]
  for row in claims_stats.secondary_pairs(study, primary):
    label = row[0]
    seeds, diffs = claims_stats.secondary_diffs(runs, row)
    if not seeds:
      continue
    s = paired_stats.paired(diffs)
    lines.append(f"| {label} | {s.n} | {_f(s.mean, 4, True)} | {_interval(s)} | {_p(s.p)} |")
  return lines + [""]


def _arm_lines(study: plan.Study, runs, state: claims.State) -> list[str]:
  lines = ["## Arms (means over seeds, for orientation only: the claims above rest on paired differences)", "",
           "| arm | loss | shape | L | setting | generations/step | n | test pass@1 | collapsed | late entropy | "
           + " | ".join(f"gens to {t}" for t in claims_stats.TARGETS) + " | GRPO clip fraction |",
           "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(claims_stats.TARGETS) + "---|"]
  warm = warm_test_pass1(state)
  for key, arm in study.arms().items():
    rs = list(runs.get(key, {}).values())
    if not rs:
      chosen = _setting(arm.loss, state.chosen[arm.loss]) if arm.loss in state.chosen else "untuned"
      lines.append(f"| {key} | {arm.loss} | {arm.shape} | {arm.lag} | {chosen} | | 0 | "
                   + "| " * (4 + len(claims_stats.TARGETS)))
      continue
    gens = [f"{np.median([r.generations_to(t) for r in rs]):.0f}" for t in claims_stats.TARGETS]
    clip = np.mean([r.train_mean("clip_fraction") for r in rs]) if arm.loss.startswith("grpo") else float("nan")
    pass1 = f"{np.mean([r.test_mean('pass@1') for r in rs]):.3f}"
    collapsed = f"{sum(r.test_mean('pass@1') < warm for r in rs)}/{len(rs)}" if np.isfinite(warm) else ""
    lines.append(f"| {key} | {arm.loss} | {arm.shape} | {arm.lag} | {_setting(arm.loss, rs[0].cell.setting)} | "
                 f"{rs[0].generations_per_step:g} | {len(rs)} | {pass1} | {collapsed} | "
                 f"{np.mean([claims_stats.late_entropy(r) for r in rs]):.3f} | " + " | ".join(gens)
                 + f" | {_f(clip, 4) if np.isfinite(clip) else ''} |")
  lines.append("\ngens to t: median over seeds of the generations before validation pass@1 first reached t (inf: "
               "never; nan: the warm start was already there). collapsed: seeds whose final test pass@1 fell below "
               f"the warm start's ({_f(warm)}).")
  return lines + [""]


def warm_test_pass1(state: claims.State) -> float:
  """The warm start's test pass@1, averaged over the test sets as a run's is (nan when unknown)."""
  sets = (state.warm or {}).get("test", {})
  return float(np.mean([m["pass@1"] for m in sets.values()])) if sets else float("nan")


def pairing_problems(study: plan.Study, runs_dir: str, runs) -> list[str]:
  """Differences beyond the method's fields between the recorded configs of cells paired by seed."""
  pairs = [(a, c.comparator) for c in claims_stats.claims(study) for a in (c.candidates or (c.arm,))]
  pairs += [(row[1], row[2]) for row in claims_stats.secondary_pairs(study)]
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
  finals = [results.read_json(os.path.join(d, results.FINAL_EVAL))
            for d, _, files in os.walk(os.path.join(runs_dir, study.name)) if results.FINAL_EVAL in files]
  build = (state.warm or {}).get("build_seconds", float("nan"))  # from the warm start's record (made once)
  warm = (state.warm or {}).get("wall_seconds", 0.0)  # what the study spent on it: the build if it made it, the eval
  total = sum(f["wall_seconds"] for f in finals) + warm
  per_step = [f["train_seconds"] / f["trainer_steps"] for f in finals if f.get("trainer_steps")]
  median = lambda xs: float(np.median(xs)) if xs else float("nan")  # noqa: E731
  lines = ["## Wall time", "", f"{len(finals)} runs of {study.name}: {total / 60:.1f} min of run time with the "
           f"warm start's {warm / 60:.1f} min (its record: built in {build / 60:.1f} min; less here means it was "
           f"reused and only evaluated); per run {median([f['wall_seconds'] for f in finals]):.0f} s median, "
           f"{median(per_step):.2f} s per trainer step (evals and the test eval included)."]
  if elapsed is not None:
    lines.append(f"This invocation: {elapsed / 60:.1f} min.")
  return lines + [""]


def _command_lines(study: plan.Study, runs_dir: str, runs, state: claims.State) -> list[str]:
  cells = [r.cell for by_seed in runs.values() for r in by_seed.values()]
  cells += [c for loss, scores in state.tuning.items() for c in plan.tuning_cells(study, loss, sorted(scores))]
  cells += [c for c in plan.pilot_cells(study) if c not in cells]
  wrapped = os.path.relpath(plan.TASK_CONFIG, plan.REPO) + ":"
  user_spec = study.config[len(wrapped):] if study.config.startswith(wrapped) else study.config
  which = f"--task {study.name}" if study.name in plan.NAMED_TASKS else f"--config {user_spec.removesuffix(',smoke')}"
  warm = claims.warm_dir_of(runs_dir, study)
  lines = ["## Rerunning one cell", "",
           f"The harness, training and the test eval: `python -m experiments.study {which} --out <dir> --runs "
           f"{runs_dir}{' --smoke' if study.smoke else ''} --cell <cell>` (the cell names below). Training alone, the "
           "same config exactly (metrics.jsonl holds the validation curve; the test eval is the harness's):", "",
           "<details><summary>python -m oapl_jax.main commands, one per cell</summary>", ""]
  for cell in cells:
    if results.load(runs_dir, cell) is not None:
      lines.append(f"- `{cell.name}`: `{plan.command(study, cell, warm, os.path.join(runs_dir, cell.name))}`")
  return lines + ["", "</details>", ""]


def write_report(study: plan.Study, runs_dir: str, out_dir: str, state: claims.State,
                 elapsed: Optional[float] = None) -> str:
  os.makedirs(out_dir, exist_ok=True)
  runs = collect(study, runs_dir, state)
  outcomes = claims_stats.evaluate_claims(study, runs, state.primary_metric)
  lines = [f"# The paper's claims in miniature: {study.name}{' (smoke)' if study.smoke else ''}", "",
           f"Config `{study.config}`. S = {study.steps} trainer steps per run, B = {study.batch} prompts per step, "
           f"lags L = {study.lag} and {study.long_lag}, policy eval every {study.every_steps} steps. "
           f"Runs in `{runs_dir}`.", ""]
  if state.checked is not None:
    lines += [f"Config and data checked before any run (run/check, the task's own checks, the reward probed): "
              f"{len(state.checked)} warning(s){': ' + '; '.join(state.checked) if state.checked else ''}.", ""]
  if state.stopped:
    lines += [f"**The study stopped: {state.stopped}**", ""]
  if study.smoke:
    lines += [smoke_line(state), ""]
  lines += rules_lines(study) + _warm_lines(state)
  if state.pilot is not None:
    lines += _pilot_lines(study, runs_dir, state)
  lines += _tuning_lines(study, runs_dir, state)
  lines += _claim_lines(outcomes) + _secondary_lines(study, runs, state.primary_metric)
  lines += _arm_lines(study, runs, state)
  problems = pairing_problems(study, runs_dir, runs)
  lines += ["## Pairing check", "", "Recorded configs of cells paired by seed differ only in the method's fields."
            if not problems else "**Paired cells differ beyond the method:** " + "; ".join(problems), ""]
  lines += _wall_lines(runs_dir, study, state, elapsed)
  names = claims_plots.plot_all(study, runs_dir, runs, state, outcomes, out_dir)
  lines += ["## Plots", "", *(f"![{n}]({n})" for n in names), ""]
  lines += _command_lines(study, runs_dir, runs, state)
  write_tuning_record(study, runs_dir, state, out_dir)
  path = os.path.join(out_dir, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path
