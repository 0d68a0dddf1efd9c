"""Supervised warm start: a few steps of next-token NLL on demonstrations, before OAPL.

Reuses the trainer's jitted step with the 'sft' loss (objectives.LOSSES), so there is one
train step in the codebase; demonstrations are packed as groups of size 1.
"""
import time
from typing import Callable, Sequence

import jax
import numpy as np

from oapl_jax import objectives
from oapl_jax.rl import trainer
from oapl_jax.rl.buffer import pack_sequences
from oapl_jax.rl.optim import OptimConfig


def pack_demonstrations(examples: Sequence, seq_len: int) -> dict[str, np.ndarray]:
  """(prompt_tokens, completion_tokens) examples -> a [N, 1, seq_len] trainer batch."""
  packed = pack_sequences([ex.prompt_tokens for ex in examples], [ex.completion_tokens for ex in examples],
                          None, seq_len)
  batch = {k: v[:, None] for k, v in packed.items()}
  batch["rewards"] = np.zeros((len(examples), 1), np.float32)
  return batch


def warm_start(examples: Sequence, params, model_config, mesh, rules, *, steps: int, batch_size: int,
               lr: float, seq_len: int, seed: int, log: Callable[[int, dict], None]):
  """Returns params after `steps` AdamW steps of NLL on `examples` (cosine to 10% of lr)."""
  config = trainer.TrainConfig(loss="sft", loss_config=objectives.LossConfig(),
                               optim=OptimConfig(lr=lr, b1=0.9, b2=0.98, weight_decay=0.01, max_grad_norm=1.0,
                                                 schedule="cosine", warmup_ratio=0.05, min_ratio=0.1,
                                                 total_steps=steps))
  state = trainer.create_train_state(config, model_config, params, mesh, rules)
  step_fn = trainer.make_train_step(config, model_config, mesh, rules)
  data = pack_demonstrations(examples, seq_len)
  rng = np.random.default_rng(seed)
  start, pending = time.perf_counter(), None
  for step in range(steps):
    rows = rng.choice(len(examples), size=batch_size, replace=False)
    state, metrics = step_fn(state, {k: v[rows] for k, v in data.items()}, jax.random.PRNGKey(step))
    if pending is not None and (step % 50 == 0 or step == steps - 1):
      log(step, {"warmstart/nll": float(pending["nll"]), "warmstart/seconds": time.perf_counter() - start})
    pending = metrics
  return state.params
