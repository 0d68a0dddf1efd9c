"""The claims study from the command line: run (or resume) every cell in priority order, then write the report.

  python -m experiments.study --task arithmetic --out reports/claims_arithmetic        # the whole study
  python -m experiments.study --task arithmetic --smoke --out /tmp/claims_smoke        # CI size, ~2 min
  python -m experiments.study --task arithmetic --out reports/claims_arithmetic --collect   # report only
  python -m experiments.study --task arithmetic --out reports/x --cell arithmetic/grpo_obo/lr0.0001/seed3

--task names the study (task A, arithmetic; it includes task B, configs/claims.py:hard_tail, for claim 4).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

from experiments import claims, claims_report, plan


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m experiments.study", description=__doc__.split("\n")[0])
  parser.add_argument("--task", default="arithmetic", choices=("arithmetic",))
  parser.add_argument("--out", required=True, help="the report directory (report.md and PNGs)")
  parser.add_argument("--runs", help="run directories (default runs/claims[_smoke])")
  parser.add_argument("--smoke", action="store_true", help="tiny: S = 4 steps, 2 seeds, one lr (CI)")
  parser.add_argument("--collect", action="store_true", help="only write the report from the runs that exist")
  parser.add_argument("--cell", help="run (or resume) only this cell, then write the report")
  parser.add_argument("--checks_only", action="store_true",
                      help="only the warm starts, the pilot and task B's check (does the design work?)")
  parser.add_argument("--no_secondary", action="store_true", help="skip opmd, asymre and the beta1 probe")
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  study = plan.make_study(args.smoke, secondary=not args.no_secondary)
  runs_dir = args.runs or os.path.join("runs", "claims_smoke" if args.smoke else "claims")
  claims.enable_compile_cache(os.path.join(runs_dir, "jax_cache"))
  start = time.time()
  runner = claims.Runner(study, runs_dir, collect=args.collect, only=args.cell, checks_only=args.checks_only)
  state = runner.study_all()
  path = claims_report.write_report(study, runs_dir, args.out, state, elapsed=time.time() - start)
  print(f"[claims] report: {path} ({time.time() - start:.0f}s)", flush=True)
  if state.stopped:
    print(f"[claims] stopped: {state.stopped}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
