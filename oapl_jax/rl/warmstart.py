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

from oapl_jax import objectives, parallel
from oapl_jax.models.api import CausalLM
from oapl_jax.parallel import Layout
from oapl_jax.rl import trainer
from oapl_jax.rl.buffer import pack_sequences
from oapl_jax.rl.optim import OptimConfig
from oapl_jax.tasks.base import Demonstration


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
  steps: int = 0  # 0: no warm start
  batch_size: int = 0
  optim: OptimConfig = OptimConfig()  # total_steps is set to `steps` when the schedule needs it

  @classmethod
  def from_config(cls, cfg: Mapping[str, Any]) -> "WarmStartConfig":
    """From the `warmstart` config section; a cosine schedule without total_steps spans the warm start."""
    values = dict(cfg.items())
    optim = dict(values.pop("optim", {}))
    if optim.get("schedule") == "cosine" and not optim.get("total_steps"):
      optim["total_steps"] = max(1, values.get("steps", 0))
    return cls(**values, optim=OptimConfig(**optim))


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
  train_config = trainer.TrainConfig(loss="sft", loss_settings=objectives.SFTSettings(), optim=config.optim)
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
