"""One run per run directory (run_dir.RunLock): a second is refused at once naming the holder, a lock left by
a run that is gone is taken over with a warning, and another host's record needs force; a workdir this user cannot
write in is one line when the run starts."""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from oapl_jax import run_dir
from oapl_jax.run import assemble
from tests.loop_test import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOLDER = """
import sys
from oapl_jax import run_dir
run_dir.RunLock(sys.argv[1]).acquire()
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


@pytest.fixture
def holder(tmp_path):
  """Another process holding the lock on tmp_path/run."""
  proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "run")], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert proc.stdout.readline().strip() == "held"
  yield proc
  proc.stdin.close()
  proc.wait(timeout=60)


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def test_a_second_run_is_refused_before_anything_is_written(tmp_path, holder):
  workdir = tmp_path / "run"
  with pytest.raises(run_dir.RunDirBusy, match=rf"in use by pid {holder.pid} on host {socket.gethostname()}"):
    assemble.setup(tiny_config(), str(workdir))
  assert os.listdir(workdir) == [run_dir.LOCK_FILE]  # no config, checkpoint or metrics file
  record = json.loads((workdir / run_dir.LOCK_FILE).read_text())
  assert record["pid"] == holder.pid  # the holder's record is untouched


def test_the_lock_of_a_dead_run_on_this_host_is_taken_over(tmp_path, caplog):
  dead = _dead_pid()
  (tmp_path / run_dir.LOCK_FILE).write_text(json.dumps({"pid": dead, "host": socket.gethostname(), "since": "x"}))
  lock = run_dir.lock(str(tmp_path))
  assert f"taking over the lock of pid {dead} on host {socket.gethostname()}" in caplog.text
  assert "not running" in caplog.text
  assert json.loads((tmp_path / run_dir.LOCK_FILE).read_text())["pid"] == os.getpid()
  lock.release()
  assert (tmp_path / run_dir.LOCK_FILE).read_text() == ""  # a clean end leaves nothing to take over
  caplog.clear()
  run_dir.lock(str(tmp_path)).release()
  assert "taking over" not in caplog.text


def test_another_hosts_record_is_refused_unless_forced(tmp_path, caplog):
  (tmp_path / run_dir.LOCK_FILE).write_text(json.dumps({"pid": 4242, "host": "node-elsewhere", "since": "x"}))
  with pytest.raises(run_dir.RunDirBusy, match=r"pid 4242 on host node-elsewhere .*another host.*--force_lock"):
    run_dir.lock(str(tmp_path))
  lock = run_dir.lock(str(tmp_path), force=True)
  assert "taking over the lock of pid 4242 on host node-elsewhere" in caplog.text and "forced" in caplog.text
  lock.release()


def test_the_lock_is_released_when_the_holder_dies(tmp_path, holder):
  holder.kill()
  holder.wait()
  run_dir.lock(str(tmp_path / "run")).release()  # the OS dropped its flock: taken over, not refused


def _where_chmod_binds(readonly) -> list:
  """The command prefix under which `readonly` (mode 0o555) refuses writes: none for a plain user; for root, whose
  writes chmod does not stop, a user namespace (`unshare -U`: root's override does not reach the host's files);
  else the test is skipped."""
  probe = readonly / "probe"
  try:
    probe.touch()
  except PermissionError:
    return []
  probe.unlink()
  if shutil.which("unshare") and subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode == 0:
    if subprocess.run(["unshare", "-U", "touch", str(probe)], capture_output=True).returncode != 0:
      return ["unshare", "-U"]
  pytest.skip("chmod does not stop this process's writes (root) and no user namespace (unshare -U) drops that")


@pytest.mark.parametrize("workdir_in", ["the read-only directory", "a new directory below it"])
def test_a_read_only_workdir_is_one_line_before_anything_is_written(tmp_path, workdir_in):
  """Issue 54: a read-only workdir was a 25-line traceback from the lock. An earlier run's run.lock that is itself
  writable does not hide a directory that takes no new file (config.json, metrics.jsonl, checkpoints)."""
  readonly = tmp_path / "ro"
  readonly.mkdir()
  (readonly / run_dir.LOCK_FILE).write_text("")
  workdir = readonly if workdir_in == "the read-only directory" else readonly / "run"
  readonly.chmod(0o555)
  try:
    prefix = _where_chmod_binds(readonly)
    done = subprocess.run([*prefix, sys.executable, "-m", "oapl_jax.main", "--config", "configs/arithmetic.py",
                           "--workdir", str(workdir)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=600)
  finally:
    readonly.chmod(0o755)
  assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
  assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
      f"error: cannot write in the workdir {workdir} (Permission denied): make it writable for this user, or give "
      "another workdir"]
  assert os.listdir(readonly) == [run_dir.LOCK_FILE] and (readonly / run_dir.LOCK_FILE).read_text() == ""
