"""The OAPL loop in two processes joined by jax.distributed on 127.0.0.1, 4 fake CPU devices each,
the sampler on its own devices (mesh.sampler_devices=4: 2 of every process's 4, parallel.split_devices).

Checked against a one-process run of the same config and seed on 8 devices (trainer on 4, sampler on
the other 4): every logged loss agrees; only process 0 writes reports; all processes killed with
kill -9 mid-run and restarted resume from the collective checkpoint to the same final metrics; SIGTERM
mid-window (to both processes at once, or to one a step before the other) stops both after the same step
with one checkpoint there, exit 0, and the resumed run logs what the uninterrupted one did.

The test runs this file as a script, once per process:
  python tests/multiprocess_loop_test.py --worker PORT NUM_PROCESSES PROCESS_ID WORKDIR RESULTS_DIR [WAIT_AT]
WAIT_AT: right after dispatching that trainer step (counted from the run's first), wait for this process's
SIGTERM (the test sends it once `waiting<PROCESS_ID>` appears in RESULTS_DIR).
"""
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICES = 8  # in all: one process of 8, or two of 4
# metric -> absolute tolerance next to rtol 1e-5: the log-ratio at a window's first step is float noise
# between the sampler's and the trainer's log-probs (~2e-7), so it gets an absolute floor.
COMPARED = {"train/loss": 0.0, "train/grad_norm": 0.0, "train/seq_log_ratio_abs_mean": 1e-6,
            "rollout/reward_mean": 0.0, "eval/held_out/reward_mean": 0.0}


def shaped_task(cfg):
  """Arithmetic (1 digit) with partial credit: 1/3 per leading digit of the completion. From a
  random policy exact match pays 0 everywhere, every advantage is 0 and the loss is ~0, which would
  make the comparison empty; this reward varies within every group from the first window."""
  from oapl_jax.tasks import arithmetic, rewards  # pylint: disable=import-outside-toplevel

  def leading_digits(completion: str, answer: str) -> float:
    del answer
    return min(3, len(completion) - len(completion.lstrip("0123456789"))) / 3

  task = arithmetic.make_task(cfg["num_train"], cfg["num_held_out"], seed=cfg["seed"], num_digits=1)
  return dataclasses.replace(task, reward_fn=rewards.Guarded(rewards.ItemReward(leading_digits)))


def loop_config():
  """configs/arithmetic.py:smoke, smaller, 2 windows of 3 steps (a stop can fall inside one), a checkpoint after
  every window."""
  from configs import arithmetic  # pylint: disable=import-outside-toplevel
  c = arithmetic.get_config("smoke")
  c.model.overrides.update(hidden_size=64, intermediate_size=256, head_dim=16)
  c.task.update(name="tests.multiprocess_loop_test:shaped_task", num_digits=1, num_train=64, num_held_out=8)
  c.warmstart.steps = 0
  c.sampler.update(num_slots=32, max_new_tokens=4, grow_cache=False)
  c.eval.update(num_prompts=8, samples=2, ks=(1, 2), max_new_tokens=4)
  c.loop.update(sync_every=3, num_syncs=2, eval_every_syncs=4)
  c.checkpoint.every_syncs = 1
  c.mesh.update(sampler_devices=4)
  return c


# ------------------------------------------------------------------------------ the worker process
class _Writes:
  """Paths this process opens for writing, renames or removes (Python's audit events)."""

  def __init__(self):
    self.paths, self.on = [], True
    sys.addaudithook(self._hook)

  def _hook(self, event, args):
    if not self.on:
      return
    if event == "open" and isinstance(args[0], str) and (any(m in str(args[1] or "") for m in "wax+")
                                                         or (args[2] or 0) & (os.O_WRONLY | os.O_RDWR)):
      self.paths.append(os.path.abspath(args[0]))
    elif event in ("os.rename", "os.replace", "os.remove", "os.unlink") and isinstance(args[0], str):
      self.paths.append(os.path.abspath(args[0]))


