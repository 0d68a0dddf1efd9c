"""The offline two-stage mode (rl/offline.py) from the command line.

  python -m oapl_jax.apps.offline generate --config configs/code.py:smoke --workdir W [--stage 1]
  python -m oapl_jax.apps.offline train --offline --config configs/code.py:smoke --workdir W [--stage 1]
  python -m oapl_jax.apps.offline run --config configs/code.py:smoke --workdir W    # every stage, with evals
"""
from absl import app, flags
from absl import logging as absl_logging
from etils import epath
from ml_collections import config_flags

from oapl_jax import checkpoints, distributed
from oapl_jax.rl import offline
from oapl_jax.run import assemble, schema

_COMMANDS = ("generate", "train", "run")
_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config (get_config) with an `offline` section.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, rollouts (rollouts/stage-N), logs.")
_STAGE = flags.DEFINE_integer("stage", None, "generate/train: the stage (default: the next one).")
_OFFLINE = flags.DEFINE_bool("offline", False, "train: on stored rollouts (required).")


def main(argv) -> None:
  if len(argv) != 2 or argv[1] not in _COMMANDS:
    raise app.UsageError(f"usage: python -m oapl_jax.apps.offline {{{'|'.join(_COMMANDS)}}} --config FILE[:VARIANT] "
                         f"--workdir DIR [--stage N] [--offline]; got {argv[1:]}")
  command, workdir = argv[1], _WORKDIR.value
  rc = schema.from_config(_CONFIG.value)
  if rc.offline is None:
    raise app.UsageError("the config has no `offline` section (see configs/code.py)")
  if command == "train" and not _OFFLINE.value:
    raise app.UsageError("`train` here trains on stored rollouts: pass --offline (online OAPL: python -m oapl_jax.main)")
  absl_logging.set_stderrthreshold("info")
  distributed.initialize()
  if command == "train" and not checkpoints.step_dirs(epath.Path(workdir).expanduser().absolute() / "checkpoints")[0]:
    raise app.UsageError(f"no checkpoint in {workdir}/checkpoints: run `generate` first")
  run = assemble.setup(rc, workdir)
  if command == "run":
    summary = offline.run_stages(run, workdir)
    print("\n=== offline OAPL finished ===")
    for key, value in summary.items():
      print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")
    return
  try:
    offline.ensure_start_checkpoint(run)
    stage = _STAGE.value or run.meta.syncs_done + 1
    if command == "generate":
      store = offline.generate_stage(run, rc.offline, stage, workdir)
      print(f"stage {stage}: {store.header.num_prompts} prompts x {store.header.group_size} in {store.directory}")
    else:
      stats = offline.train_stage(run, rc.offline, stage, workdir)
      offline.policy_snapshot(run, stage + 1)
      print(f"stage {stage}: {stats}; eval after it: {offline.evaluate_policy(run)}")
  finally:
    offline.close(run)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)
