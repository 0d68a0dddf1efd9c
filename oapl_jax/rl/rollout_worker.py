"""The sampler side of Algorithm 1: a background thread that fills the buffer, one window at a time.

For each sync window the loop hands it (snapshot version, data position, number of chunks). It
then (optionally) evaluates the fresh snapshot on held-out prompts, and generates `num_chunks`
chunks of P prompts x G samples with the sampler's frozen params, scores them and adds them to
the buffer. Every chunk's prompts and seed are functions of (seed, data position, version,
chunk), so a resumed run regenerates exactly what an uninterrupted run would have.
"""
import dataclasses
import functools
import queue
import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from oapl_jax import evaluation
from oapl_jax.rl.buffer import RolloutBuffer
from oapl_jax.sampler import core, rollout


@dataclasses.dataclass(frozen=True)
class Window:
  version: int
  data_position: int  # index of the first training prompt of this window
  num_chunks: int
  first_step: int  # trainer step at the window start (for logging)
  steps_per_chunk: int
  evaluate: bool


@functools.lru_cache(maxsize=4)
def _epoch_permutation(num_problems: int, seed: int, epoch: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(num_problems)


def prompt_order(num_problems: int, position: int, count: int, seed: int) -> np.ndarray:
  """Indices of training prompts [position, position + count): a fresh shuffle every epoch."""
  return np.asarray([_epoch_permutation(num_problems, seed, pos // num_problems)[pos % num_problems]
                     for pos in range(position, position + count)])


class RolloutWorker(threading.Thread):

  def __init__(self, sampler: core.Sampler, task, buffer: RolloutBuffer, *, prompts_per_chunk: int,
               group_size: int, sampling: dict, seed: int, eval_fn: Callable[[int], dict]):
    super().__init__(name="oapl-rollout-worker", daemon=True)
    self.sampler, self.task, self.buffer = sampler, task, buffer
    self.prompts_per_chunk, self.group_size = prompts_per_chunk, group_size
    self.sampling, self.seed, self.eval_fn = sampling, seed, eval_fn
    self.stats: "queue.Queue[tuple[int, dict]]" = queue.Queue()  # (trainer step, metrics) for the loop
    self._windows: "queue.Queue[Optional[Window]]" = queue.Queue()
    self._done = threading.Event()
    self._done.set()
    self.error: Optional[BaseException] = None

  def start_window(self, window: Window) -> None:
    self._done.clear()
    self._windows.put(window)

  def wait_window(self) -> None:
    self._done.wait()
    if self.error is not None:
      raise RuntimeError("the rollout worker failed; see the exception above") from self.error

  def stop(self) -> None:
    self._windows.put(None)

  def run(self) -> None:
    while (window := self._windows.get()) is not None:
      try:
        self._run_window(window)
      except BaseException as e:  # surfaced to the trainer thread by wait_window / a closed buffer
        self.error = e
        self.buffer.close()
      finally:
        self._done.set()

  def _run_window(self, w: Window) -> None:
    if w.evaluate:
      self.stats.put((w.first_step, self.eval_fn(w.first_step)))
    problems_all: Sequence[Any] = self.task.train
    for chunk in range(w.num_chunks):
      position = w.data_position + chunk * self.prompts_per_chunk
      idx = prompt_order(len(problems_all), position, self.prompts_per_chunk, self.seed)
      problems = [problems_all[i] for i in idx]
      start = time.perf_counter()
      groups = rollout.generate_groups(
          self.sampler, self.sampler.params, [p.prompt_tokens for p in problems], self.group_size,
          seed=int(np.random.default_rng([self.seed, w.version, chunk]).integers(2**31)),
          prompt_ids=list(range(position, position + len(problems))), stop_tokens=[self.task.tokenizer.eos_id],
          **self.sampling)
      rewards_PxG, result = evaluation.score_groups(self.task, problems, groups)
      if groups.snapshot_version != w.version:
        raise RuntimeError(f"sampler is at version {groups.snapshot_version}, window expects {w.version}")
      self.buffer.add(groups, rewards_PxG)
      self.stats.put((w.first_step + chunk * w.steps_per_chunk, {
          "rollout/reward_mean": float(rewards_PxG.mean()),
          "rollout/frac_groups_all_equal_reward": float((rewards_PxG == rewards_PxG[:, :1]).all(-1).mean()),
          "rollout/response_length": float(groups.lengths.mean()),
          "rollout/truncated_fraction": float((groups.finish_reason == core.FINISH_LENGTH).mean()),
          "rollout/tokens_per_second": groups.tokens_per_second,
          "rollout/seconds": time.perf_counter() - start,
          "rollout/reward_failures": float(result.num_failed + result.num_timeout),
          "rollout/snapshot_version": float(groups.snapshot_version),
      }))
