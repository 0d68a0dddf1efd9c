"""Reward functions, all with one signature: (completions, answers) -> RewardResult.

None of them may crash or hang the caller: `Guarded` turns any exception into reward 0 with a failure
count, `ItemReward` does the same per item, and `WorkerReward` runs a per-item score in worker processes
with a per-item timeout: math_verify (`MathReward`) and every user's `score(record, response) -> float`
reached by import path 'package.module:function' (`RecordReward`). `make_reward(name)` builds a guarded
one from `REWARDS` or an import path.
"""
from __future__ import annotations

import atexit
import collections
import concurrent.futures as cf
from concurrent.futures.process import BrokenProcessPool
import functools
import importlib
import json
import logging
import multiprocessing
import threading
import time
from typing import Callable
import weakref

import numpy as np

from oapl_jax.tasks import base, reward_worker
from oapl_jax.tasks.reward_worker import as_reward as _as_reward

log = logging.getLogger(__name__)
RewardResult = base.RewardResult
ScoreFn = Callable[[str, str], float]  # (completion, answer) -> reward


def last_boxed(text: str) -> str | None:
  """Content of the last \\boxed{...} (braces balanced), or None."""
  start = text.rfind("\\boxed{")
  if start < 0:
    return None
  depth, begin = 0, start + len("\\boxed")
  for j in range(begin, len(text)):
    depth += {"{": 1, "}": -1}.get(text[j], 0)
    if depth == 0:
      return text[begin + 1:j]
  return None


def _unbox(text: str) -> str:
  boxed = last_boxed(text)
  return (text if boxed is None else boxed).strip()


def exact_match_score(completion: str, answer: str) -> float:
  """1.0 iff the (boxed, if any) answers agree after stripping whitespace."""
  return float(_unbox(completion) == _unbox(answer))


def exact_match_reward(completions: list[str], answers: list[str]) -> np.ndarray:
  return np.array([exact_match_score(c, a) for c, a in zip(completions, answers, strict=True)],
                  np.float32)


class ItemReward:
  """Batches a per-item score; an item whose score raises or is not a finite number gets 0 and
  counts as failed."""

  def __init__(self, score_fn: ScoreFn):
    self.score_fn = score_fn
    self._traced = False  # a traceback was logged

  def __call__(self, completions: list[str], answers: list[str]) -> RewardResult:
    rewards = np.zeros(len(completions), np.float32)
    failed = 0
    for i, (c, a) in enumerate(zip(completions, answers, strict=True)):
      try:
        rewards[i] = _as_reward(self.score_fn(c, a))
      except Exception as e:  # pylint: disable=broad-except
        # the first failure with its traceback, later ones in a line each (not a traceback per item)
        log.warning("reward %r failed on item %d: %s: %s", self.score_fn, i, type(e).__name__, e,
                    exc_info=not self._traced)
        self._traced = True
        failed += 1
    return RewardResult(rewards, num_failed=failed)


class Guarded:
  """Never raises on a reward function's behalf: errors, non-numbers and non-finite rewards become 0,
  are counted in num_failed and logged."""

  def __init__(self, fn: Callable[[list[str], list[str]], RewardResult | np.ndarray]):
    self.fn = fn

  def __call__(self, completions: list[str], answers: list[str]) -> RewardResult:
    completions, answers = list(completions), list(answers)
    n = len(completions)
    if len(answers) != n:  # the caller's bug, not the reward's: fail loudly
      raise ValueError(f"{n} completions but {len(answers)} answers")
    try:
      out = self.fn(completions, answers)
      result = out if isinstance(out, RewardResult) else RewardResult(out)
      raw = np.asarray(result.rewards)
      if raw.dtype == object and raw.ndim == 1 and all(  # a list with missing items: those fail, the rest count
          v is None or (isinstance(v, (int, float, np.number)) and not isinstance(v, bool)) for v in raw):
        raw = np.array([np.nan if v is None else float(v) for v in raw], np.float64)
      if raw.dtype.kind not in "biuf":  # strings, objects: not rewards (numpy would parse '0.5')
        raise ValueError(f"rewards must be numbers, got an array of {raw.dtype}")
      rewards = raw.astype(np.float32)
      if rewards.shape != (n,):
        raise ValueError(f"reward shape {rewards.shape}, expected ({n},)")
      num_failed, num_timeout = int(result.num_failed), int(result.num_timeout)
    except Exception:  # pylint: disable=broad-except
      log.exception("reward %r failed on a batch of %d; scoring it 0", self.fn, n)
      return RewardResult(np.zeros(n, np.float32), num_failed=n)
    bad = ~np.isfinite(rewards)
    if bad.any():
      log.warning("reward %r returned %d non-finite values of %d; scored 0 and counted as failed",
                  self.fn, int(bad.sum()), n)
    return RewardResult(np.where(bad, np.float32(0), rewards), num_failed=num_failed + int(bad.sum()),
                        num_timeout=num_timeout)

  def close(self) -> None:
    close = getattr(self.fn, "close", None)  # plain functions hold nothing to release
    if close is not None:
      close()


