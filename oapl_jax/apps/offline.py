"""The paper's offline two-stage mode (rl/offline.py) from the command line.

  python -m oapl_jax.apps.offline generate --config configs/code.py:smoke --workdir W [--stage 1]
  python -m oapl_jax.apps.offline train --offline --config configs/code.py:smoke --workdir W [--stage 1]
  python -m oapl_jax.apps.offline run --config configs/code.py:smoke --workdir W    # every stage, with evals
"""
from __future__ import annotations

from typing import Optional, Sequence

from oapl_jax.apps import cli

cli.prepare_host()

from etils import epath  # noqa: E402

from oapl_jax import checkpoints, distributed  # noqa: E402
from oapl_jax.rl import offline  # noqa: E402
from oapl_jax.run import assemble, schema  # noqa: E402


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = cli.parser("python -m oapl_jax.apps.offline", __doc__)
  p.add_argument("command", choices=("generate", "train", "run"))
  cli.add_config(p, required=True)
  p.add_argument("--workdir", required=True, help="checkpoints, rollouts (rollouts/stage-N), logs")
  p.add_argument("--stage", type=int, help="generate/train: the stage (default: the next one)")
  p.add_argument("--offline", action="store_true", help="train: on stored rollouts (required)")
  args, cfg = cli.parse(p, argv)
  rc = schema.from_config(cfg)
  if rc.offline is None:
    p.error("the config has no `offline` section (see configs/code.py)")
  if args.command == "train" and not args.offline:
    p.error("`train` here trains on stored rollouts: pass --offline (online OAPL: python -m oapl_jax.main)")
  workdir = args.workdir
  if args.command == "train" and not checkpoints.step_dirs(epath.Path(workdir).expanduser().absolute()
                                                          / "checkpoints")[0]:
    p.error(f"no checkpoint in {workdir}/checkpoints: run `generate` first")
  cli.console_logging()
  distributed.initialize()
  run = assemble.setup(rc, workdir)
  if args.command == "run":
    summary = offline.run_stages(run, workdir)
    print("\n=== offline OAPL finished ===")
    for key, value in summary.items():
      print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")
    return 0
  try:
    offline.ensure_start_checkpoint(run)
    stage = args.stage or run.meta.syncs_done + 1
    if args.command == "generate":
      store = offline.generate_stage(run, rc.offline, stage, workdir)
      print(f"stage {stage}: {store.header.num_prompts} prompts x {store.header.group_size} in {store.directory}")
    else:
      stats = offline.train_stage(run, rc.offline, stage, workdir)
      offline.policy_snapshot(run, stage + 1)
      print(f"stage {stage}: {stats}; eval after it: {offline.evaluate_policy(run)}")
  finally:
    offline.close(run)
  return 0


def run() -> None:
  """Console script entry point."""
  cli.run(main)


if __name__ == "__main__":
  run()
