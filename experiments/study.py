"""The claims study from the command line: run (or resume) every cell, then write the report.

  python -m experiments.study --task arithmetic --out reports/claims_arithmetic
  python -m experiments.study --task arithmetic --smoke --out /tmp/claims_smoke     # CI size
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

from experiments import claims, claims_report


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m experiments.study", description=__doc__.split("\n")[0])
  parser.add_argument("--task", required=True, choices=("arithmetic", "chain"))
  parser.add_argument("--out", required=True, help="the report directory (report.md and PNGs)")
  parser.add_argument("--runs", help="run directories (default runs/claims_<task>[_smoke])")
  parser.add_argument("--smoke", action="store_true", help="2 losses x 2 lags x 1 seed, tiny (CI)")
  parser.add_argument("--collect", action="store_true", help="only write the report from the runs that exist")
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  study = claims.make_study(args.task, args.smoke)
  runs_dir = args.runs or os.path.join("runs", f"claims_{args.task}{'_smoke' if args.smoke else ''}")
  claims.enable_compile_cache(os.path.join(runs_dir, "jax_cache"))
  start = time.time()
  best = claims.run_study(study, runs_dir, collect=args.collect)
  path = claims_report.write_report(study, runs_dir, args.out, best)
  print(f"[claims] report: {path} ({time.time() - start:.0f}s)", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