def _ready(score_fn: ScoreFn, warmup: Callable[[], object] | None) -> None:
  """Run once per fresh worker: unpickling score_fn imports its module there; warmup (which the worker ran
  already, reward_worker.contain) raises here, with its traceback, if it failed."""
  del score_fn
  if warmup is not None:
    warmup()


def _remote_traceback(e: BaseException) -> str:
  """The worker's traceback of an exception a process pool re-raised here ('' for one raised here)."""
  return str(getattr(e.__cause__, "tb", "")).strip().strip('"').strip()


_live: "weakref.WeakSet[WorkerReward]" = weakref.WeakSet()


def _close_all() -> None:
  """At the trainer's exit, workers (and anything they started) are killed even if no one called close()."""
  for reward in list(_live):
    reward.close()


# Before concurrent.futures' own exit hook (registered earlier, run later), which waits for items in flight.
getattr(threading, "_register_atexit", atexit.register)(_close_all)


class WorkerReward:
  """A per-item `score_fn(completion, answer) -> float` in worker processes, one item per task, `timeout_s` each.

  Worker processes, not threads: a score that blocks in C or sleeps can only be stopped by killing its
  process (and math_verify's SIGALRM works only in a main thread). An item that raises or is not a finite
  number scores 0 (num_failed); one that runs past timeout_s scores 0 (num_timeout) and the pool is killed
  and restarted, re-running the items that were in flight beside it. `score_fn` must pickle (module level or
  a functools.partial of one); `warmup()` runs once in each fresh worker, before any item's clock starts.

  Contained (tasks/reward_worker.py): what an item starts is killed when it returns, and with its worker on a
  timeout, close() or the trainer's exit; its prints never reach the trainer's stdout (the first KEEP_LINES
  of the run are logged, the rest counted in `printed`); memory_mb > 0 caps what an item may allocate
  (past it: MemoryError, a failure).
  """

  def __init__(self, score_fn: ScoreFn, num_workers: int = 2, timeout_s: float = 10.0, name: str = "",
               warmup: Callable[[], object] | None = None, mp_context: str = "spawn",
               startup_timeout_s: float = 120.0, memory_mb: int = 0):
    self.score_fn, self.warmup, self.name = score_fn, warmup, name or repr(score_fn)
    self.num_workers = num_workers
    self.timeout_s = timeout_s
    self.mp_context = mp_context
    self.startup_timeout_s = startup_timeout_s
    self.memory_mb = memory_mb
    self.printed = reward_worker.PrintLog()
    self.left_running = 0  # processes items left behind (killed)
    self._dropped_logged = 0  # printed bytes not shown, as last logged
    self._pool: cf.ProcessPoolExecutor | None = None
    self._traced = False  # a failure's traceback was logged
    _live.add(self)

  def __repr__(self) -> str:
    return f"{type(self).__name__}({self.name})"

  def _start(self) -> cf.ProcessPoolExecutor:
    self._pool = cf.ProcessPoolExecutor(self.num_workers, mp_context=multiprocessing.get_context(self.mp_context),
                                        initializer=reward_worker.contain, initargs=(self.memory_mb, self.warmup))
    # Workers spawn on submit; start all now so start-up is not billed to item timeouts.
    for f in [self._pool.submit(_ready, self.score_fn, self.warmup) for _ in range(self.num_workers)]:
      f.result(timeout=self.startup_timeout_s)
    return self._pool

  def close(self) -> None:
    """Kills the workers and everything they started (a hung one never returns by itself)."""
    if self.printed.dropped_bytes > self._dropped_logged:
      log.warning("reward %s printed %d lines (%d bytes) so far; %d lines (%d bytes) were counted, not shown",
                  self.name, self.printed.lines, self.printed.bytes, self.printed.dropped_lines,
                  self.printed.dropped_bytes)
      self._dropped_logged = self.printed.dropped_bytes
    pool, self._pool = self._pool, None
    if pool is None:
      return
    procs = list(pool._processes.values())  # pylint: disable=protected-access
    manager = pool._executor_manager_thread  # pylint: disable=protected-access
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
      if p.exitcode is None:  # not reaped yet, so its pid is still its own
        reward_worker.kill_tree(p.pid)
    # The pool's manager thread also reaps the killed workers. Wait for it: a join racing it can
    # come back before the exit code is recorded, and the worker then still looks alive.
    if manager is not None:
      manager.join(timeout=60)
    for p in procs:
      p.join(timeout=60)

  def __call__(self, completions: list[str], answers: list[str]) -> RewardResult:
    try:
      return self._score(completions, answers)
    except BaseException:
      self.close()  # leave no broken pool behind for the next call
      raise

  def _failed(self, i: int, error: str, trace: str) -> None:
    """One line per failed item; the first also with the worker's traceback."""
    trace = "" if self._traced else trace.strip()
    log.warning("reward %s failed on item %d: %s%s", self.name, i, error, f"\n{trace}" if trace else "")
    self._traced |= bool(trace)

  def _account(self, i: int, outcome: reward_worker.Outcome) -> None:
    """Logs the first lines the reward printed in the run, and processes an item left running."""
    if new := self.printed.add(outcome.printed):
      log.warning("reward %s printed (kept off the trainer's stdout; the first %d lines of the run are logged here, "
                  "the rest counted):\n%s", self.name, reward_worker.KEEP_LINES, "\n".join(new))
    if outcome.left_running and not self.left_running:
      log.warning("reward %s left %d processes running after item %d; they were killed (and will be after every "
                  "item: a reward keeps no process between items)", self.name, outcome.left_running, i)
    self.left_running += outcome.left_running

  def _score(self, completions: list[str], answers: list[str]) -> RewardResult:
    rewards = np.zeros(len(completions), np.float32)
    failed = timeouts = 0
    todo = collections.deque(range(len(completions)))
    running: dict[cf.Future, tuple[int, float]] = {}  # future -> (item, deadline)
    while todo or running:
      pool = self._pool or self._start()
      while todo and len(running) < self.num_workers:  # at most one item per worker
        i = todo.popleft()
        f = pool.submit(reward_worker.run_item, self.score_fn, completions[i], answers[i])
        running[f] = (i, time.monotonic() + self.timeout_s)
      next_deadline = min(d for _, d in running.values())
      done, _ = cf.wait(running, timeout=max(0.0, next_deadline - time.monotonic()),
                        return_when=cf.FIRST_COMPLETED)
      broken = False
      for f in done:
        i, _ = running.pop(f)
        try:
          outcome = f.result()
        except Exception as e:  # pylint: disable=broad-except  (the worker died, a result that does not pickle)
          self._failed(i, f"{type(e).__name__}: {e}", _remote_traceback(e))
          failed += 1
          broken |= isinstance(e, BrokenProcessPool)
          continue
        if outcome.error:  # logged first: a probe reports the first line logged (base.Task.probe_reward)
          self._failed(i, outcome.error + (f" (past task.reward_memory_mb={self.memory_mb})"
                                           if outcome.out_of_memory and self.memory_mb else ""), outcome.trace)
          failed += 1
        else:
          rewards[i] = outcome.value
        self._account(i, outcome)
      now = time.monotonic()
      expired = [f for f, (_, d) in running.items() if d <= now]
      for f in expired:
        log.warning("reward %s timed out on item %d after %.1f s; scored 0", self.name, running.pop(f)[0],
                    self.timeout_s)
      timeouts += len(expired)
      if expired or broken:  # kill the pool; the items beside the bad one run again
        todo.extendleft(i for i, _ in running.values())
        running.clear()
        self.close()
    return RewardResult(rewards, num_failed=failed, num_timeout=timeouts)


