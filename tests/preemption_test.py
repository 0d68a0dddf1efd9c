"""SIGTERM and SIGINT stop a run gracefully (rl/preemption.py): the step in flight finishes, a checkpoint is
saved where the run stands (inside a window too), and the resumed run logs exactly what an uninterrupted one
does; one in the final eval ends the run without it; from the command line SIGTERM exits 0 and SIGINT 130,
both with the save."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from oapl_jax import checkpoint_files
from oapl_jax.rl import loop, preemption
from oapl_jax.run import assemble
from tests.loop_test import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# differ between any two runs: wall-clock times, and what the sampler thread had made when a step drew its batch
UNTIMELY = ("seconds", "tokens_per_second", "buffer/groups")


def _config(backend="scripted"):
  """The scripted sampler (sampler/scripted.py): no decoding, responses that still depend on the snapshot, so a
  resume inside a window on the wrong snapshot shows; the JAX sampler's runs are in `make test-all`."""
  c = tiny_config(num_syncs=2)
  c.sampler.backend = backend
  c.warmstart.steps = 0
  c.eval.update(num_prompts=8, samples=2, ks=(1, 2))
  return c


def _values(workdir) -> list[tuple]:
  """Every logged (step, metric, value), timing aside, in a canonical order."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return sorted((h["step"], k, v) for h in rows for k, v in h.items() if k != "step" and not k.endswith(UNTIMELY))


def _signal_at(run, step: int, signum=signal.SIGTERM):
  """Sends this process `signum` right after trainer step `step` is dispatched (a real signal, as `kill`)."""
  train_step = run.train_step

  def step_then_signal(state, batch, rng):
    now = int(state.step)  # before the step donates it
    out = train_step(state, batch, rng)
    if now == step:
      os.kill(os.getpid(), signum)
    return out
  run.train_step = step_then_signal
  return run


def _full(tmp_path_factory, backend):
  workdir = str(tmp_path_factory.mktemp(f"full_{backend}"))
  loop.train(assemble.setup(_config(backend), workdir))
  return workdir


@pytest.fixture(scope="module")
def full(tmp_path_factory):
  """The workdir of the uninterrupted run."""
  return _full(tmp_path_factory, "scripted")


@pytest.fixture(scope="module")
def full_jax(tmp_path_factory):
  return _full(tmp_path_factory, "jax")


# window 2 is steps 5..9: a stop inside it, and one after the last step (the final eval is then skipped)
@pytest.mark.parametrize("stop_after, backend", [(6, "scripted"), pytest.param(6, "jax", marks=pytest.mark.slow),
                                                 pytest.param(8, "jax", marks=pytest.mark.slow)])
def test_a_stopped_run_resumes_to_the_uninterrupted_metrics(tmp_path, request, stop_after, backend):
  full = request.getfixturevalue("full" if backend == "scripted" else "full_jax")
  stopped = str(tmp_path / "stopped")
  previous = signal.getsignal(signal.SIGTERM)
  summary = loop.train(_signal_at(assemble.setup(_config(backend), stopped), stop_after))
  assert signal.getsignal(signal.SIGTERM) is previous  # the loop's handler is gone with it
  # the signal lands after step `stop_after` is dispatched; the stop is agreed with the next step
  saved = stop_after + 2
  assert summary["stopped_by"] == "SIGTERM" and summary["trainer_steps"] == saved
  assert summary["finished"] == ("final_eval" in summary) == (saved == 10)
  step_dirs = checkpoint_files.step_dirs(checkpoint_files.absolute(os.path.join(stopped, "checkpoints")))[0]
  assert sorted(step_dirs) == [5, saved]
  meta = checkpoint_files.read_meta(step_dirs[saved], saved)
  inside = saved % 5
  assert (meta.syncs_done, meta.window_steps_done) == ((1, inside) if inside else (2, 0))
  assert os.path.isdir(os.path.join(step_dirs[saved], "sampler")) == bool(inside)
  assert os.path.exists(os.path.join(stopped, "summary.json"))

  loop.train(assemble.setup(_config(backend), stopped))
  want, got = _values(full), _values(stopped)
  assert len(want) > 200 and any(step >= saved and key.startswith(("train/", "eval/")) for step, key, _ in want)
  assert got == want  # bit-identical: every (step, metric, value), each logged once


def _signal_in_final_eval(run, signum=signal.SIGTERM):
  """Sends this process `signum` as the final eval starts: run.evaluate's call on the main thread (on one process
  the window evals run in the sampler's thread)."""
  evaluate = run.evaluate

  def signal_then_evaluate(params, **where):  # where: the eval's step (its generations' directory)
    if threading.current_thread() is threading.main_thread():
      os.kill(os.getpid(), signum)
    return evaluate(params, **where)
  run.evaluate = signal_then_evaluate
  return run


def test_a_signal_in_the_final_eval_ends_the_run_without_it(tmp_path, full):
  stopped = str(tmp_path / "stopped")
  summary = loop.train(_signal_in_final_eval(assemble.setup(_config(), stopped)))
  assert (summary["stopped_by"], summary["trainer_steps"], summary["finished"]) == ("SIGTERM", 10, True)
  assert summary["final_eval"] == "skipped: stopped by SIGTERM; the same command runs it"
  with open(os.path.join(stopped, "summary.json")) as f:
    written = json.load(f)
  assert written["final_eval"] == summary["final_eval"] and not any(k.endswith("(end)") for k in written)
  assert not [k for step, k, _ in _values(stopped) if step == 10 and k.startswith("eval/")]
  steps, _ = checkpoint_files.step_dirs(checkpoint_files.absolute(os.path.join(stopped, "checkpoints")))
  assert sorted(steps) == [5, 10]

  summary = loop.train(assemble.setup(_config(), stopped))  # the same call again: only the final eval
  assert "stopped_by" not in summary and "final_eval" not in summary and "eval/held_out/pass@1 (end)" in summary
  assert _values(stopped) == _values(full)


