"""Run a config's `get_hyper` sweep: one run directory per point, then one results table and one plot.

  python -m oapl_jax.apps.sweep --config configs/arithmetic.py:sweep --workdir runs/sweep [--parallel 3]
  python -m oapl_jax.apps.sweep --config configs/arithmetic.py:sweep --workdir runs/sweep --print_commands
  python -m oapl_jax.apps.sweep --config configs/math.py --workdir /shared/sweep --launcher launch/slurm.sh \
      --launcher_args="--nodes 2 --partition h100 --job-name oapl-{index}"
  python -m oapl_jax.apps.sweep ... --collect          # only rebuild the table and the plot from what exists
  python -m oapl_jax.apps.sweep ... --config.eval.num_prompts=64   # overrides for every run (not in the names)

`get_hyper(h)` (in the config file, big_vision style) returns a list of override dicts built with
  h.sweep(key, values)  one point per value          h.fixed(key, value)  one point
  h.product([a, b, ...]) every combination           h.zip([a, b, ...])   element-wise, equal lengths
with keys like "config.loop.sync_every". Each point runs as
  python -m oapl_jax.main --config FILE:ARG --workdir WORKDIR/NAME --config.KEY=VALUE ...
where NAME spells the point's overrides (`run_names`). A point whose summary.json says it
finished is skipped; any other is started, and the loop resumes it from its last checkpoint.
At the end (local runs and --collect): WORKDIR/results.{csv,md} and WORKDIR/curves.png (`write_report`).

One warm start for every point (local runs, on unless --no_shared_warmstart): when the config has a warm start
and no point sets a warmstart.*, model.* or task.* field, the warm start is made once, at the base config's seed,
into WORKDIR/warmstart (an HF directory, as experiments/ share theirs), and every point loads it:
--config.model.checkpoint=WORKDIR/warmstart --config.warmstart.steps=0. A swept seed then varies the RL only.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from typing import Sequence

from oapl_jax.apps import cli
from oapl_jax.run import shared_warmstart
from oapl_jax.run.sweep import is_finished, launcher_command, main_command, plan, read_record, run_locally, \
    write_report


def _parse(argv: Sequence[str]):
  """(flags, the --config.FIELD=VALUE overrides every run gets: given anywhere, or after '--')."""
  argv = [a for a in argv if a != "--"]
  p = cli.parser("oapl-sweep", __doc__)
  p.add_argument("--config", required=True, help="FILE.py[:ARG] defining get_config and get_hyper")
  cli.add_help_config(p)
  p.add_argument("--workdir", required=True, help="one sub-directory per run, and the results")
  p.add_argument("--parallel", type=int, default=1, help="local runs at a time")
  p.add_argument("--print_commands", action="store_true", help="print one command per run; run nothing")
  p.add_argument("--launcher", help="a launch/*.sh script: submit each run through it")
  p.add_argument("--launcher_args", default="", help="the launcher's own flags, one string ({run}, {index})")
  p.add_argument("--collect", action="store_true", help="only write the table and plot from the run dirs")
  p.add_argument("--no_shared_warmstart", action="store_true",
                 help="every run makes its own warm start (always so with --launcher)")
  args, rest = p.parse_known_args(argv)
  if args.parallel < 1:
    p.error(f"--parallel must be >= 1, got {args.parallel}")
  if bad := [a for a in rest if not a.startswith("--config.")]:
    p.error(f"unrecognized arguments (only --config.FIELD=VALUE overrides are passed to the runs): {bad}")
  return args, rest


def main(argv: Sequence[str] | None = None) -> int:
  args, extra = _parse(sys.argv[1:] if argv is None else argv)
  began = time.time()
  runs = plan(args.config, args.workdir, extra, share_warmstart=not (args.no_shared_warmstart or args.launcher))
  shared = f"one warm start for all, {runs[0].warmstart}" if runs[0].warmstart else "each run its own warm start"
  print(f"[sweep] {len(runs)} runs from {args.config} under {args.workdir} ({shared})", flush=True)
  warm_built = os.path.exists(os.path.join(shared_warmstart.directory(args.workdir), shared_warmstart.RECORD))
  if args.print_commands or args.launcher:
    if runs[0].warmstart and not warm_built:
      print(shlex.join(shared_warmstart.command(args.config, args.workdir, extra)), flush=True)
    for index, run in enumerate(runs):
      if is_finished(run.workdir):
        print(f"# {run.name}: finished, skipped", flush=True)
        continue
      command = (launcher_command(args.launcher, shlex.split(args.launcher_args), args.config, run, index, extra)
                 if args.launcher else main_command(args.config, run, extra))
      print(shlex.join(command), flush=True)
      if args.launcher and not args.print_commands and subprocess.run(command).returncode:
        print(f"[sweep] the launcher failed for {run.name}; runs after it were not submitted", flush=True)
        return 1
    return 0
  notes = []
  if runs[0].warmstart and (warm_built or not args.collect):
    warm = shared_warmstart.ensure(args.config, args.workdir, extra)
    notes.append(f"Every run loads one warm start ({shared_warmstart.DIRECTORY}/, made once in "
                 f"{warm['wall_seconds']:.0f}s).")
  outcome = {} if args.collect else run_locally(args.config, runs, args.parallel, extra)
  if not args.collect:
    notes.append(f"Wall time of this invocation: {(time.time() - began) / 60:.1f} min, {args.parallel} run(s) at a "
                 f"time (wall_seconds: each run's own).")
  paths = write_report(args.workdir, runs, {r.name: read_record(r.workdir) for r in runs}, notes)
  with open(paths["markdown"]) as f:
    print(f.read(), flush=True)
  print(f"[sweep] results: {paths['csv']}  {paths['markdown']}  curves: {paths['curves']}", flush=True)
  failed = [name for name, status in outcome.items() if status not in ("skipped", "finished")]
  if failed:
    print(f"[sweep] {len(failed)} run(s) did not finish: {', '.join(failed)} (see their sweep.log)", flush=True)
  return 1 if failed else 0


def run() -> None:
  """Console script entry point (oapl-sweep)."""
  cli.run(main)


if __name__ == "__main__":
  run()
