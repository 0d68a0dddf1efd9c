"""The sampler side of Algorithm 1: a background thread that fills the buffer, one window at a time.

For each sync window the loop hands it (snapshot version, window index, data position). It then
(optionally) evaluates the fresh snapshot on held-out prompts, and generates the schedule's chunks
of P prompts x G samples with the sampler's frozen params, scores them with the task and adds them
to the buffer. Every chunk's prompts and seed are functions of (seed, data position, version,
chunk), so a resumed run regenerates exactly what an uninterrupted run would have.

`inline=True` runs the same work in the caller's thread instead, chunk by chunk as the trainer needs
them (`produce`): with the same chunks, seeds and buffer schedule the results are identical, only
the overlap is gone. The loop uses it where two threads must not run cross-process programs at the
same time: on JAX's CPU backend (0.10.2, gloo collectives), two threads each running programs over
disjoint device sets that span the same processes deadlock (measured with a two-process probe: each
side alone runs, both at once hang; see rl/loop.py).
"""
import dataclasses
import logging
import queue
import threading
import time
from typing import Callable, Optional

import numpy as np

from oapl_jax.reporting import PhaseClock
from oapl_jax.rl.buffer import RolloutBuffer
from oapl_jax.rl.demo_mix import DemoMixer
from oapl_jax.rl.monitors import MonitorConfig, RolloutChecks, check_reward_failures
from oapl_jax.rl.schedule import WindowSchedule, prompt_order
from oapl_jax.sampler import api
from oapl_jax.sampler.settings import SamplingSettings
from oapl_jax.tasks.base import Task


@dataclasses.dataclass(frozen=True)
class Window:
  version: int  # the sampler snapshot every group of this window must come from
  index: int  # which sync window (0, 1, ...)
  data_position: int  # index of the first training prompt of this window
  evaluate: bool
  first_step: int  # the trainer step the window starts at (windows may end early: loop.refresh_drift)

  def chunk_step(self, chunk: int, steps_per_chunk: int) -> int:
    """The trainer step at which `chunk` becomes visible (for logging)."""
    return self.first_step + chunk * steps_per_chunk