class MathReward(WorkerReward):
  """math_verify equivalence (tasks/math_verifier.py) in worker processes, `timeout_s` per item; `verify_fn`
  replaces it (module level, for tests)."""

  def __init__(self, num_workers: int = 2, timeout_s: float = 5.0, verify_fn: ScoreFn | None = None,
               mp_context: str = "spawn", startup_timeout_s: float = 120.0, memory_mb: int = 0):
    if verify_fn is None:
      from oapl_jax.tasks import math_verifier  # pylint: disable=import-outside-toplevel
      # math_verify's own (soft) timeouts: three calls, all inside our hard one.
      verify_fn = functools.partial(math_verifier.score, timeout_s=max(1, int(timeout_s / 3)))
    super().__init__(verify_fn, num_workers, timeout_s, name="math_verify", mp_context=mp_context,
                     startup_timeout_s=startup_timeout_s, memory_mb=memory_mb)


@functools.lru_cache(maxsize=None)
def _imported_score(path: str) -> Callable[[dict, str], float]:
  return import_score(path)


def score_record(path: str, completion: str, answer: str) -> float:
  """In a worker: the `score(record, response)` at import path `path` on the record (JSON in `answer`)."""
  return _imported_score(path)(json.loads(answer), completion)


class RecordReward(WorkerReward):
  """A user's `score(record: dict, response: str) -> float`, by import path 'package.module:function', behind
  the batch signature, in worker processes with `timeout_s` per item (the module is imported in each worker,
  from the same sys.path and working directory). The task puts each problem's source record, as JSON, in its
  answer (tasks/records_task.py)."""

  def __init__(self, path: str, num_workers: int = 2, timeout_s: float = 10.0, **kwargs):
    import_score(path)  # a bad path fails here, not in every worker
    super().__init__(functools.partial(score_record, path), num_workers, timeout_s, name=path,
                     warmup=functools.partial(_imported_score, path), **kwargs)