def _wait_for_signal_at(run, step: int, results: str, process_id: int):
  """run.train_step that, once it has dispatched trainer step `step`, marks `waiting<process_id>` and returns only
  once the loop's signal handler has run (rl/preemption.py): the signal lands at a known step."""
  from oapl_jax.rl import preemption  # pylint: disable=import-outside-toplevel
  received, handle, train_step, calls = threading.Event(), preemption.StopFlag._handle, run.train_step, [0]

  def handle_and_mark(self, signum, frame):
    handle(self, signum, frame)
    received.set()

  def step_then_wait(state, batch, rng):
    out = train_step(state, batch, rng)
    if calls[0] == step:
      open(os.path.join(results, f"waiting{process_id}"), "w").close()
      assert received.wait(timeout=600), "no signal came"
    calls[0] += 1
    return out
  preemption.StopFlag._handle = handle_and_mark
  run.train_step = step_then_wait
  return run


def _worker(port: int, num_processes: int, process_id: int, workdir: str, results: str, wait_at: int = -1) -> int:
  sys.path.insert(0, REPO)
  writes = _Writes()
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_default_matmul_precision", "highest")
  from oapl_jax import distributed, reporting  # pylint: disable=import-outside-toplevel
  from oapl_jax.rl import loop, preemption  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import assemble  # pylint: disable=import-outside-toplevel
  distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
  logged = []
  write_scalars = reporting.Reporter.scalars

  def scalars(self, step, metrics):  # what this process reports, whether or not it writes it
    logged.append({"step": step, **{k: float(v) for k, v in metrics.items()}})
    write_scalars(self, step, metrics)

  reporting.Reporter.scalars = scalars
  run = assemble.setup(loop_config(), workdir)
  summary = loop.train(run if wait_at < 0 else _wait_for_signal_at(run, wait_at, results, process_id))
  writes.on = False
  transfers = _check_transfers()
  with open(os.path.join(results, f"process{process_id}.json"), "w") as f:
    json.dump({"logged": logged, "writes": writes.paths, "pid": os.getpid(), "transfers": transfers,
               "summary": {k: v for k, v in summary.items() if k != "paths"}}, f)
  if num_processes > 1:
    jax.distributed.shutdown()
  return preemption.EXIT_CODES.get(summary.get("stopped_by"), 0)  # as apps/train.py


def _check_transfers() -> dict:
  """parallel.transfer between the run's two meshes for layouts that differ (FSDP -> tensor,
  sharded -> replicated): is every shard this process holds the reference's slice?"""
  import jax  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=import-outside-toplevel
  from oapl_jax import parallel  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import assemble, schema  # pylint: disable=import-outside-toplevel
  placement = assemble.placement(schema.from_config(loop_config()))
  reference_8x12 = np.arange(96, dtype=np.float32).reshape(8, 12)
  source = jax.make_array_from_callback((8, 12), NamedSharding(placement.trainer.mesh, P("fsdp", None)),
                                        lambda index: reference_8x12[index])
  out = {}
  for name, spec in (("to_columns", P(None, "fsdp")), ("to_replicated", P())):
    moved = parallel.transfer({"w": source}, {"w": NamedSharding(placement.sampler.mesh, spec)})["w"]
    on_sampler = {shard.device for shard in moved.addressable_shards} <= set(placement.sampler.mesh.devices.flat)
    out[name] = on_sampler and all(np.array_equal(np.asarray(shard.data), reference_8x12[shard.index])
                                   for shard in moved.addressable_shards)
  return out


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
  sys.exit(_worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6],
                   *map(int, sys.argv[7:8])))


# ------------------------------------------------------------------------------ the tests
def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def _start(num_processes: int, workdir, results, wait_at=()) -> list[subprocess.Popen]:
  """wait_at[i]: the trainer step after which process i waits for its SIGTERM (_wait_for_signal_at)."""
  port = _free_port() if num_processes > 1 else 0
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_", "XLA_"))}
  env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES // num_processes}"
             " --xla_backend_optimization_level=0", JAX_PLATFORMS="cpu",  # as conftest: LLVM's optimizer off
             TF_CPP_MIN_LOG_LEVEL="3")
  os.makedirs(results, exist_ok=True)
  return [subprocess.Popen([sys.executable, __file__, "--worker", str(port), str(num_processes), str(i), str(workdir),
                            str(results), *map(str, wait_at[i:i + 1])], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=open(os.path.join(results, f"process{i}.log"), "w"))
          for i in range(num_processes)]


