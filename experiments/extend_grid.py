"""A tuning grid extended past an edge winner, by a rule stated before the runs: a winner at an edge of an axis
gets the next value on that axis (the grid's own spacing continued: lr x ~3.16, OAPL beta2 /2, GRPO clip /2),
once, crossed with every value of the other axis; the winner is then re-chosen on the extended grid by the
study's rule (tuning.choose: the largest validation AUC, ties to the smaller setting). Optionally the claim-1
arms (the main OAPL arm and off-by-one GRPO) rerun at the re-chosen settings on the main seeds, paired.

  python -m experiments.extend_grid --config configs/claims.py:arithmetic,digits3 --runs runs/claims_v3 \
      --point oapl:3e-5:0.05 --point oapl:1e-4:0.05 --point oapl:3e-4:0.05 --point grpo:1e-3:0.1 ...
  ... --claim1                 # then the claim-1 arms at the extended winners, 8 seeds, paired
  python -m experiments.extend_grid --config configs/own_task.py --set loop.batch_prompts=4 ...  # a reshaped study

The runs share the study's run directories (same cell names), so the study's reports see them as cells.
"""
from __future__ import annotations

import argparse
import os
import sys

from experiments import claims, paired_stats, plan, results, tuning


def scores(runner: claims.Runner, loss: str, settings) -> dict:
  """setting -> validation AUC, the mean over the tuning seeds (None: not every seed's run finished)."""
  cells = plan.tuning_cells(runner.study, loss, settings)
  return tuning.mean_auc_by_setting((cell, results.load(runner.runs_dir, cell)) for cell in cells)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", required=True)
  p.add_argument("--runs", required=True)
  p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                 help="the study's own --set reshapes (the same ones, so the same directories and warm start)")
  p.add_argument("--point", action="append", default=[], help="LOSS:LR:KNOB, a tuning point to add")
  p.add_argument("--claim1", action="store_true", help="rerun the claim-1 arms at the extended winners")
  p.add_argument("--collect", action="store_true", help="run nothing; print what exists")
  args = p.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from oapl_jax.run import files  # pylint: disable=import-outside-toplevel
  sets = dict(files.parse_override(s) for s in args.set)
  study = plan.make_study(None, args.config, secondary=False, sets=sets)
  claims.enable_compile_cache(os.path.join(args.runs, "jax_cache"))
  runner = claims.Runner(study, args.runs, collect=args.collect)
  warm = claims.warm_dir_of(args.runs, study)
  if not os.path.exists(os.path.join(warm, "eval.json")):
    print(f"error: no warm start at {warm} (this tool reuses the study's; run the study first)", file=sys.stderr)
    return 2
  added: dict = {}
  for point in args.point:
    loss, lr, knob = point.split(":")
    added.setdefault(loss, []).append((float(lr), float(knob)))
  for loss, settings in added.items():
    for cell in plan.tuning_cells(study, loss, settings):
      runner.run("grid extension", cell)
  chosen = {}
  for loss in plan.PRIMARY_LOSSES[:2]:
    grid = scores(runner, loss, study.grid(loss))
    extra = scores(runner, loss, added.get(loss, []))
    every = {s: v for s, v in {**grid, **extra}.items() if v is not None}
    ran = {s: v for s, v in grid.items() if v is not None}
    if not ran or not every:  # a check directory that holds only the added points
      print(f"[extend] {loss}: the grid has not run here", flush=True)
    else:
      old, chosen[loss] = tuning.choose(ran), tuning.choose(every)
      print(f"[extend] {loss}: grid winner {old} AUC {grid[old]:.4f}; extended winner {chosen[loss]} AUC "
            f"{every[chosen[loss]]:.4f}", flush=True)
    for s, v in sorted(extra.items()):
      print(f"[extend]   added {s}: AUC " + ("not run" if v is None else f"{v:.4f}"), flush=True)
  if not args.claim1:
    return 0
  arms = [study.tuning_arm("oapl"), study.tuning_arm("grpo")]
  for seed in study.seeds:
    for arm in arms:
      runner.run("claim 1 at the extended winners", study.cell(arm, chosen[arm.loss], seed))
  tests = {}
  for arm in arms:
    loaded = {s: results.load(args.runs, study.cell(arm, chosen[arm.loss], s)) for s in study.seeds}
    tests[arm.name] = {s: r.test_mean("pass@1") for s, r in loaded.items() if r is not None}
  oapl, grpo = (tests[a.name] for a in arms)
  seeds, diffs = paired_stats.differences(oapl, grpo)
  s = paired_stats.paired(diffs)
  print(f"[extend] claim 1 at {chosen}: {arms[0].name} - {arms[1].name} test pass@1, n {s.n}: mean {s.mean:+.4f} "
        f"[{s.ci_low:+.4f}, {s.ci_high:+.4f}], sign-flip p {s.p:.4f}; per seed "
        + ", ".join(f"{sd}: {d:+.3f}" for sd, d in zip(seeds, diffs)), flush=True)
  print(f"[extend] means: {arms[0].name} {sum(oapl.values()) / max(len(oapl), 1):.4f}, {arms[1].name} "
        f"{sum(grpo.values()) / max(len(grpo), 1):.4f}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