class RolloutWorker(threading.Thread):

  def __init__(self, sampler: api.GroupSampler, task: Task, buffer: RolloutBuffer, schedule: WindowSchedule,
               settings: SamplingSettings, *, group_size: int, seed: int, eval_fn: Callable[[int], dict],
               monitors: MonitorConfig = MonitorConfig(), inline: bool = False, lookahead: Optional[int] = None,
               demo_mixer: Optional[DemoMixer] = None, phases: Optional[PhaseClock] = None,
               save_rollouts: Optional[Callable] = None):
    super().__init__(name="oapl-rollout-worker", daemon=True)
    self.sampler, self.task, self.buffer, self.schedule, self.settings = sampler, task, buffer, schedule, settings
    self.group_size, self.seed, self.eval_fn, self.monitors = group_size, seed, eval_fn, monitors
    self.checks = RolloutChecks(monitors, settings.max_new_tokens)
    self.stats: "queue.Queue[tuple[int, dict]]" = queue.Queue()  # (trainer step, metrics) for the loop
    self._windows: "queue.Queue[Optional[Window]]" = queue.Queue()
    self._cut = threading.Event()  # the trainer ended the window early: generate no further chunk of it
    # threaded: generate chunk c only once c < (chunks the trainer may see) + lookahead; None: run ahead freely
    # (a window that may end early, loop.refresh_drift, then wastes at most `lookahead` chunks)
    self.lookahead, self._visible = lookahead, threading.Condition()
    self.demo_mixer = demo_mixer  # loop.demo_fraction: demonstrations replace samples before scoring
    self.phases = phases or PhaseClock()  # this thread's time per phase (summary.md)
    self.save_rollouts = save_rollouts  # (window, problems, groups, rewards_PxG) of each window's first chunk
    self._chunks_visible = 0
    self._done = threading.Event()
    self._done.set()
    self.error: Optional[BaseException] = None
    self.cut: Optional[str] = None  # the work a stop interrupted (sampler/api.Interrupted): no more is made
    self.inline = inline
    self._window: Optional[Window] = None  # inline: the window being produced, and its next chunk
    self._next_chunk = 0

  def start(self) -> None:
    if not self.inline:
      super().start()

  def join(self, timeout: Optional[float] = None) -> None:
    if not self.inline:
      super().join(timeout)

  def produce(self, chunks: int) -> None:
    """The trainer's step may now see `chunks` chunks. Inline: generate them, in this thread (the window's eval
    first). Threaded: the worker produces on its own, `lookahead` chunks ahead of this when that is set."""
    if not self.inline:
      with self._visible:
        self._chunks_visible = chunks
        self._visible.notify_all()
      return
    if self._window is None:
      return
    w = self._window
    try:
      if self._next_chunk == 0 and w.evaluate:
        self._evaluate(w)
      while self._next_chunk < min(chunks, self.schedule.num_chunks):
        self._next_chunk += 1
        self._checked_chunk(w, self._next_chunk - 1)
    except api.Interrupted:
      self._interrupted(w, None if self._next_chunk == 0 else self._next_chunk - 1)
    except BaseException as e:
      self.error, self._window = e, None
      self.buffer.close()
      raise RuntimeError(f"the rollout worker failed: {e}") from e

  def start_window(self, window: Window) -> None:
    if self.inline:
      self._window, self._next_chunk = window, 0
      return
    self._cut.clear()
    with self._visible:
      self._chunks_visible = 0
    self._done.clear()
    self._windows.put(window)

  def wait_window(self, cut: bool = False) -> None:
    """Until the window's chunks are made; `cut`: the window ended early, so stop after the chunk being made
    (what was generated beyond the trainer's last visible chunk is dropped with the buffer)."""
    if self.inline:
      if not cut:
        self.produce(self.schedule.num_chunks)
      self._window = None
    if cut:
      with self._visible:
        self._cut.set()
        self._visible.notify_all()
    self._done.wait()
    if self.error is not None:
      raise RuntimeError(f"the rollout worker failed: {self.error}") from self.error

  def stop(self) -> None:
    if not self.inline:
      self._windows.put(None)

  def _timed(self, phase: str):
    return self.phases.timed("sampler", phase)

  def _evaluate(self, w: Window) -> None:
    with self._timed("eval"):
      self.stats.put((w.first_step, self.eval_fn(w.first_step)))

  def _interrupted(self, w: Window, chunk: Optional[int]) -> None:
    """A stop cut the window's eval (chunk None) or a chunk: nothing more is made, and the trainer, waiting or
    next to wait for data, finds the buffer closed and `cut` set."""
    self.cut = (f"the eval at step {w.first_step}" if chunk is None else
                f"the rollouts of window {w.index + 1}, chunk {chunk}")
    logging.warning("%s cut by the stop (the resume makes it again)", self.cut)
    self._window = None
    self.buffer.close()

  def _next_window(self) -> Optional[Window]:
    with self._timed("waiting for the trainer"):  # to end the window and refresh the snapshot
      return self._windows.get()

  def run(self) -> None:
    while (window := self._next_window()) is not None:
      try:
        self._run_window(window)
      except BaseException as e:  # surfaced to the trainer thread by wait_window / a closed buffer
        self.error = e
        self.buffer.close()
      finally:
        self._done.set()

  def _run_window(self, w: Window) -> None:
    chunk = None
    try:
      if w.evaluate:
        self._evaluate(w)
      for chunk in range(self.schedule.num_chunks):
        if self.lookahead is not None:
          with self._visible, self._timed("waiting for the trainer"):
            self._visible.wait_for(lambda c=chunk: self._cut.is_set() or c < self._chunks_visible + self.lookahead)
        if self._cut.is_set():
          return
        self._checked_chunk(w, chunk)
    except api.Interrupted:
      self._interrupted(w, chunk)
      return
    self.checks.window_end(w.index)

  def _checked_chunk(self, w: Window, chunk: int) -> None:
    position = self.schedule.chunk_position(w.data_position, chunk)
    try:
      self._run_chunk(w, chunk, position)
    except api.Interrupted:
      raise
    except Exception as e:
      raise RuntimeError(f"window {w.index} (snapshot {w.version}), chunk {chunk} of task {self.task.name!r} "
                         f"(training prompts at data positions {position}..{position + self.schedule.prompts_per_chunk - 1}"
                         f"): {type(e).__name__}: {e}") from e

  def _run_chunk(self, w: Window, chunk: int, position: int) -> None:
    idx = prompt_order(len(self.task.train), position, self.schedule.prompts_per_chunk, self.seed)
    problems = [self.task.train[i] for i in idx]
    start = time.perf_counter()
    with self._timed("sampling"):
      groups = self.sampler.generate(
          [p.prompt_tokens for p in problems], self.group_size, self.settings,
          seed=int(np.random.default_rng([self.seed, w.version, chunk]).integers(2**31)),
          prompt_ids=list(range(position, position + len(problems))))
    demos = []
    if self.demo_mixer is not None:
      demos = self.demo_mixer.mix(self.sampler, groups, np.random.default_rng([self.seed, w.version, chunk, 1]))
    with self._timed("scoring"):
      rewards_PxG, result = self.task.score_groups(problems, groups.response_tokens, groups.lengths)
    check_reward_failures(result.num_failed + result.num_timeout, rewards_PxG.size, self.monitors,
                          f"rewards of window {w.index}, chunk {chunk}")
    truncated_fraction = float((groups.finish_reason == api.FINISH_LENGTH).mean())
    self.checks.chunk(w.index, chunk, truncated_fraction, rewards_PxG)
    if chunk == 0 and self.save_rollouts is not None:
      self.save_rollouts(w.index, problems, groups, rewards_PxG)
    if groups.snapshot_version != w.version:
      raise RuntimeError(f"sampler is at version {groups.snapshot_version}, window expects {w.version}")
    with self._timed("packing: groups into the buffer"):
      self.buffer.add(groups, rewards_PxG, self.demo_mixer.chunk_fields(demos, groups) if self.demo_mixer else None)
    self.stats.put((w.chunk_step(chunk, self.schedule.steps_per_chunk), {
        "rollout/reward_mean": float(rewards_PxG.mean()),
        "rollout/frac_groups_all_equal_reward": float((rewards_PxG == rewards_PxG[:, :1]).all(-1).mean()),
        "rollout/response_length": float(groups.lengths.mean()),
        "rollout/truncated_fraction": truncated_fraction,
        "rollout/tokens_per_second": groups.tokens_per_second,
        "rollout/seconds": time.perf_counter() - start,
        "rollout/reward_failures": float(result.num_failed + result.num_timeout),
        "rollout/generations": float(rewards_PxG.size - len(demos)),
        **({"rollout/demo_samples": float(len(demos)),
            "rollout/demo_reward_mean": float(np.mean([rewards_PxG[p, g] for p, g in demos]))} if demos else {}),
        "rollout/snapshot_version": float(groups.snapshot_version),
    }))