def _finish(procs, results, timeout=600) -> list[dict]:
  deadline = time.time() + timeout
  try:
    for proc in procs:
      proc.wait(timeout=max(1, deadline - time.time()))
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  out = []
  for i, proc in enumerate(procs):
    if proc.returncode != 0:
      with open(os.path.join(results, f"process{i}.log")) as f:
        pytest.fail(f"process {i} exited with {proc.returncode}:\n{f.read()[-4000:]}")
    with open(os.path.join(results, f"process{i}.json")) as f:
      out.append(json.load(f))
  return out


def _series(logged: list[dict], key: str) -> dict[int, float]:
  return {h["step"]: h[key] for h in logged if key in h}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """One run of one process and one of two processes, side by side: (their reports, workdirs)."""
  root = tmp_path_factory.mktemp("uninterrupted")
  one, two = _start(1, root / "one", root / "one-results"), _start(2, root / "two", root / "two-results")
  return {"one": _finish(one, root / "one-results"), "two": _finish(two, root / "two-results"),
          "one_dir": str(root / "one"), "two_dir": str(root / "two")}


@pytest.mark.slow  # two whole processes (make test-all); fast: multiprocess_placement_test's rows and meshes
def test_two_processes_log_the_losses_of_one(uninterrupted):
  reference, (first, second) = uninterrupted["one"][0], uninterrupted["two"]
  for key, atol in COMPARED.items():
    want = _series(reference["logged"], key)
    assert sorted(want) == ([0, 6] if key.startswith("eval/") else list(range(6))), (key, sorted(want))
    for process in (first, second):
      got = _series(process["logged"], key)
      assert sorted(got) == sorted(want), key
      np.testing.assert_allclose([got[s] for s in want], [want[s] for s in want], rtol=1e-5, atol=atol, err_msg=key)
    np.testing.assert_array_equal(list(_series(second["logged"], key).values()),  # the processes agree exactly
                                  list(_series(first["logged"], key).values()), err_msg=key)
  assert first["transfers"] == second["transfers"] == {"to_columns": True, "to_replicated": True}
  losses = list(_series(reference["logged"], "train/loss").values())
  assert min(losses) > 1e-4, losses  # the shaped reward gives every window a loss worth comparing


@pytest.mark.slow  # shares the two-process run above; kept in make test-all (no fast test of it)
def test_only_process_0_writes_reports(uninterrupted):
  workdir = uninterrupted["two_dir"]
  first, second = uninterrupted["two"]
  outside_checkpoints = lambda paths: {p for p in paths if p.startswith(workdir)  # noqa: E731
                                       and not p.startswith(os.path.join(workdir, "checkpoints"))}
  assert outside_checkpoints(second["writes"]) == set(), "process 1 wrote reports"
  written = {os.path.relpath(p, workdir) for p in outside_checkpoints(first["writes"])}
  assert {"metrics.jsonl", "learning_curve.png", "summary.md", "summary.json"} <= written, written
  events = [name for name in os.listdir(workdir) if name.startswith("events.out.tfevents")]  # written by TF's C++
  assert events and all(f".{first['pid']}." in name for name in events), (events, first["pid"], second["pid"])
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    on_disk = [json.loads(line) for line in f]
  assert _series(on_disk, "train/loss") == _series(first["logged"], "train/loss")


def _committed_steps(workdir) -> set[int]:
  directory = os.path.join(workdir, "checkpoints")
  return {int(n) for n in os.listdir(directory) if n.isdigit()} if os.path.isdir(directory) else set()


@pytest.mark.slow  # 85 s in CI; resuming to the same metrics on two processes: the SIGTERM test below
def test_killed_processes_resume_to_the_uninterrupted_metrics(uninterrupted, tmp_path):
  workdir, results = tmp_path / "killed", tmp_path / "results"
  procs = _start(2, workdir, results)
  deadline = time.time() + 600
  while not _committed_steps(workdir) and time.time() < deadline and all(p.poll() is None for p in procs):
    time.sleep(0.2)
  for proc in procs:  # every process, mid-run, without a chance to clean up
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
  killed_at = _committed_steps(workdir)
  assert killed_at and max(killed_at) < 6, killed_at  # a checkpoint was taken, and the run was not over
  assert not os.path.exists(workdir / "summary.json")
  resumed = _finish(_start(2, workdir, tmp_path / "resumed"), tmp_path / "resumed")
  want = uninterrupted["two"][0]
  for key in COMPARED:
    after = {s: v for s, v in _series(want["logged"], key).items() if s >= max(killed_at)}
    assert after, key
    for process in resumed:
      got = _series(process["logged"], key)
      np.testing.assert_array_equal([got[s] for s in after], list(after.values()), err_msg=key)  # bit-identical
  final = lambda summary: {k: v for k, v in summary.items() if "(end)" in k or k in ("syncs", "snapshot_version")}  # noqa: E731
  assert final(resumed[0]["summary"]) == final(want["summary"]) and "eval/held_out/pass@1 (end)" in final(want["summary"])
  with open(workdir / "metrics.jsonl") as f:
    on_disk = [json.loads(line) for line in f]
  logged = [(h["step"], k) for h in on_disk for k in h if k != "step"]
  assert len(logged) == len(set(logged))  # steps re-run after the restore replaced the killed run's points
  assert _series(on_disk, "train/loss") == _series(want["logged"], "train/loss")


