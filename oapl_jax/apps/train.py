"""Train a Qwen or Llama model with OAPL (or a baseline loss) from an experiment config.

  python -m oapl_jax.main --config configs/arithmetic.py --workdir runs/demo
  oapl-train --config configs/math.py:smoke --workdir /tmp/smoke --config.loop.num_syncs=2
  oapl-train --config configs/own_task.py --workdir runs/own --dry_run    # check config and data, build nothing
  oapl-train --help-config loop    # every field of a section (none: all) with its default and meaning

SIGTERM (exit 0) or Ctrl-C (exit 130) stops the run after the step in flight with a checkpoint there, in the warm
start too (RUN/warmstart_checkpoints); the same command resumes it exactly. One during the final eval ends the run
without it (the summary says so; the same command runs it). A second run in the same workdir, or a workdir this
user cannot write in, is refused (run_dir.RunLock, exit 2); a checkpoint or metrics.jsonl that cannot be written
stops the run (exit 1).
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

from oapl_jax.apps import cli

cli.prepare_host()

import jax  # noqa: E402

from oapl_jax import distributed  # noqa: E402
from oapl_jax.rl import loop, preemption  # noqa: E402
from oapl_jax.run import assemble, check, schema  # noqa: E402


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = cli.parser("oapl-train", __doc__)
  cli.add_config(p, default="configs/arithmetic.py")
  p.add_argument("--workdir", default="runs/demo", help="logs, checkpoints, curve and summary go here")
  p.add_argument("--dry_run", action="store_true", help="check the config and the task's data, then exit")
  p.add_argument("--allow_config_changes", action="store_true",
                 help="resume even if the config differs from the one the run recorded")
  p.add_argument("--force_lock", action="store_true",
                 help="take over the workdir's lock when it names a run on another host that is known to be over")
  # Multi-host (oapl_jax/distributed.py): all three, or none to read TPU VM / SLURM / JAX_* env settings.
  p.add_argument("--coordinator_address", help="host:port of process 0 (multi-host)")
  p.add_argument("--num_processes", type=int, help="number of processes (multi-host)")
  p.add_argument("--process_id", type=int, help="this process's index (multi-host)")
  p.add_argument("--local_device_ids", help="comma-separated devices this process uses (default: all local)")
  args, cfg = cli.parse(p, argv)
  cli.console_logging()
  rc = schema.from_config(cfg)
  if args.dry_run:
    with check.warnings_logged() as warnings:  # the config's and the task's, as printed
      check.check(rc)
      assemble.build_task(rc).close()
    print(f"config and data OK ({len(warnings)} warning(s){' above' if warnings else ''}); nothing was built or "
          "written")
    return 0
  stop = preemption.StopFlag().install()  # from here on a stop saves where the run stands: the warm start too
  local_ids = [int(i) for i in args.local_device_ids.split(",")] if args.local_device_ids else None
  distributed.initialize(args.coordinator_address, args.num_processes, args.process_id, local_ids)
  logging.info("distributed: %s", distributed.describe())
  try:
    run = assemble.setup(rc, args.workdir, args.allow_config_changes, args.force_lock, stop=stop)
  except preemption.Stopped:
    if jax.process_index() == 0:
      print(f"\n=== {rc.trainer.loss.upper()} run stopped by {stop.signal_name} in the warm start (saved; resume "
            "with the same command) ===")
    return preemption.EXIT_CODES.get(stop.signal_name, 0)
  summary = loop.train(run, stop=stop)
  stopped_by = summary.get("stopped_by")
  if jax.process_index() == 0:
    print(f"\n=== {rc.trainer.loss.upper()} run " + (f"stopped by {stopped_by} (resume with the same command) ==="
                                                     if stopped_by else "finished ==="))
    for key, value in summary.items():
      if key != "paths":
        print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")
    paths = summary["paths"]
    if paths["tensorboard"]:
      print(f"  TensorBoard logs: {paths['tensorboard']}  (tensorboard --logdir {paths['tensorboard']})")
    print(f"  checkpoints:      {paths['checkpoints']}")
    print(f"  learning curve:   {paths['curve']}")
    print(f"  summary:          {paths['summary']}")
  return preemption.EXIT_CODES.get(stopped_by, 0)


def run() -> None:
  """Console script entry point (oapl-train)."""
  cli.run(main)


if __name__ == "__main__":
  run()
