"""The lag curve (issue 51): OAPL and GRPO, each against a sampler of the same lag L, on one task.

  python -m experiments.lag_curve --task digits3 --out reports/claims_v4/lag_digits3   # tune, run, report
  python -m experiments.lag_curve --task sort --out reports/claims_v4/lag_sort --seeds 0,1,2
  python -m experiments.lag_curve --task digits3 --out ... --collect                   # report only
  python -m experiments.lag_curve --task sort --smoke --out /tmp/lag_smoke             # CI size, minutes
  for i in 0 1; do python -m experiments.lag_curve --task sort --out ... --shard $i/2 & done  # one per core

The plan and its rules: experiments/lag_plan.py (written before the runs). The runs are the claims study's
(same warm start, same run directories under --runs, same per-run test eval), so an interrupted curve resumes
where it stopped: run the same command again. A stop (Ctrl-C, SIGTERM) ends in one line saying what finished.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

from experiments import claims, lag_plan, lag_report, run_archive, stopping, tuning


def tune_grpo(runner: claims.Runner, task: lag_plan.LagTask) -> tuple[dict, float | None]:
  """GRPO's lr at L = 50: every (lr, tuning seed) cell, the largest mean validation AUC, the grid extended past
  an edge winner (lag_plan.extend)."""
  aucs: dict[float, list] = {}
  lrs = list(task.grpo_lrs)
  for _ in range(lag_plan.MAX_EXTENSIONS + 1):
    cells = lag_plan.tuning_cells(task, runner.study, [lr for lr in lrs if lr not in aucs])
    for cell, result in zip(cells, runner.run_all("grpo lr at L = 50", cells)):
      aucs.setdefault(cell.lr, []).append(tuning.auc(result.curve()) if result is not None else None)
    winner = lag_plan.choose_lr(aucs)
    nxt = lag_plan.extend(lrs, winner) if winner is not None and len(aucs) == len(lrs) else None
    if nxt is None or any(x is None for v in aucs.values() for x in v):
      return aucs, winner
    print(f"[lag] GRPO's lr {winner:g} is at the grid's edge: adding {nxt:g}", flush=True)
    lrs.append(nxt)
  return aucs, lag_plan.choose_lr(aucs)


def run_curve(task: lag_plan.LagTask, runs_dir: str, out: str, smoke: bool, collect: bool,
              seeds: Sequence[int] | None, shard: tuple[int, int] | None = None) -> str:
  study = lag_plan.study_of(task, smoke=smoke)
  seeds = tuple(seeds) if seeds else study.seeds if smoke else lag_plan.SEEDS
  runner = claims.Runner(study, runs_dir, collect=collect, shard=shard)
  warm = runner.warm()
  aucs, lr = tune_grpo(runner, task)
  print(f"[lag] {task.name}: GRPO lr at L = 50 -> {lr} (mean validation AUC per lr: "
        + ", ".join(f"{k:g}: {v}" for k, v in aucs.items()) + ")", flush=True)
  runner = claims.Runner(lag_plan.main_study(study), runs_dir, collect=collect, shard=shard)
  runner.state.warm = warm
  cells = lag_plan.main_cells(task, runner.study, lr, seeds) if lr is not None else []
  runner.run_all("lag curve", cells)
  return lag_report.write(task, runner.study, runs_dir, out, warm, aucs, lr, cells)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m experiments.lag_curve", description=__doc__.split("\n")[0])
  parser.add_argument("--task", required=True, choices=sorted(lag_plan.TASKS))
  parser.add_argument("--out", required=True, help="the report directory (report.md, lag_curve.png)")
  parser.add_argument("--runs", default=os.path.join("runs", "lag"), help="run directories (default runs/lag)")
  parser.add_argument("--seeds", help="main seeds, comma-separated (default 0..4)")
  parser.add_argument("--smoke", action="store_true", help="S = 4, lags 1, 2, 4, 2 seeds (CI size)")
  parser.add_argument("--collect", action="store_true", help="only write the report from the runs that exist")
  parser.add_argument("--archive", action="store_true", help="also write OUT/runs.tar.gz: the finished runs without "
                      "checkpoints (what --collect reads)")
  parser.add_argument("--shard", metavar="I/N", help="process I of N sharing the cells, as experiments.study's "
                      "(one per core; shard 0 makes the warm start)")
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  try:
    shard = claims.parse_shard(args.shard)
  except ValueError as e:
    parser.error(str(e))
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
  claims.enable_compile_cache(os.path.join(args.runs, "jax_cache"))
  start = time.time()
  with stopping.one_line_stop("lag"):
    path = run_curve(lag_plan.TASKS[args.task], args.runs, args.out, args.smoke, args.collect, seeds, shard)
  print(f"[lag] report: {path} ({time.time() - start:.0f}s)", flush=True)
  if args.archive:
    study = lag_plan.study_of(lag_plan.TASKS[args.task], smoke=args.smoke)
    print(f"[lag] {run_archive.write_study(args.runs, study, args.out)}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
