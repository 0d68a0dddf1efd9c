"""Train a Qwen model with OAPL.

  python -m oapl_jax.main --config configs/arithmetic.py --workdir runs/demo
  oapl-train --config configs/math.py:smoke --workdir /tmp/smoke --config.loop.num_syncs=2
  oapl-train --config configs/own_task.py --workdir runs/own --dry_run    # check config and data, build nothing
"""
import glob
import importlib.util
import logging
import os


def _skip_absent_tpu() -> None:
  """libtpu is installed with the test extras (for the compile check), and JAX then tries, loudly, to
  start a TPU on any host. Where no TPU device node exists and JAX_PLATFORMS is unset, ask for the
  GPU (if its plugin is installed) and the CPU only."""
  if "JAX_PLATFORMS" in os.environ or glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    return
  has_cuda = any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin"))
  os.environ["JAX_PLATFORMS"] = "cuda,cpu" if has_cuda else "cpu"


_skip_absent_tpu()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
import jax  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from oapl_jax import distributed  # noqa: E402
from oapl_jax.rl import loop  # noqa: E402
from oapl_jax.run import assemble, check, schema  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/arithmetic.py", "Experiment config (get_config).")
_WORKDIR = flags.DEFINE_string("workdir", "runs/demo", "Logs, checkpoints, curve and summary go here.")
# Multi-host (oapl_jax/distributed.py): all three, or none to read TPU VM / SLURM / JAX_* env settings.
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-host).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (multi-host).")
_ALLOW_CONFIG_CHANGES = flags.DEFINE_bool("allow_config_changes", False,
                                          "Resume even if the config differs from the one the run recorded.")
_LOCAL_DEVICE_IDS = flags.DEFINE_list("local_device_ids", None, "Devices this process uses (default: all local).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Check the config and the task's data, then exit (no model is built).")


class _QuietLibraries(logging.Filter):
  """Console: our progress and metrics at INFO; libraries (orbax, jax) only at WARNING and up."""

  def filter(self, record):
    return record.levelno >= logging.WARNING or "/oapl_jax/" in record.pathname or "/clu/" in record.pathname


def main(argv):
  del argv
  absl_logging.set_stderrthreshold("info")  # progress, ETA and metrics on the console
  absl_logging.get_absl_handler().addFilter(_QuietLibraries())
  local_ids = [int(i) for i in _LOCAL_DEVICE_IDS.value] if _LOCAL_DEVICE_IDS.value else None
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, local_ids)
  logging.info("distributed: %s", distributed.describe())
  rc = schema.from_config(_CONFIG.value)
  if _DRY_RUN.value:
    warnings = check.check(rc)
    assemble.build_task(rc).close()
    print(f"config and data OK ({len(warnings)} warning(s)); nothing was built or written")
    return
  summary = loop.train(assemble.setup(rc, _WORKDIR.value, _ALLOW_CONFIG_CHANGES.value))
  if jax.process_index() == 0:
    print(f"\n=== {rc.trainer.loss.upper()} run finished ===")
    for key, value in summary.items():
      if key != "paths":
        print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")
    paths = summary["paths"]
    print(f"  TensorBoard logs: {paths['tensorboard']}  (tensorboard --logdir {paths['tensorboard']})")
    print(f"  checkpoints:      {paths['checkpoints']}")
    print(f"  learning curve:   {paths['curve']}")
    print(f"  summary:          {paths['summary']}")


def run():
  """Console script entry point (oapl-train)."""
  app.run(main)


if __name__ == "__main__":
  run()
