"""Tests for oapl_jax.tasks.rewards: exact match, guards, registry, math_verify in processes."""
import json
import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from oapl_jax.run import config_base
from oapl_jax.tasks import factory, rewards


# Verifiers for MathReward's worker processes: module level, so they pickle by name.
def equal_or_misbehave(completion: str, answer: str) -> float:
  if completion == "slow":
    time.sleep(60)
  if completion == "boom":
    raise RuntimeError("verifier exploded")
  if completion == "crash":
    os._exit(3)  # the worker dies outright
  return float(completion == answer)


def _alive():
  return {p.pid for p in multiprocessing.active_children()}


def test_last_boxed():
  assert rewards.last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
  assert rewards.last_boxed("no box") is None
  assert rewards.last_boxed("\\boxed{unclosed") is None


def test_exact_match_reward():
  completions = ["  42 \n", "so the answer is \\boxed{42}.", "\\boxed{ 42 }", "43",
                 "\\boxed{4", "42 and \\boxed{41}", "\\boxed{\\frac{1}{2}}"]
  answers = ["42", "42", "42", "42", "4", "42", "\\frac{1}{2}"]
  got = rewards.exact_match_reward(completions, answers)
  assert got.dtype == np.float32
  np.testing.assert_array_equal(got, [1, 1, 1, 0, 0, 0, 1])


def test_item_reward_counts_failures():
  def score(c, a):
    if c == "boom":
      raise ValueError("bad")
    return float(c == a)
  result = rewards.ItemReward(score)(["x", "boom", "y"], ["x", "x", "z"])
  np.testing.assert_array_equal(result.rewards, [1, 0, 0])
  assert (result.num_failed, result.num_timeout) == (1, 0)


def test_guarded_never_raises_for_the_reward():
  def raises(c, a):
    raise RuntimeError("whole batch failed")
  result = rewards.Guarded(raises)(["a", "b"], ["a", "b"])
  np.testing.assert_array_equal(result.rewards, [0, 0])
  assert result.num_failed == 2

  result = rewards.Guarded(lambda c, a: np.array([np.nan, 1.0, np.inf]))(["a"] * 3, ["a"] * 3)
  np.testing.assert_array_equal(result.rewards, [0, 1, 0])
  assert result.num_failed == 2

  result = rewards.Guarded(lambda c, a: np.ones(5))(["a"] * 3, ["a"] * 3)  # wrong shape
  np.testing.assert_array_equal(result.rewards, [0, 0, 0])
  assert result.num_failed == 3

  with pytest.raises(ValueError, match="2 completions but 1 answers"):  # caller's bug
    rewards.Guarded(rewards.exact_match_reward)(["a", "b"], ["a"])


def test_registry():
  assert set(rewards.REWARDS) == {"exact_match", "math_verify"}
  r = rewards.make_reward("exact_match")(["\\boxed{7}"], ["7"])
  np.testing.assert_array_equal(r.rewards, [1])
  with pytest.raises(ValueError, match="unknown reward 'nope'"):
    rewards.make_reward("nope")


def test_math_verify_equivalence():
  reward = rewards.make_reward("math_verify", num_workers=2, timeout_s=10.0)
  try:
    result = reward(
        ["The answer is \\boxed{1/2}.", "\\boxed{3}", "I give up.",
         "so \\boxed{\\frac{\\sqrt{12}}{2}}", "\\boxed{5}"],
        ["0.5", "4", "7", "\\sqrt{3}", ""])  # an empty gold answer cannot be parsed
    np.testing.assert_array_equal(result.rewards, [1, 0, 0, 1, 0])
    assert (result.num_failed, result.num_timeout) == (1, 0)
  finally:
    reward.close()


def test_math_reward_failure_timeout_and_recovery():
  reward = rewards.MathReward(num_workers=2, timeout_s=5.0, verify_fn=equal_or_misbehave)
  try:
    reward(["warm"], ["warm"])
    workers_before = _alive()
    result = reward(["a", "slow", "b", "boom", "c", "d"], ["a", "x", "b", "x", "z", "d"])
    np.testing.assert_array_equal(result.rewards, [1, 0, 1, 0, 0, 1])
    assert (result.num_failed, result.num_timeout) == (1, 1)
    assert len(workers_before) == 2
    assert not workers_before & _alive()  # the hung worker was killed with its pool
    # The pool was recycled: later calls still work, on fresh workers.
    result = reward(["q", "r"], ["q", "q"])
    np.testing.assert_array_equal(result.rewards, [1, 0])
    assert (result.num_failed, result.num_timeout) == (0, 0)
    assert len(_alive()) == 2
  finally:
    reward.close()
  assert not multiprocessing.active_children()  # close() leaves no worker behind