class FinishedOnly:
  """Scores only responses that ended, without their end marker: for a tokenizer that renders eos as
  `eos_text`. A response cut at the token budget (no eos) gets `unfinished_reward` and is not scored."""

  def __init__(self, fn: Callable[[list[str], list[str]], RewardResult | np.ndarray], eos_text: str,
               unfinished_reward: float = 0.0):
    self.fn, self.eos_text, self.unfinished_reward = fn, eos_text, unfinished_reward

  def __call__(self, completions: list[str], answers: list[str]) -> RewardResult:
    finished = [i for i, c in enumerate(completions) if self.eos_text in c]
    rewards = np.full(len(completions), self.unfinished_reward, np.float32)
    if not finished:
      return RewardResult(rewards)
    out = self.fn([completions[i].partition(self.eos_text)[0] for i in finished], [answers[i] for i in finished])
    result = out if isinstance(out, RewardResult) else RewardResult(np.asarray(out))
    rewards[finished] = result.rewards
    return RewardResult(rewards, num_failed=result.num_failed, num_timeout=result.num_timeout)

  def close(self) -> None:
    close = getattr(self.fn, "close", None)
    if close is not None:
      close()


def import_score(path: str) -> Callable[[dict, str], float]:
  """'package.module:function' -> the function, or a ValueError saying which part is missing."""
  module_name, _, attr = path.partition(":")
  if not module_name or not attr:
    raise ValueError(f"reward {path!r}: expected a name in {sorted(REWARDS)} or 'package.module:function'")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"reward {path!r}: cannot import {module_name!r} ({e}); is it installed or on PYTHONPATH?") from e
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise ValueError(f"reward {path!r}: {module_name} has no function {attr!r}")
  return fn


REWARDS: dict[str, Callable[..., Callable]] = {
    "exact_match": lambda: ItemReward(exact_match_score),
    "math_verify": MathReward,
}


def reward_by_name(name: str, **kwargs) -> Callable:
  """The (unguarded) reward named in REWARDS, kwargs to its constructor (e.g. MathReward's), or a
  RecordReward (kwargs: WorkerReward's) of the `score(record, response)` at import path 'package.module:function'."""
  if ":" in name:
    return RecordReward(name, **kwargs)
  if name not in REWARDS:
    raise ValueError(f"unknown reward {name!r}; known: {sorted(REWARDS)} or 'package.module:function'")
  return REWARDS[name](**kwargs)


def make_reward(name: str, **kwargs) -> Guarded:
  """`reward_by_name`, guarded: it never raises on the reward's behalf."""
  return Guarded(reward_by_name(name, **kwargs))
