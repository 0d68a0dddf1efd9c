"""Supervised warm start: a few steps of next-token NLL on a task's demonstrations, before OAPL.

Reuses the trainer's jitted step with the 'sft' loss (objectives.LOSSES), so there is one
train step in the codebase; demonstrations are packed as groups of size 1.
"""
import dataclasses
import logging
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from oapl_jax import objectives, parallel, sections
from oapl_jax.models.api import CausalLM
from oapl_jax.parallel import Layout
from oapl_jax.rl import trainer
from oapl_jax.rl.buffer import pack_sequences
from oapl_jax.rl.optim import OptimConfig
from oapl_jax.tasks.base import Demonstration


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
  """The `warmstart` section: supervised steps on the task's demonstrations before RL (0 = none). A cosine
  schedule with optim.total_steps = 0 spans the whole warm start."""
  steps: int = sections.rule(0, low=0)
  batch_size: int = sections.rule(0, low=0)
  optim: OptimConfig = OptimConfig(lr=1e-4, b2=0.98, weight_decay=0.01, schedule="cosine", warmup_ratio=0.05,
                                   min_ratio=0.1)

  def __post_init__(self):
    sections.enforce(self)
    if self.steps and self.batch_size < 1:
      raise ValueError(f"warmstart.batch_size={self.batch_size}: must be >= 1 when warmstart.steps > 0")

  def optimizer(self) -> OptimConfig:
    """optim, with a cosine schedule's total_steps = 0 read as the whole warm start."""
    if self.optim.schedule == "cosine" and not self.optim.total_steps:
      return dataclasses.replace(self.optim, total_steps=max(1, self.steps))
    return self.optim


def pack_demonstrations(examples: Sequence[Demonstration], seq_len: int) -> dict[str, np.ndarray]:
  """Demonstrations -> a [N, 1, seq_len] trainer batch."""
  packed = pack_sequences([ex.prompt_tokens for ex in examples], [ex.completion_tokens for ex in examples],
                          None, seq_len)
  batch = {k: v[:, None] for k, v in packed.items()}
  batch["rewards"] = np.zeros((len(examples), 1), np.float32)
  return batch


def warm_start(examples: Sequence[Demonstration], params, model: CausalLM, layout: Layout, config: WarmStartConfig,
               *, seq_len: int, seed: int, log: Callable[[int, dict], None]):
  """Returns params after `config.steps` optimizer steps of NLL on `examples`."""
  if config.batch_size > len(examples):
    raise ValueError(f"warmstart.batch_size={config.batch_size} exceeds the {len(examples)} demonstrations")
  train_config = trainer.TrainConfig(loss="sft", loss_settings=objectives.SFTSettings(), optim=config.optimizer())
  state = trainer.create_train_state(train_config, model, params, layout)
  step_fn = trainer.make_train_step(train_config, model, layout)
  data = pack_demonstrations(examples, seq_len)
  sharding = trainer.batch_sharding(layout, config.batch_size)
  local_rows = parallel.process_rows(sharding, config.batch_size)  # every process feeds only its own rows
  rng = np.random.default_rng(seed)
  start, pending, steady = time.perf_counter(), None, None
  report_every = max(1, config.steps // 10)  # a console line per tenth, with an ETA from steady-state steps
  for step in range(config.steps):
    rows = rng.choice(len(examples), size=config.batch_size, replace=False)
    batch = parallel.from_process_rows({k: v[rows][local_rows] for k, v in data.items()}, sharding, config.batch_size)
    state, metrics = step_fn(state, batch, jax.random.PRNGKey(step))
    if pending is not None and (step % 50 == 0 or step == config.steps - 1):
      log(step, {"warmstart/nll": float(pending["nll"]), "warmstart/seconds": time.perf_counter() - start})
    if step == 1:  # step 0 compiled; time from here
      jax.block_until_ready(metrics)
      steady = (step, time.perf_counter())
    elif steady and (step % report_every == 0 or step == config.steps - 1):
      per_step = (time.perf_counter() - steady[1]) / (step - steady[0])
      logging.info("warm start: step %d/%d, nll %.4f, %.2f s/step, ETA %.0f s", step + 1, config.steps,
                   float(metrics["nll"]), per_step, per_step * (config.steps - step - 1))
    pending = metrics
  return state.params
