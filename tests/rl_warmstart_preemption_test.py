"""A stop during the warm start (rl/warmstart.py, issue 54): SIGTERM or Ctrl-C lets the step in flight finish, saves
the warm start's state to RUN/warmstart_checkpoints and exits as the loop does (0 for SIGTERM, one line naming the
signal); the same command resumes it with the same batches and step keys, so its final params equal an
uninterrupted warm start's bit for bit (CPU XLA is deterministic for a fixed program and device count)."""
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from oapl_jax import checkpoint_files, checkpoints, parallel
from oapl_jax.models import api, decoder
from oapl_jax.rl import preemption, trainer, warmstart
from oapl_jax.rl.optim import OptimConfig
from oapl_jax.run import assemble, files, policy, schema
from tests.rl_warmstart_test import CONFIG, _demos

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 8


def _setting():
  mesh = parallel.make_mesh((1, -1, 1), devices=jax.devices()[:1])  # one device: the fastest compile
  model, layout = api.for_config(CONFIG), parallel.Layout(mesh)
  params, _ = parallel.init_sharded(lambda: decoder.init_params(CONFIG, jax.random.PRNGKey(0)), mesh,
                                    parallel.DEFAULT_RULES)
  config = warmstart.WarmStartConfig(steps=STEPS, batch_size=8, optim=OptimConfig(lr=1e-2, schedule="cosine"))
  return _demos(24), params, model, layout, config


def _signal_after_step(monkeypatch, step: int, signum=signal.SIGTERM):
  """Sends this process `signum` right after warm-start step `step` is dispatched (a real signal, as `kill`)."""
  make = trainer.make_train_step

  def signalling(*args, **kwargs):
    step_fn = make(*args, **kwargs)

    def step_then_signal(state, batch, rng):
      now = int(state.step)  # before the step donates it
      out = step_fn(state, batch, rng)
      if now == step:
        os.kill(os.getpid(), signum)
      return out
    return step_then_signal
  monkeypatch.setattr(trainer, "make_train_step", signalling)


def test_a_stopped_warm_start_saves_and_resumes_to_the_uninterrupted_params(tmp_path, monkeypatch):
  demos, params, model, layout, config = _setting()
  full_log, stopped_log = [], []
  run = lambda log, **kw: warmstart.warm_start(demos, params, model, layout, config, seq_len=8, seed=5,  # noqa: E731
                                               log=lambda step, m: log.append((step, m["warmstart/nll"])), **kw)
  full = run(full_log)

  _signal_after_step(monkeypatch, 5)
  stop = preemption.StopFlag().install()
  saves = checkpoints.Checkpointer(str(tmp_path / "ws"), 1)
  try:
    with pytest.raises(preemption.Stopped):
      run(stopped_log, checkpointer=saves, stop=stop)
  finally:
    stop.uninstall()
    saves.close()
  assert stop.signal_name == "SIGTERM"
  # the step in flight (5) and the one dispatched before the vote was read (6): 7 steps done
  assert list(checkpoint_files.step_dirs(checkpoint_files.absolute(tmp_path / "ws"))[0]) == [7]

  monkeypatch.undo()
  saves = checkpoints.Checkpointer(str(tmp_path / "ws"), 1)
  try:
    resumed = run(stopped_log, checkpointer=saves)
  finally:
    saves.close()
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), resumed, full)
  assert stopped_log == full_log  # the step the stop skipped past was logged before the save
  assert list(checkpoint_files.step_dirs(checkpoint_files.absolute(tmp_path / "ws"))[0]) == [STEPS]  # its end


def test_a_stop_before_the_first_step_compiles_nothing_and_saves_nothing(tmp_path, monkeypatch):
  """A signal during set-up (before the warm start): no step is compiled or taken, no save, Stopped."""
  demos, params, model, layout, config = _setting()
  made = []
  monkeypatch.setattr(trainer, "make_train_step", lambda *a, **k: made.append(1))
  stop, saves = preemption.StopFlag(), checkpoints.Checkpointer(str(tmp_path / "ws"), 1)
  stop.request("SIGTERM")
  try:
    with pytest.raises(preemption.Stopped):
      warmstart.warm_start(demos, params, model, layout, config, seq_len=8, seed=5, log=lambda *_: None,
                           checkpointer=saves, stop=stop)
  finally:
    saves.close()
  assert not made and not checkpoint_files.step_dirs(checkpoint_files.absolute(tmp_path / "ws"))[0]


FLAGS = ["--config.warmstart.steps=40", "--config.warmstart.batch_size=32"]


def _cli(workdir):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # and this suite's 8 fake CPU devices (XLA_FLAGS), as in-process
  return subprocess.Popen([sys.executable, "-m", "oapl_jax.main", "--config", "configs/arithmetic.py:smoke", *FLAGS,
                           "--workdir", str(workdir)], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)


def _saved_steps(workdir) -> list[int]:
  return list(checkpoint_files.step_dirs(checkpoint_files.absolute(workdir / assemble.WARMSTART_CHECKPOINTS))[0])


@pytest.mark.slow  # a whole command; fast: the two tests above (a stop saves, resumes equal; set-up compiles nothing)
@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_in_the_warm_start_exits_cleanly_and_the_same_command_resumes_it(tmp_path, signum, code):
  proc, seen = _cli(tmp_path), []
  for line in proc.stdout:  # the warm start's first progress line: it is training
    seen.append(line)
    if "warm start: step" in line:
      break
  sent = time.time()
  proc.send_signal(signum)
  out = "".join(seen) + proc.communicate(timeout=300)[0]
  waited, name = time.time() - sent, signal.Signals(signum).name
  assert proc.returncode == code, out[-3000:]
  assert out.count(f"{name} received: finishing the step in flight") == 1, out[-3000:]
  assert f"run stopped by {name} in the warm start" in out and "Traceback" not in out, out[-3000:]
  assert waited < 30, waited  # a pod's default grace period (GKE, SLURM)
  saved = _saved_steps(tmp_path)
  assert len(saved) == 1 and 0 < saved[0] < 40, saved
  assert not (tmp_path / "checkpoints").is_dir() or not os.listdir(tmp_path / "checkpoints")  # no RL step yet
  assert not (tmp_path / "run.lock").read_text()  # released

  proc = _cli(tmp_path)
  out = proc.communicate(timeout=600)[0]
  assert proc.returncode == 0 and f"warm start: resumed at step {saved[0]}" in out, out[-3000:]
  assert "run finished" in out, out[-3000:]
  assert _saved_steps(tmp_path) == [40]  # its end, as an uninterrupted warm start leaves it

  rc = schema.from_config(files.load(os.path.join(REPO, "configs/arithmetic.py:smoke"), FLAGS))
  task = assemble.build_task(rc)
  try:
    uninterrupted = policy.warm_started(rc, task).params  # the same placement and program as the command's
  finally:
    task.close()
  path = checkpoint_files.absolute(tmp_path / assemble.WARMSTART_CHECKPOINTS / "40" / "state")
  with ocp.PyTreeCheckpointer() as reader:
    resumed = reader.restore(path)["params"]
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), resumed, uninterrupted)
