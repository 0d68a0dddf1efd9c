"""The typed parts of a run, built by keyword in run/assemble.py; the two drivers extend them.

    RunParts        what every driver holds: where it runs, the task, the model and its state, the sampler,
                    checkpoints, reports, health, evaluation
    loop.Online     + LoopSettings, the buffer, the train step, the window policy and the step hooks
    offline.Offline + its stages' settings (no buffer, train step or scorer)

Nothing here reads a config: each part is a value (or a function) the assembler chose.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from oapl_jax import checkpoint_files, checkpoints, parallel, reporting
from oapl_jax.models.api import CausalLM
from oapl_jax.rl.monitors import HealthMonitor
from oapl_jax.rl.policy_eval import PolicyEval
from oapl_jax.rl.trainer import Params, TrainConfig, TrainState
from oapl_jax.sampler import api as sampler_api
from oapl_jax.sampler.settings import SamplingSettings
from oapl_jax.tasks.base import Task

# (params, step=None, prefix='') -> {'eval/<set>/<metric>': value} over the eval sets; with a step, the generations
# go to evals/<step>/<prefix><set>.jsonl (oapl_jax/generations.py)
Evaluate = Callable[..., dict[str, float]]
# (window, problems, groups, rewards_PxG): a window's first rollouts to rollouts/window_<k>.jsonl
SaveRollouts = Callable[[int, Sequence, Any, np.ndarray], None]
PolicyParams = Callable[[TrainState], Params]  # state -> the model's full params (LoRA: the base with adapters)


class Releasable(Protocol):
  def release(self) -> None: ...


@dataclasses.dataclass(kw_only=True)
class RunParts:
  """What a run holds whichever way it trains; `state` and `meta` advance as it does."""
  placement: parallel.Placement  # the trainer's and the sampler's meshes
  task: Task
  model: CausalLM
  policy_params: PolicyParams
  train_config: TrainConfig  # the trainer section as the run uses it (assemble.train_config: temperature, prompt)
  state: Optional[TrainState]  # None only while offline mode swaps its optimizer state
  meta: checkpoint_files.Meta
  sampler: sampler_api.GroupSampler
  rollout_settings: SamplingSettings
  eval_settings: SamplingSettings
  checkpointer: checkpoints.Checkpointer
  reporter: reporting.Reporter
  monitor: HealthMonitor
  evaluate: Evaluate
  policy_eval: Optional[PolicyEval] = None  # the trainer's current policy every eval.every_steps steps
  save_rollouts: Optional[SaveRollouts] = None  # None: eval.save_prompts = 0
  lock: Optional[Releasable] = None  # run_dir.RunLock on the workdir (process 0), released when the run ends

  def release(self) -> None:
    """Ends the run's hold on its files: the checkpointer (waits for the last save), writers, the task, the lock."""
    with contextlib.ExitStack() as closing:  # every one runs, last first, whichever raises
      closing.callback(self.lock.release if self.lock is not None else lambda: None)
      closing.callback(self.task.close)
      closing.callback(self.reporter.close)
      closing.callback(self.checkpointer.close)