def _cli(workdir, *extra):
  args = ["--config", "configs/arithmetic.py", "--config.warmstart.steps=20", "--config.loop.num_syncs=2",
          "--config.loop.sync_every=5", "--config.checkpoint.every_syncs=1", "--config.eval.num_prompts=16",
          "--config.sampler.backend=scripted",  # what the command does on a signal does not depend on decoding
          *extra, "--workdir", str(workdir)]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.Popen([sys.executable, "-m", "oapl_jax.main", *args], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.slow  # a whole command; fast: the in-process stops above, each resumed equal
@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_the_command_saves_and_exits_cleanly_on_a_signal(tmp_path, signum, code):
  proc = _cli(tmp_path)
  deadline = time.time() + 300
  while not (tmp_path / "checkpoints" / "5").is_dir() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signum)
  out = proc.communicate(timeout=300)[0]
  name = signal.Signals(signum).name
  assert proc.returncode == code, out[-3000:]
  assert out.count(f"{name} received: finishing the step in flight") == 1, out[-3000:]
  assert f"run stopped by {name}" in out and "Traceback" not in out, out[-3000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  saved = summary["trainer_steps"]
  assert 5 < saved <= 10 and not summary["finished"]
  assert (tmp_path / "checkpoints" / str(saved) / "commit_success.txt").exists()
  assert not (tmp_path / "run.lock").read_text()  # released: the next run takes it without a word


# A stop while the sampler works (sampler/api.Interrupted): the window's eval or a chunk is cut at the sampler's
# next piece of work, the trainer stops before a step that would wait for it, and the resume makes it again.
def _every_window_evaluated():
  c = _config()
  c.loop.eval_every_syncs = 1  # an eval at steps 0 and 5
  c.checkpoint.every_syncs = 2  # no checkpoint at step 5 (a stop there saves the window's start)
  return c


@pytest.fixture(scope="module")
def full_evaluated(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("full_evaluated"))
  loop.train(assemble.setup(_every_window_evaluated(), workdir))
  return workdir


def _stop_in_sampler(run, stop, *, eval_step=None, chunk_call=None):
  """Asks `stop` for a stop (what SIGTERM's handler does) as the eval at `eval_step` starts, or as the sampler
  starts its `chunk_call`-th rollout chunk (0-based, over the run)."""
  evaluate, generate, chunks = run.evaluate, run.sampler.generate, []

  def evaluate_after_stop(params, **where):
    if where.get("step") == eval_step:
      stop.request("SIGTERM")
    return evaluate(params, **where)

  def generate_after_stop(*args, **kw):
    if kw.get("params") is None:  # a rollout chunk (an eval passes its params)
      if len(chunks) == chunk_call:
        stop.request("SIGTERM")
      chunks.append(1)
    return generate(*args, **kw)
  run.evaluate, run.sampler.generate = evaluate_after_stop, generate_after_stop
  return run


@pytest.mark.parametrize("eval_step", [0, 5])
def test_a_stop_in_a_window_eval_cuts_it_and_the_resume_runs_it(tmp_path, full_evaluated, eval_step):
  stopped, stop = str(tmp_path / "stopped"), preemption.StopFlag()
  run = _stop_in_sampler(assemble.setup(_every_window_evaluated(), stopped), stop, eval_step=eval_step)
  summary = loop.train(run, stop=stop)
  assert (summary["stopped_by"], summary["trainer_steps"]) == ("SIGTERM", eval_step)  # no step after the cut
  assert summary["cut"] == f"the eval at step {eval_step}" and not summary["finished"]
  assert not [k for step, k, _ in _values(stopped) if step == eval_step and k.startswith("eval/")]
  step_dirs = checkpoint_files.step_dirs(checkpoint_files.absolute(os.path.join(stopped, "checkpoints")))[0]
  assert sorted(step_dirs) == ([5] if eval_step else [])  # the window's start (not a checkpoint step of its own)
  if eval_step:
    meta = checkpoint_files.read_meta(step_dirs[5], 5)
    assert (meta.syncs_done, meta.window_steps_done) == (1, 0)

  summary = loop.train(assemble.setup(_every_window_evaluated(), stopped))
  assert summary["finished"] and "cut" not in summary
  assert _values(stopped) == _values(full_evaluated)  # the cut eval ran again, and nothing twice


def test_a_stop_while_a_chunk_is_made_stops_inside_the_window_and_resumes_equal(tmp_path, full_evaluated):
  stopped, stop = str(tmp_path / "stopped"), preemption.StopFlag()
  run = _stop_in_sampler(assemble.setup(_every_window_evaluated(), stopped), stop, chunk_call=3)  # window 2's 2nd
  summary = loop.train(run, stop=stop)
  assert summary["stopped_by"] == "SIGTERM" and summary["cut"] == "the rollouts of window 2, chunk 1"
  assert 5 <= summary["trainer_steps"] < 8  # steps 8 and 9 would draw chunk 1
  loop.train(assemble.setup(_every_window_evaluated(), stopped))
  assert _values(stopped) == _values(full_evaluated)
