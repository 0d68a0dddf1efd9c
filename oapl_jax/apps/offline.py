"""The paper's offline two-stage mode (rl/offline.py) from the command line.

  python -m oapl_jax.apps.offline generate --config configs/code.py:smoke --workdir W [--stage 1]
  python -m oapl_jax.apps.offline train --offline --config configs/code.py:smoke --workdir W [--stage 1]
  python -m oapl_jax.apps.offline run --config configs/code.py:smoke --workdir W    # every stage, with evals

SIGTERM (exit 0) or Ctrl-C (exit 130) stops after the chunk or step in flight, with a save; the same command
goes on from it.
"""
from __future__ import annotations

from typing import Optional, Sequence

from oapl_jax.apps import cli

cli.prepare_host()

from etils import epath  # noqa: E402

from oapl_jax import checkpoint_files, distributed  # noqa: E402
from oapl_jax.rl import offline, preemption  # noqa: E402
from oapl_jax.run import assemble, schema  # noqa: E402


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = cli.parser("python -m oapl_jax.apps.offline", __doc__)
  p.add_argument("command", choices=("generate", "train", "run"))
  cli.add_config(p, required=True)
  p.add_argument("--workdir", required=True, help="checkpoints, rollouts (rollouts/stage-N), logs")
  p.add_argument("--stage", type=int, help="generate/train: the stage (default: the next one)")
  p.add_argument("--offline", action="store_true", help="train: on stored rollouts (required)")
  p.add_argument("--force_lock", action="store_true",
                 help="take over the workdir's lock when it names a run on another host that is known to be over")
  args, cfg = cli.parse(p, argv)
  rc = schema.from_config(cfg)
  if rc.offline is None:
    p.error("the config has no `offline` section (see configs/code.py)")
  if args.command == "train" and not args.offline:
    p.error("`train` here trains on stored rollouts: pass --offline (online OAPL: python -m oapl_jax.main)")
  workdir = args.workdir
  if args.command == "train" and not checkpoint_files.step_dirs(epath.Path(workdir).expanduser().absolute()
                                                          / "checkpoints")[0]:
    p.error(f"no checkpoint in {workdir}/checkpoints: run `generate` first")
  cli.console_logging()
  distributed.initialize()
  return _command(args, rc, workdir)  # SaveFailed, RunDirBusy: one line from cli.run


def _command(args, rc, workdir: str) -> int:
  stop = preemption.StopFlag().install()  # before setup: a stop in the warm start saves it too
  try:
    try:
      run = assemble.setup(rc, workdir, force_lock=args.force_lock, stop=stop)
    except preemption.Stopped:
      print(f"\n=== offline OAPL stopped by {stop.signal_name} in the warm start (saved; the same command resumes) ===")
      return preemption.EXIT_CODES.get(stop.signal_name, 0)
    if args.command == "run":
      summary = offline.run_stages(run, workdir, stop)
      print("\n=== offline OAPL " + (f"stopped by {stop.signal_name} ===" if stop.signal_name else "finished ==="))
      for key, value in summary.items():
        print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")
      return preemption.EXIT_CODES.get(stop.signal_name, 0)
    try:
      offline.ensure_start_checkpoint(run)
      stage = args.stage or run.meta.syncs_done + 1
      if args.command == "generate":
        store = offline.generate_stage(run, rc.offline, stage, workdir, stop)
        print(f"stage {stage}: {store.num_complete} of {store.header.num_chunks} chunks of "
              f"{store.header.chunk_prompts} prompts x {store.header.group_size} in {store.directory}")
      else:
        stats = offline.train_stage(run, rc.offline, stage, workdir, stop)
        if "stopped_at" not in stats:
          offline.policy_snapshot(run, stage + 1)
          print(f"stage {stage}: {stats}; eval after it: {offline.evaluate_policy(run)}")
        else:
          print(f"stage {stage}: {stats}")
    finally:
      offline.close(run)
    return preemption.EXIT_CODES.get(stop.signal_name, 0)
  finally:
    stop.uninstall()


def run() -> None:
  """Console script entry point."""
  cli.run(main)


if __name__ == "__main__":
  run()