def test_math_reward_survives_a_dead_worker():
  reward = rewards.MathReward(num_workers=1, timeout_s=5.0, verify_fn=equal_or_misbehave)
  try:
    result = reward(["a", "crash", "b"], ["a", "x", "b"])
    np.testing.assert_array_equal(result.rewards, [1, 0, 1])
    assert (result.num_failed, result.num_timeout) == (1, 0)
  finally:
    reward.close()


HANGING_REWARD = """
import time
def score(record, response):
  if response == "hang":
    time.sleep(30)  # as good as forever to a 1 s limit; a reward run in this process waits it out
  return float(response == record["answer"])
"""


@pytest.fixture
def hanging_reward(tmp_path, monkeypatch):
  (tmp_path / "hang_rewards.py").write_text(HANGING_REWARD)
  monkeypatch.syspath_prepend(str(tmp_path))  # the workers import it from the parent's sys.path
  return "hang_rewards:score"


def test_an_import_path_reward_that_hangs_times_out_scores_0_and_is_counted(hanging_reward):
  """Issue 41.1: a reward reached by import path runs in workers with a per-item limit."""
  reward = rewards.make_reward(hanging_reward, num_workers=2, timeout_s=1.0)
  record = json.dumps({"answer": "a"})
  try:
    result = reward(["a", "hang", "b", "a"], [record] * 4)
    assert result.rewards.tolist() == [1, 0, 0, 1]
    assert (result.num_failed, result.num_timeout) == (0, 1)
    assert reward([], []).rewards.tolist() == []
  finally:
    reward.close()
  assert not multiprocessing.active_children()  # the hung worker was killed


def test_the_probe_reports_a_reward_that_hangs_in_one_line(hanging_reward, tmp_path, caplog):
  """A records task's probe (what --dry_run runs) returns after the limit, with one warning line."""
  (tmp_path / "t.jsonl").write_text(json.dumps({"prompt": "p=", "answer": "a"}) + "\n")
  (tmp_path / "demos.jsonl").write_text(json.dumps({"prompt": "p=", "completion": "hang"}) + "\n")
  section = config_base.records_task(train_path=str(tmp_path / "t.jsonl"), eval_paths={}, reward=hanging_reward,
                                     demonstrations_path=str(tmp_path / "demos.jsonl"))
  section.update(reward_timeout_s=1.0, reward_workers=1)
  task = factory.build_task(section)
  try:  # the probe's response is the demonstration, "hang"
    with caplog.at_level("WARNING"):
      result = task.probe_reward()
  finally:
    task.close()
  assert (result.num_failed, result.num_timeout) == (0, 1) and result.rewards.tolist() == [0]
  [line] = caplog.records
  assert "the reward timed out on a probe before training" in line.getMessage()
  assert "hang_rewards:score timed out on item 0 after 1.0 s" in line.getMessage()


# Issue 54.4: rewards contained like the code sandbox (tasks/reward_worker.py).
HOSTILE_REWARDS = """
import os, sys, time
def daemon(record, response):
  middle = os.fork()
  if middle == 0:  # a verifier that daemonises: double fork, its own session, sleeping
    if os.fork() == 0:
      os.setsid()
      with open(record["pids"], "a") as f:
        f.write(f"{os.getpid()}\\n")
      time.sleep(300)
    os._exit(0)
  os.waitpid(middle, 0)  # as a daemonising parent does: only the daemon is left
  while len(open(record["pids"]).read().split()) < record["count"]:
    time.sleep(0.01)
  if response == "hang":
    time.sleep(60)
  return 1.0
def loud(record, response):
  for _ in range(100_000):
    print("y" * 99)  # 10 MB
  return 1.0
def hog(record, response):
  return float(len(bytearray(record["mb"] << 20)) > 0)
"""


@pytest.fixture
def hostile(tmp_path, monkeypatch):
  (tmp_path / "hostile_rewards.py").write_text(HOSTILE_REWARDS)
  monkeypatch.syspath_prepend(str(tmp_path))
  return tmp_path


