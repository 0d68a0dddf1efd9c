"""Compile the run's train step and sampler ahead of time for a named TPU slice (libtpu on this host, no TPU):
memory per chip against HBM, FLOPs and a step-time estimate (oapl_jax/compile_check.py).

  python -m oapl_jax.apps.compile_check --config configs/math.py --topology v5p-64
  python -m oapl_jax.apps.compile_check --config configs/math.py --topology 2xv5litepod-256 '--config.mesh.trainer_dcn=(2,1,1)'
"""
from __future__ import annotations

import dataclasses
import json
import sys
from typing import Optional, Sequence

import jax

from oapl_jax import compile_check as cc
from oapl_jax.apps import cli

GIB = 1024 ** 3


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = cli.parser("python -m oapl_jax.apps.compile_check", __doc__)
  cli.add_config(p, required=True)
  p.add_argument("--topology", required=True, help="v5p-64, v5e-256, v6e-16, 2xv5e-256, v5p:4x4x8, ...")
  p.add_argument("--seq_len", type=int, default=0, help="trainer sequence length T (0: as the run computes it)")
  p.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilization assumed for the step-time estimate")
  p.add_argument("--hbm_gib", type=float, default=0.0, help="HBM per chip to fit in (0: the chip's)")
  p.add_argument("--programs", default=",".join(cc.PROGRAMS), help="comma-separated programs to compile")
  p.add_argument("--num_layers", type=int, default=0, help="compile the model cut to this many layers (0: all)")
  p.add_argument("--json", default="", help="write the numbers here")
  args, cfg = cli.parse(p, argv)
  jax.config.update("jax_platforms", "cpu")  # compile-only TPU devices come from libtpu; run nothing here
  report = cc.check(cfg, args.topology, seq_len=args.seq_len or None, mfu=args.mfu,
                    hbm_bytes=int(args.hbm_gib * GIB) if args.hbm_gib else None,
                    programs=[x for x in args.programs.split(",") if x], num_layers=args.num_layers)
  print(cc.format_report(report))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({**dataclasses.asdict(report), "fits": report.fits()}, f, indent=2, default=float)
  misfits = [name for name, ok in report.fits().items() if not ok]
  if misfits:
    print(f"\nDOES NOT FIT {report.topology}: {', '.join(misfits)} (over {report.hbm_bytes / GIB:.2f} GiB per chip, "
          "or did not compile)", file=sys.stderr)
    return 1
  print(f"\nfits {report.topology}")
  return 0


def run() -> None:
  """Console script entry point."""
  cli.run(main)


if __name__ == "__main__":
  run()
