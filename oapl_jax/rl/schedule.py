"""The window schedule of Algorithm 1: which rollouts a trainer step may use, and the data order.

A run is a sequence of sync windows of L = `sync_every` trainer steps. At the start of window w the
sampler takes the trainer's params (snapshot version w + 1 on a fresh run) and generates
`num_chunks` chunks of P = `prompts_per_chunk` prompts x G samples. Step s of the window (its policy
lag behind the snapshot) draws only from the first `chunks_visible(s)` chunks: one more chunk every
k = `steps_per_chunk` steps, so what a step sees never depends on how fast the sampler ran.

Training prompts are read in a fresh shuffle every epoch; the data position counts prompts consumed,
so a resumed run regenerates exactly what an uninterrupted one would have.
"""
import dataclasses
import functools
import math

import numpy as np

from oapl_jax import sections


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """The `loop` section (Algorithm 1): windows of sync_every trainer steps, each sampling from one snapshot;
  step s of a window may use the first min(1 + s // steps_per_rollout, chunks) rollout chunks."""
  sync_every: int = sections.rule(50, low=1)  # L: trainer steps per window (the sampler refreshes after them)
  num_syncs: int = sections.rule(10, low=1)  # windows in the run
  batch_prompts: int = sections.rule(128, low=1)  # prompts (groups) per trainer step
  prompts_per_rollout: int = sections.rule(128, low=1)  # prompts per rollout chunk the sampler adds
  group_size: int = sections.rule(8, low=1)  # G: samples per prompt
  steps_per_rollout: int = sections.rule(2, low=1)  # trainer steps per rollout chunk made visible
  eval_every_syncs: int = sections.rule(1, low=1)  # evaluate the fresh snapshot every this many windows
  # 1: the snapshot a window samples from is the params at the start of the previous window (off-by-one
  # asynchronous RL, the paper's GRPO baseline; a resumed run's first window samples from its restored params)
  sampler_delay_windows: int = sections.rule(0, low=0, high=1)
  # Adaptive lag: a window ends (the sampler refreshes) after the step that follows one whose drift from the
  # sampler, train/<drift_metric> on its batch, exceeded refresh_drift (read one step late, so the trainer
  # never waits); sync_every stays the most steps a window lasts. 0 = off: every window is sync_every steps.
  # The run's budget stays num_syncs x sync_every trainer steps, however many windows that takes.
  refresh_drift: float = sections.rule(0.0, low=0)
  drift_metric: str = sections.rule("seq_log_ratio_abs_mean",  # the train/ metric refresh_drift is compared with
                                    choices=("seq_log_ratio_abs_mean", "token_log_ratio_abs_mean"))

  # demonstrations in the buffer (rl/demo_mix.py): round(demo_fraction x group_size) samples of every group whose
  # prompt has task demonstrations are replaced by them (rewarded by the task; the snapshot's log-probs); 0 = off
  demo_fraction: float = sections.rule(0.0, low=0, high=1, high_open=True)
  # how the trainer uses them: 'buffer' (samples of their group, in V* and OAPL's regression) or 'sft' (the same
  # slots left out of both and trained by their NLL, weighted by trainer.demo_sft_weight: the control; OAPL only)
  demo_use: str = sections.rule("buffer", choices=("buffer", "sft"))

  def __post_init__(self):
    sections.enforce(self)
    if self.refresh_drift and self.sampler_delay_windows:
      raise ValueError(f"loop.refresh_drift={self.refresh_drift}: an adaptive lag needs loop.sampler_delay_windows=0")
    if self.batch_prompts > self.prompts_per_rollout:
      raise ValueError(f"loop.batch_prompts={self.batch_prompts}: exceeds loop.prompts_per_rollout="
                       f"{self.prompts_per_rollout}: a step would need groups from chunks not yet visible")

  @property
  def total_steps(self) -> int:
    return self.num_syncs * self.sync_every

  @property
  def trains_each_group_on_arrival(self) -> bool:
    """Every group is trained by exactly one step, the first that sees its chunk (a new chunk every step, of one
    batch's prompts; the buffer draws least-used first): pi_old of a ratio is then that step's own params."""
    return self.steps_per_rollout == 1 and self.prompts_per_rollout == self.batch_prompts

  def schedule(self) -> "WindowSchedule":
    return WindowSchedule(self.sync_every, self.steps_per_rollout, self.prompts_per_rollout)


@dataclasses.dataclass(frozen=True)
class WindowSchedule:
  sync_every: int  # L: trainer steps per window (the lag bound)
  steps_per_chunk: int  # k: trainer steps per rollout chunk
  prompts_per_chunk: int  # P: prompts per rollout chunk

  def __post_init__(self):
    for name in ("sync_every", "steps_per_chunk", "prompts_per_chunk"):
      if getattr(self, name) < 1:
        raise ValueError(f"WindowSchedule.{name}={getattr(self, name)} must be >= 1")

  @property
  def num_chunks(self) -> int:
    """Chunks generated per window: enough for every step's visible set."""
    return math.ceil(self.sync_every / self.steps_per_chunk)

  @property
  def prompts_per_window(self) -> int:
    return self.num_chunks * self.prompts_per_chunk

  def chunks_visible(self, step_in_window: int) -> int:
    """Chunks step s of a window may draw from: min(1 + s // k, num_chunks)."""
    return min(1 + step_in_window // self.steps_per_chunk, self.num_chunks)

  def first_step(self, window: int) -> int:
    return window * self.sync_every

  def chunk_position(self, window_position: int, chunk: int) -> int:
    """Data position of a chunk's first prompt, given the window's starting position."""
    return window_position + chunk * self.prompts_per_chunk


@functools.lru_cache(maxsize=4)
def _epoch_permutation(num_problems: int, seed: int, epoch: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(num_problems)


def prompt_order(num_problems: int, position: int, count: int, seed: int) -> np.ndarray:
  """Indices of training prompts [position, position + count): a fresh shuffle every epoch."""
  if num_problems < 1:
    raise ValueError("there are no training prompts to order")
  return np.asarray([_epoch_permutation(num_problems, seed, pos // num_problems)[pos % num_problems]
                     for pos in range(position, position + count)])