def _running(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
  except OSError:
    return False


def _pids(path) -> list[int]:
  return [int(p) for p in path.read_text().split()]


def _daemon_record(hostile, count: int) -> str:
  return json.dumps({"pids": str(hostile / "pids"), "count": count})


def test_what_a_reward_starts_dies_with_its_item_its_timeout_and_close(hostile):
  (hostile / "pids").write_text("")
  reward = rewards.make_reward("hostile_rewards:daemon", num_workers=1, timeout_s=3.0)
  try:
    result = reward(["ok"], [_daemon_record(hostile, 1)])
    assert result.rewards.tolist() == [1] and (result.num_failed, result.num_timeout) == (0, 0)
    [first] = _pids(hostile / "pids")
    assert not _running(first)  # killed when its item returned
    result = reward(["hang"], [_daemon_record(hostile, 2)])
    assert result.rewards.tolist() == [0] and result.num_timeout == 1
    assert not any(map(_running, _pids(hostile / "pids")))  # killed with the timed-out worker
    assert reward.fn.left_running == 1
  finally:
    reward.close()
  assert not multiprocessing.active_children()


EXIT_MID_ITEM = """
import json, os, sys, threading, time
from oapl_jax.tasks import rewards
reward = rewards.make_reward("hostile_rewards:daemon", num_workers=1, timeout_s=60.0)
record = json.dumps({{"pids": {pids!r}, "count": 1}})
threading.Thread(target=reward, args=(["hang"], [record]), daemon=True).start()
while not open({pids!r}).read().strip():
  time.sleep(0.01)
os._exit(0)  # no close(), no exit hooks: as if the trainer were killed
"""


def test_a_killed_trainer_leaves_no_reward_process_behind(hostile):
  (hostile / "pids").write_text("")
  script = EXIT_MID_ITEM.format(pids=str(hostile / "pids"))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hostile), os.environ.get("PYTHONPATH", "")]))
  subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
  [daemon] = _pids(hostile / "pids")
  deadline = time.monotonic() + 10
  while _running(daemon) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not _running(daemon)  # the worker saw its parent gone and killed what it started


def test_a_reward_that_prints_10_mb_reaches_the_log_only_as_its_first_lines_and_a_count(hostile, capfd, caplog):
  reward = rewards.make_reward("hostile_rewards:loud", num_workers=2, timeout_s=30.0)
  try:
    with caplog.at_level("WARNING"):
      result = reward(["a", "b"], ["{}", "{}"])
  finally:
    reward.close()
  assert result.rewards.tolist() == [1, 1]
  out, err = capfd.readouterr()
  assert len(out) + len(err) < 10_000  # not the 20 MB printed
  printed = reward.fn.printed
  assert (printed.lines, printed.bytes) == (200_000, 20_000_000)
  assert printed.head == ["y" * 99] * 20 and printed.dropped_lines == 199_980
  logged = "\n".join(r.getMessage() for r in caplog.records)
  assert logged.count("y" * 99) == 20 and "199980 lines (19998000 bytes) were counted, not shown" in logged


def test_an_allocation_past_reward_memory_mb_fails_fast_and_is_counted(hostile):
  reward = rewards.make_reward("hostile_rewards:hog", num_workers=1, timeout_s=30.0, memory_mb=256)
  try:
    start = time.monotonic()
    result = reward(["a", "b"], [json.dumps({"mb": 2048}), json.dumps({"mb": 64})])
    assert time.monotonic() - start < 20
  finally:
    reward.close()
  assert result.rewards.tolist() == [0, 1] and (result.num_failed, result.num_timeout) == (1, 0)


def test_reward_memory_mb_is_a_task_field(hostile, tmp_path):
  (tmp_path / "t.jsonl").write_text(json.dumps({"prompt": "p=", "answer": "a", "mb": 2048}) + "\n")
  section = config_base.records_task(train_path=str(tmp_path / "t.jsonl"), eval_paths={},
                                     reward="hostile_rewards:hog")
  section.update(reward_memory_mb=256, reward_workers=1)
  task = factory.build_task(section)
  try:
    assert task.reward_fn.fn.fn.memory_mb == 256  # Guarded(FinishedOnly(RecordReward))
  finally:
    task.close()
  with pytest.raises(ValueError, match="reward_memory_mb=-1: must be >= 0"):
    factory.build_task(dict(section, reward_memory_mb=-1))
