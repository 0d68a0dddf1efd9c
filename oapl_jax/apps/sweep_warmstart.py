"""One warm start for every point of a sweep: made once into WORKDIR/warmstart, loaded by each run.

  python -m oapl_jax.apps.sweep_warmstart --config configs/arithmetic.py:sweep --workdir runs/sweep [--config.X=V]

The sweep app (apps/sweep.py) calls this as a subprocess when every point can share the warm start: the config
has one (warmstart.steps > 0) and no point sets a warmstart.*, model.* or task.* field. It is made at the base
config's seed and saved as an HF directory, the way experiments/ share theirs; a run then loads it with
--config.model.checkpoint=WORKDIR/warmstart --config.warmstart.steps=0, so a swept seed varies the RL only.
WORKDIR/warmstart/sweep_warmstart.json records the config fields it was made from: a later sweep in the same
workdir with other fields is refused instead of mixing runs from two starts. SIGTERM or Ctrl-C saves it where it
stands (WORKDIR/warmstart/warmstart_checkpoints) and exits 0 or 130; the same command (or sweep) continues it.
"""
from __future__ import annotations

import sys
from typing import Sequence

from oapl_jax.apps import cli
from oapl_jax.run.shared_warmstart import build, directory


def main(argv: Sequence[str] | None = None) -> int:
  p = cli.parser("oapl-sweep-warmstart", __doc__)
  cli.add_config(p, required=True)
  p.add_argument("--workdir", required=True, help="the sweep's workdir: the warm start goes to WORKDIR/warmstart")
  args, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
  if bad := [a for a in rest if not a.startswith("--config.")]:
    p.error(f"unrecognized arguments: {bad}")
  cli.console_logging()
  cli.prepare_host()  # before JAX starts (the sweep imports this module without it)
  from oapl_jax.rl import preemption  # pylint: disable=import-outside-toplevel
  stop = preemption.StopFlag().install()
  try:
    build(args.config, args.workdir, rest, stop)
  except preemption.Stopped:
    print(f"warm start stopped by {stop.signal_name} (saved; the same command continues it)")
    return preemption.EXIT_CODES.get(stop.signal_name, 0)
  print(f"warm start saved to {directory(args.workdir)}")
  return 0


if __name__ == "__main__":
  cli.run(main)
