"""The one command-line style of every entry point (argparse): `--config FILE.py[:ARG]` plus any number of
`--config.a.b=VALUE` overrides (Python literals; a bare word is a string), and the console logging.

    parser = cli.parser("oapl-train", __doc__)
    cli.add_config(parser, default="configs/arithmetic.py")
    args, cfg = cli.parse(parser, argv)        # cfg: the overridden ConfigDict (None without --config)

Import paths in a config ('package.module:function' for task.name or task.reward) resolve from the current
directory whichever way a command starts: `python -m oapl_jax.apps.eval` puts it first on sys.path, and so does
prepare_host() for the installed commands (oapl-train, oapl-eval, ...), whose sys.path[0] is their bin/.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import logging
import os
import sys
from typing import Optional, Sequence

from oapl_jax import fake_devices, tpu_host


def skip_absent_tpu() -> None:
  """libtpu is installed with the test extras (for the compile check), and JAX then tries, loudly, to
  start a TPU on any host. Where no TPU device node exists and JAX_PLATFORMS is unset, ask for the
  GPU (if its plugin is installed and an NVIDIA device node exists: else cuInit fails, loudly) and the CPU
  only. Call before JAX starts."""
  if "JAX_PLATFORMS" in os.environ or tpu_host.has_tpu_device_files():
    return
  has_plugin = any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin"))
  has_gpu = bool(glob.glob("/dev/nvidia[0-9]*") or glob.glob("/dev/dxg"))  # dxg: WSL2's GPU
  os.environ["JAX_PLATFORMS"] = "cuda,cpu" if has_plugin and has_gpu else "cpu"
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def quiet_native_logs() -> None:
  """C++ libraries log to stderr past Python's logging: keep their INFO and WARNING lines (TensorFlow's,
  XLA's, gRPC's banners) off the console; errors still print. reporting.py drops what TensorFlow prints at
  import regardless (absl's output before InitializeLog). Call before they load; a set variable wins."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
  os.environ.setdefault("GLOG_minloglevel", "2")


def import_from_working_directory() -> None:
  """The current directory first on sys.path, as `python -m` puts it (the module docstring says why)."""
  if not {"", os.getcwd()} & set(sys.path):
    sys.path.insert(0, os.getcwd())


def prepare_host() -> None:
  """Every entry point's first call, before JAX starts: import_from_working_directory(), quiet_native_logs(),
  skip_absent_tpu(), enough XLA:CPU threads for fake devices' collectives (oapl_jax/fake_devices.py), then,
  where JAX will run on the CPU only, keep freed host memory for reuse (oapl_jax/host_memory.py: a train step
  at Qwen3-0.6B width runs ~17% faster on a 2-core VM; resident memory stays near its peak)."""
  import_from_working_directory()
  skip_absent_tpu()
  quiet_native_logs()
  fake_devices.make_room_for_collectives()
  if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
    from oapl_jax import host_memory  # pylint: disable=import-outside-toplevel
    host_memory.keep_freed_memory()


def parser(prog: str, doc: str) -> argparse.ArgumentParser:
  return argparse.ArgumentParser(prog=prog, description=doc.strip().split("\n")[0],
                                 epilog="\n".join(doc.strip().split("\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def add_config(p: argparse.ArgumentParser, *, default: Optional[str] = None, required: bool = False) -> None:
  p.add_argument("--config", default=default, required=required, metavar="FILE.py[:ARG]",
                 help="experiment config (get_config(ARG)); override fields with --config.a.b=VALUE")
  add_help_config(p)  # every command that reads a config lists its fields


class _PrintConfigHelp(argparse.Action):
  """--help-config [SECTION]: run/config_help's listing, then exit like --help (no config is read)."""

  def __call__(self, parser, namespace, values, option_string=None):
    from oapl_jax.run import config_help  # pylint: disable=import-outside-toplevel
    try:
      text = config_help.render(values or None)
    except KeyError as e:
      parser.exit(2, f"error: {e.args[0]}\n")
    print(text, end="")
    parser.exit(0)


def add_help_config(p: argparse.ArgumentParser) -> None:
  p.add_argument("--help-config", nargs="?", const="", default=argparse.SUPPRESS, metavar="SECTION",
                 action=_PrintConfigHelp, help="list every config field (or SECTION's: loop, trainer.optim, task.chat, "
                 "...): its --config.* name, type, default, bounds and meaning; then exit")


def parse(p: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None):
  """(args, cfg): the flags, and the config file's ConfigDict with every --config.* override applied."""
  args, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
  overrides = [a for a in rest if a.startswith("--config.")]
  unknown = [a for a in rest if not a.startswith("--config.")]
  if unknown:
    p.error(f"unrecognized arguments: {' '.join(unknown)}")
  if overrides and not getattr(args, "config", None):
    p.error("--config.* overrides need --config FILE.py")
  if not getattr(args, "config", None):
    return args, None
  from oapl_jax.run import files  # pylint: disable=import-outside-toplevel
  try:
    return args, files.load(args.config, overrides)
  except (FileNotFoundError, ValueError) as e:
    p.error(str(e))


class _QuietLibraries(logging.Filter):
  """Console: our progress and metrics at INFO; libraries (orbax, jax) only at WARNING and up."""

  def filter(self, record):
    return record.levelno >= logging.WARNING or "/oapl_jax/" in record.pathname or "/clu/" in record.pathname


class _Plain(logging.Formatter):
  """Progress and metrics as bare lines (no `I1128 20:23:25.49 140 file.py:88]` prefix between the progress
  lines); a warning or an error says which it is."""

  def format(self, record):
    line = record.getMessage()
    if record.exc_info:
      line += "\n" + self.formatException(record.exc_info)
    return line if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {line}"


def console_logging() -> None:
  """absl's log lines (progress, ETA, metrics) on stderr at INFO, libraries at WARNING, without absl's prefix."""
  from absl import flags, logging as absl_logging  # pylint: disable=import-outside-toplevel
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()  # absl's flags are not ours to parse: argparse reads the command line
  absl_logging.use_absl_handler()
  absl_logging.set_verbosity("info")
  absl_logging.set_stderrthreshold("info")
  absl_logging.get_absl_handler().addFilter(_QuietLibraries())
  absl_logging.get_absl_handler().setFormatter(_Plain())


def run(main, argv: Optional[Sequence[str]] = None) -> None:
  """Exit with main's code; a bad path, config, data or checkpoint to load, or a workdir another run holds or this
  user cannot write in, is one message (every problem listed), exit 2, not a traceback; a checkpoint or
  metrics.jsonl that could not be written during the run (a full disk) one line, exit 1; Ctrl-C
  (KeyboardInterrupt) one line, exit 130 (what the work did on the way out is its own)."""
  from oapl_jax.models.safetensors_io import CheckpointError  # pylint: disable=import-outside-toplevel
  from oapl_jax.sections import ConfigError  # pylint: disable=import-outside-toplevel
  from oapl_jax.tasks.sources import DataError  # pylint: disable=import-outside-toplevel
  from oapl_jax.run_dir import ConfigChanged, RunDirBusy, WorkdirUnwritable  # pylint: disable=import-outside-toplevel
  from oapl_jax.tasks.base import RewardError  # pylint: disable=import-outside-toplevel
  try:
    code = main(argv)
  except (FileNotFoundError, ConfigError, DataError, ConfigChanged, RewardError, RunDirBusy, WorkdirUnwritable,
          CheckpointError) as e:
    print(f"error: {e}", file=sys.stderr)
    code = 2
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    code = 130
  except _write_failed() as e:
    print(f"error: {e}", file=sys.stderr)
    code = 1
  raise SystemExit(code)


def _write_failed() -> tuple:
  """checkpoints.SaveFailed and reporting.MetricsUnwritable, each where its module is loaded (only then can it be
  raised; no orbax import for the commands that never save)."""
  found = (getattr(sys.modules.get(module), name, None) for module, name in
           (("oapl_jax.checkpoints", "SaveFailed"), ("oapl_jax.reporting", "MetricsUnwritable")))
  return tuple(error for error in found if error is not None)
