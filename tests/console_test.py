"""What a command prints: no C++ import banners, no progress-bar frames in a pipe or a file, one line for Ctrl-C,
a failed save or a busy workdir, and import paths that resolve from the current directory under the installed
commands (apps/cli.py, reporting.py, event_writers.py)."""
import importlib
import os
import subprocess
import sys

import pytest

from oapl_jax import checkpoints, event_writers, reporting, run_dir
from oapl_jax.apps import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Lines TensorFlow 2.21 printed at import on this project's CPU host, copied from a run's console.
TF_BANNER = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1795772794.310780    4529 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders.\n"
    "I0000 00:00:1795772794.311638    4529 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
    "not be used.\n")


def test_the_import_banner_is_dropped_and_errors_pass(capfd):
  error = "E0000 00:00:1795772794.3 4529 cuda_executor.cc:1] failed call to cuInit: UNKNOWN ERROR (303)\n"
  with event_writers.native_banners_dropped():
    os.write(2, (TF_BANNER + error + "a warning\n").encode())  # as C++ writes: the file descriptor, past sys.stderr
  assert capfd.readouterr().err == error + "a warning\n"


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="clu's writers import tensorflow")
def test_tensorboard_writer_imports_tensorflow_without_its_banner():
  code = "from oapl_jax import event_writers; event_writers.open_writer(None)"
  done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                        env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
  assert done.returncode == 0, done.stderr
  assert "port.cc" not in done.stderr and "cudart_stub" not in done.stderr and "InitializeLog" not in done.stderr


def test_progress_bar_only_where_it_redraws(tmp_path, capfd, monkeypatch):
  reporter = reporting.Reporter(str(tmp_path), total_steps=4)
  for step in (1, 2):
    reporter.tick(step, 4)
  assert reporter._bar is None and "\r" not in capfd.readouterr().err  # pytest's stderr: a file, not a terminal
  monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
  reporter.tick(3, 4)
  reporter.close()
  assert "\r 50%|" in capfd.readouterr().err  # the same call on a terminal draws the bar


def test_interrupt_is_one_line_and_exit_130(capsys):
  def main(argv):
    raise KeyboardInterrupt
  with pytest.raises(SystemExit) as done:
    cli.run(main)
  assert done.value.code == 130 and capsys.readouterr().err == "interrupted\n"


@pytest.mark.parametrize("error,code", [
    (checkpoints.SaveFailed(5, "/w/checkpoints/5", "No space left on device"), 1),
    (run_dir.RunDirBusy("/w is in use by pid 7 on host h"), 2)])
def test_a_failed_save_or_a_busy_workdir_is_one_line(capsys, error, code):
  def main(argv):
    raise error
  with pytest.raises(SystemExit) as done:
    cli.run(main)
  assert done.value.code == code and capsys.readouterr().err == f"error: {error}\n"


def test_other_errors_pass_through():
  def main(argv):
    raise RuntimeError("a bug")
  with pytest.raises(RuntimeError, match="a bug"):
    cli.run(main)


def test_import_paths_resolve_from_the_working_directory(tmp_path, monkeypatch):
  (tmp_path / "my_rewards_pkg").mkdir()
  (tmp_path / "my_rewards_pkg" / "__init__.py").write_text("def score(record, response):\n  return 1.0\n")
  monkeypatch.chdir(tmp_path)
  bin_dir = os.path.dirname(sys.executable)  # what a console script's sys.path[0] is
  monkeypatch.setattr(sys, "path", [bin_dir] + [p for p in sys.path if p not in ("", str(tmp_path))])
  with pytest.raises(ImportError):
    importlib.import_module("my_rewards_pkg")
  cli.import_from_working_directory()
  cli.import_from_working_directory()
  assert sys.path[:2] == [str(tmp_path), bin_dir]  # first, once
  assert importlib.import_module("my_rewards_pkg").score({}, "") == 1.0
  monkeypatch.delitem(sys.modules, "my_rewards_pkg")


@pytest.mark.parametrize("nvidia_nodes,want", [([], "cpu"), (["/dev/nvidia0"], "cuda,cpu")])
def test_cuda_is_asked_for_only_where_a_gpu_is(monkeypatch, nvidia_nodes, want):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: name == "jax_cuda12_plugin" or None)
  monkeypatch.setattr(cli.glob, "glob", lambda pattern: nvidia_nodes if pattern.startswith("/dev/nvidia") else [])
  cli.skip_absent_tpu()
  assert os.environ["JAX_PLATFORMS"] == want


def test_progress_lines_have_no_logger_prefix_and_a_warning_says_so():
  """Issue 55.5: a command's INFO lines (progress, ETA, metrics) print bare, not after absl's `I1128 20:23:25.49
  140 file.py:57]`; a library's INFO stays hidden; a warning is marked as one."""
  code = ("import logging; from oapl_jax.apps import cli; cli.console_logging()\n"
          "from oapl_jax import distributed; distributed.initialize()\n"  # logs at INFO from oapl_jax/
          "logging.getLogger('orbax').info('a library chatting')\n"
          "logging.getLogger('orbax').warning('a library worried')\n")
  done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert done.returncode == 0, done.stderr
  assert done.stderr.splitlines()[-2:] == ["jax.distributed: single process, not initialized",
                                           "warning: a library worried"], done.stderr


def test_the_window_line_shows_the_snapshots_and_the_policys_pass_at_1(tmp_path, capsys):
  """A run with a policy eval every few steps shows its latest value, not only the snapshot's eval (a study's runs
  evaluate the snapshot at step 0 and the end: their line stood at the warm start's value all run)."""
  from types import SimpleNamespace  # pylint: disable=import-outside-toplevel
  from oapl_jax.rl import loop, windows  # pylint: disable=import-outside-toplevel
  reporter = reporting.Reporter(str(tmp_path), total_steps=300)
  reporter.latest.update({"train/loss": 0.5, "rollout/reward_mean": 0.25, "eval/val/pass@1": 0.248,
                          "policy_eval/val/pass@1": 0.803, "policy_eval/val/pass@4": 0.9})
  run = SimpleNamespace(reporter=reporter, windows=windows.FixedWindows(), settings=SimpleNamespace(num_syncs=6))
  loop._print_window(run, 2, 150)  # pylint: disable=protected-access
  reporter.close()
  assert "| val pass@1 0.248 | policy val pass@1 0.803 |" in capsys.readouterr().out
