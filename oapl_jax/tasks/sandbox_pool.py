"""Runs sandboxed programs in parallel: `SandboxPool` drives `sandbox.run_once` from worker threads.

    with SandboxPool(num_workers=4, limits=sandbox.Limits(wall_s=5.0)) as pool:
      results = pool.run_batch([sandbox.Job(source, stdin) for source, stdin in programs])
      print(pool.stats().runs_per_s)

The isolation is probed once per config (`sandbox.resolve_isolation`), when the pool starts.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import threading
import time
from typing import Callable, Sequence

from oapl_jax.tasks import sandbox


@dataclasses.dataclass(frozen=True)
class PoolStats:
  """runs_per_s: completed runs per second of time with at least one run in flight."""
  runs: int
  busy_s: float

  @property
  def runs_per_s(self) -> float:
    return self.runs / self.busy_s if self.busy_s > 0 else 0.0


class SandboxPool:
  """Runs programs in parallel: `num_workers` threads, each driving one sandboxed child at a time.

  submit() returns at once; run_batch() blocks only until its own jobs are done. stats() gives the
  throughput for the trainer's log.
  """

  def __init__(self, num_workers: int = 2, limits: sandbox.Limits = sandbox.Limits(),
               config: sandbox.SandboxConfig = sandbox.SandboxConfig()):
    if num_workers < 1:
      raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    self.limits, self.config = limits, config
    self.isolation, self._run_config = sandbox.resolve_isolation(config)
    self._executor = cf.ThreadPoolExecutor(num_workers, thread_name_prefix="sandbox")
    self._lock = threading.Lock()
    self._in_flight = self._runs = 0
    self._busy_s = self._busy_since = 0.0

  def submit(self, source: str, stdin: bytes = b"", limits: sandbox.Limits | None = None,
             keep_stdout: Callable[[bytes], bytes] | None = None) -> cf.Future:
    """A future of the sandbox.RunResult of `source` run with `stdin` (keep_stdout: sandbox.run_once's)."""
    with self._lock:
      if self._in_flight == 0:
        self._busy_since = time.monotonic()
      self._in_flight += 1
    try:
      future = self._executor.submit(sandbox.run_once, source, stdin, limits or self.limits, self._run_config,
                                     self.isolation, keep_stdout)
    except BaseException:
      self._done(None, count=False)
      raise
    future.add_done_callback(self._done)
    return future

  def _done(self, _, count: bool = True) -> None:
    with self._lock:
      self._in_flight -= 1
      self._runs += count
      if self._in_flight == 0:
        self._busy_s += time.monotonic() - self._busy_since

  def run_batch(self, jobs: Sequence[sandbox.Job]) -> list[sandbox.RunResult]:
    futures = [self.submit(j.source, j.stdin, j.limits) for j in jobs]
    return [f.result() for f in futures]

  def stats(self) -> PoolStats:
    with self._lock:
      busy = self._busy_s + (time.monotonic() - self._busy_since if self._in_flight else 0.0)
      return PoolStats(runs=self._runs, busy_s=busy)

  def close(self) -> None:
    self._executor.shutdown(wait=True, cancel_futures=True)

  def __enter__(self) -> "SandboxPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
