"""The claims study from the command line, on any task: check the config and data, make (or reuse) the warm
start, then run (or resume) every cell in priority order, then write the report.

  python -m experiments.study --task arithmetic --out reports/claims_v3              # configs/claims.py:arithmetic
  python -m experiments.study --config configs/own_task.py --out reports/own_task    # any training config
  python -m experiments.study --config configs/own_task.py --smoke --out /tmp/own    # CI size, minutes
  python -m experiments.study --task arithmetic --out reports/claims_v3 --stage tuning  # warm start, pilot, grid
  python -m experiments.study --task arithmetic --out reports/claims_v3 --collect   # report only
  python -m experiments.study --config configs/own_task.py --set loop.batch_prompts=4 --out reports/own_b4  # reshaped
  python -m experiments.study --config configs/claims.py:code --claim1_only --tune_seeds 1000,1001 \
      --beta2_by_strength --shard 0/2 --out reports/code   # claim 1 only, two tuning seeds, one of two processes
  python -m experiments.study --config configs/claims.py:code ... --tuned reports/code/tuning.json  # reuse a tuning

--task NAME is configs/claims.py:NAME (arithmetic, hard_tail); --config FILE[:ARG] is the file a user trains with
(experiments/task_config.py splits its eval sets into validation and test: sets named test* are the test).
Every finished tuning grid is recorded in OUT/tuning.json; --tuned reads one back (checked: the same study and
tuning seeds, the recorded choice the rule's winner), so the main seeds can run where the tuning runs are gone.
A config or data problem stops the study before the warm start, naming the file (exit 2).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

from experiments import claims, claims_report, plan, run_archive, stopping, task_config, tuning_record


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m experiments.study", description=__doc__.split("\n")[0])
  which = parser.add_mutually_exclusive_group()
  which.add_argument("--task", choices=plan.NAMED_TASKS, help="a named study task (configs/claims.py:NAME)")
  which.add_argument("--config", help="FILE[:ARG]: any training config (records tasks included)")
  parser.add_argument("--out", required=True, help="the report directory (report.md and PNGs)")
  parser.add_argument("--runs", help="run directories (default runs/claims[_smoke])")
  parser.add_argument("--smoke", action="store_true", help="tiny: S = 4 steps, 2 seeds, one tuning point (CI)")
  parser.add_argument("--collect", action="store_true", help="only write the report from the runs that exist")
  parser.add_argument("--cell", help="run (or resume) only this cell, then write the report")
  parser.add_argument("--stage", choices=claims.STAGES, default="all",
                      help="stop after this stage (pilot: the warm start and the pilot; tuning: and the grid)")
  parser.add_argument("--seeds", help="main seeds, comma-separated (default 0..7)")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                      help="reshape the task for the study (every cell and the warm start), e.g. loop.batch_prompts=4")
  parser.add_argument("--no_secondary", action="store_true", help="skip opmd, asymre and the beta1 probe")
  parser.add_argument("--claim1_only", action="store_true",
                      help="only claim 1's arms (the main OAPL arm, off-by-one GRPO): their pilot, tuning, main seeds")
  parser.add_argument("--tune_seeds", default=str(plan.TUNE_SEED),
                      help="tuning seeds, comma-separated; a point's AUC is the mean over them (default %(default)s)")
  parser.add_argument("--beta2_by_strength", action="store_true",
                      help="set OAPL's beta2 grid from the pilot's measured beta2 share (tuning.STRENGTH_TARGETS)")
  parser.add_argument("--tuned", metavar="FILE", help="take the tuning from this record (a study's tuning.json: "
                      "the same study and tuning seeds) instead of running its grid; the pilot still runs")
  parser.add_argument("--archive", action="store_true", help="also write OUT/runs.tar.gz: the finished runs without "
                      "checkpoints (what --collect reads), so the report can be collected on another machine")
  parser.add_argument("--shard", metavar="I/N", help="process I of N sharing each stage's cells (each takes the next "
                      "cell no other has claimed), waiting for the others before the next stage (N processes, e.g. one "
                      "per core; shard 0 makes the warm start)")
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
  try:
    from oapl_jax.run import files  # pylint: disable=import-outside-toplevel
    sets = dict(files.parse_override(s) for s in args.set)
    tune_seeds = tuple(int(s) for s in args.tune_seeds.split(","))
    if set(tune_seeds) & set(seeds or plan.MAIN_SEEDS):
      raise ValueError(f"--tune_seeds {args.tune_seeds}: a tuning seed must never be a main seed")
    shard = claims.parse_shard(args.shard)
    study = plan.make_study(args.task, args.config, smoke=args.smoke, secondary=not args.no_secondary, seeds=seeds,
                            sets=sets, tune_seeds=tune_seeds, claim1_only=args.claim1_only,
                            beta2_by_strength=args.beta2_by_strength)
    record = tuning_record.read(args.tuned, study.name, tune_seeds) if args.tuned else None
  except Exception as e:  # pylint: disable=broad-except  # a bad path, variant or import in the config file
    print(f"error: {e}", file=sys.stderr)
    return 2
  runs_dir = args.runs or os.path.join("runs", "claims_smoke" if args.smoke else "claims")
  claims.enable_compile_cache(os.path.join(runs_dir, "jax_cache"))
  start = time.time()
  runner = claims.Runner(study, runs_dir, collect=args.collect, only=args.cell, stage=args.stage, shard=shard,
                         record=record)
  try:
    with stopping.one_line_stop("claims"):
      state = runner.study_all()
  except task_config.ConfigRefused as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  path = claims_report.write_report(runner.study, runs_dir, args.out, state, elapsed=time.time() - start)
  print(f"[claims] report: {path} ({time.time() - start:.0f}s)", flush=True)
  if args.archive:
    print(f"[claims] {run_archive.write_study(runs_dir, runner.study, args.out)}", flush=True)
  if state.stopped:
    print(f"[claims] stopped: {state.stopped}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