def _values(workdir) -> list[tuple]:
  """Every (step, metric, value) in metrics.jsonl but wall-clock times, in a canonical order."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return sorted((h["step"], k, v) for h in rows for k, v in h.items()
                if k != "step" and not k.endswith(("seconds", "tokens_per_second")))


def _signal_when_waiting(procs, results, process_id: int, timeout=600) -> None:
  marker, deadline = os.path.join(results, f"waiting{process_id}"), time.time() + timeout
  while not os.path.exists(marker) and time.time() < deadline and all(p.poll() is None for p in procs):
    time.sleep(0.05)
  assert os.path.exists(marker), f"process {process_id} never reached its step"
  os.kill(procs[process_id].pid, signal.SIGTERM)


# (process_id, step after which it gets SIGTERM) in the order sent; the first vote that saw a signal stops both
# after the next step: inside window 1 (steps 0-2) at 2, inside window 2 (steps 3-5) at 5
@pytest.mark.slow  # two whole processes; fast: preemption_test's one-process stop, resumed equal
@pytest.mark.parametrize("signals,saved", [(((0, 3), (1, 3)), 5), (((1, 0), (0, 1)), 2)],
                         ids=["both", "one-first"])
def test_sigterm_stops_both_processes_at_one_step_and_resumes_exactly(uninterrupted, tmp_path, signals, saved):
  workdir, results = tmp_path / "stopped", tmp_path / "results"
  wait_at = [step for _, step in sorted(signals)]
  procs = _start(2, workdir, results, wait_at)
  try:
    for process_id, _ in signals:
      _signal_when_waiting(procs, results, process_id)
  except BaseException:
    for proc in procs:
      proc.kill()
    raise
  stopped = _finish(procs, results)  # fails unless both exit 0
  for i, process in enumerate(stopped):
    with open(os.path.join(results, f"process{i}.log")) as f:
      log = f.read()
    assert log.count("SIGTERM received: finishing the step in flight") == 1, log[-3000:]
    assert f"stopped by SIGTERM after trainer step {saved}" in log, log[-3000:]
    summary = process["summary"]
    assert (summary["stopped_by"], summary["trainer_steps"], summary["finished"]) == ("SIGTERM", saved, False)
  assert _committed_steps(workdir) == {3, saved} if saved > 3 else {saved}  # window 1's end, then the stop's
  from oapl_jax import checkpoint_files  # pylint: disable=import-outside-toplevel
  step_dir = checkpoint_files.step_dirs(checkpoint_files.absolute(str(workdir / "checkpoints")))[0][saved]
  meta = checkpoint_files.read_meta(step_dir, saved)
  assert (meta.syncs_done, meta.window_steps_done) == (saved // 3, saved % 3) and saved % 3
  assert os.path.isdir(os.path.join(step_dir, "sampler"))  # the window's snapshot, saved with it
  resumed = _finish(_start(2, workdir, tmp_path / "resumed"), tmp_path / "resumed")
  assert all(process["summary"]["finished"] and "stopped_by" not in process["summary"] for process in resumed)
  want, got = _values(uninterrupted["two_dir"]), _values(workdir)
  assert len(want) > 50 and any(step >= saved and key == "train/loss" for step, key, _ in want)
  differ = sum(((Counter(want) - Counter(got)) + (Counter(got) - Counter(want))).values())
  print(f"\n{len(want)} (step, metric, value) compared after a stop at step {saved}: {differ} differ")
  assert got == want
