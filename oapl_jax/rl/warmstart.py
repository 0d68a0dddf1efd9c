"""Supervised warm start: a few steps of next-token NLL on a task's demonstrations, before OAPL.

Reuses the trainer's jitted step with the 'sft' loss (objectives.LOSSES), so there is one
train step in the codebase; demonstrations are packed as groups of size 1.

A stop (rl/preemption.py: SIGTERM, Ctrl-C) is read at step ends as in the loop: the step in flight finishes,
the warm start's state is saved to its own Checkpointer (run/assemble: WORKDIR/warmstart_checkpoints) and
preemption.Stopped is raised. The same call then restores it and goes on with the same batches (the row draws
before the saved step are replayed) and step keys (PRNGKey(step)), so its params equal an uninterrupted warm
start's bit for bit; its end is saved too, so a run stopped before its first RL checkpoint skips it.
"""
import dataclasses
import itertools
import logging
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import jax
import numpy as np

from oapl_jax import checkpoint_files, checkpoints, objectives, parallel, sections
from oapl_jax.models.api import CausalLM
from oapl_jax.objectives.batch_fields import FIELDS
from oapl_jax.parallel import Layout
from oapl_jax.rl import preemption, stepping, trainer
from oapl_jax.rl.buffer import pack_sequences
from oapl_jax.rl.optim import OptimConfig
from oapl_jax.tasks.base import Demonstration


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
  """The `warmstart` section: supervised steps on the task's demonstrations before RL (0 = none). A cosine
  schedule with optim.total_steps = 0 spans the whole warm start."""
  steps: int = sections.rule(0, low=0)  # supervised steps (0: no warm start)
  batch_size: int = sections.rule(0, low=0)  # demonstrations per step (>= 1 when steps > 0)
  # a final nll per token under this reads as memorised demonstrations (a warning): an imperfect teacher's slips
  # learned per demonstration leave RL groups of equal rewards (the chain task's first warm start: 0.0024)
  memorised_nll: float = sections.rule(0.005, low=0)
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
  batch["rewards"] = np.zeros((len(examples), 1), FIELDS["rewards"].dtype)
  return batch


def warm_start(examples: Sequence[Demonstration], params, model: CausalLM, layout: Layout, config: WarmStartConfig,
               *, seq_len: int, seed: int, log: Callable[[int, dict], None],
               checkpointer: Optional[checkpoints.Checkpointer] = None,
               stop: Optional[preemption.StopFlag] = None):
  """Returns params after `config.steps` optimizer steps of NLL on `examples`. With a `checkpointer`, what it
  holds is continued and the end is saved there; an agreed `stop` saves after the step in flight and raises
  preemption.Stopped (module docstring)."""
  if config.batch_size > len(examples):
    raise ValueError(f"warmstart.batch_size={config.batch_size} exceeds the {len(examples)} demonstrations")
  train_config = trainer.TrainConfig(loss="sft", loss_settings=objectives.SFTSettings(), optim=config.optimizer())
  state = _restored(checkpointer, trainer.create_train_state(train_config, model, params, layout))
  first = int(state.step)
  if stop is not None and first < config.steps and stop.vote()():  # a stop during set-up: before any compile
    logging.warning("stopped by %s before warm-start step %d of %d; resume with the same command", stop.signal_name,
                    first, config.steps)
    raise preemption.Stopped(stop.signal_name)
  batches = _batches(examples, seq_len, config.batch_size, layout, seed, first)
  progress = _Progress(config.steps, first, log)
  driver = stepping.StepDriver(trainer.make_train_step(train_config, model, layout), jax.random.PRNGKey, progress,
                               stop=stop)
  done = first
  for step in range(first, config.steps):
    state = driver.step(state, next(batches), step)
    done = step + 1
    if driver.stopping:  # cast a step ago: no wait
      break
  driver.flush()
  if done > first:
    _save(checkpointer, state, seed, config.batch_size)
  if done == config.steps > first:
    warn_if_memorised(float(progress.last["nll"]), config)
  if driver.stopping:
    logging.warning("stopped by %s after warm-start step %d of %d%s; resume with the same command",
                    stop.signal_name, done, config.steps,
                    f" (saved to {checkpointer.directory})" if checkpointer else " (nothing saved: no checkpointer)")
    raise preemption.Stopped(stop.signal_name)
  return state.params


def warn_if_memorised(nll: float, config: WarmStartConfig) -> bool:
  """Warns (and says True) when the warm start's last nll per token is under config.memorised_nll."""
  if nll >= config.memorised_nll:
    return False
  logging.warning("warm start: its final nll on the demonstrations is %.4g per token, under warmstart.memorised_nll=%g:"
                  " the policy may have memorised them (an imperfect teacher's slips learned one by one leave RL "
                  "groups of equal rewards); use fewer warmstart.steps or more, varied demonstrations (with a "
                  "deterministic teacher this is expected)", nll, config.memorised_nll)
  return True


def _restored(checkpointer: Optional[checkpoints.Checkpointer], state: trainer.TrainState) -> trainer.TrainState:
  """`state` as the checkpointer's newest warm-start save left it (unchanged without one)."""
  if checkpointer is None or checkpointer.latest_step() is None:
    return state
  saved, _ = checkpointer.restore(checkpoints.abstract_like(trainer.checkpointed(state)))
  logging.info("warm start: resumed at step %d from %s", int(saved.step), checkpointer.directory)
  return saved.replace(frozen=state.frozen)


def _save(checkpointer: Optional[checkpoints.Checkpointer], state: trainer.TrainState, seed: int,
          batch_size: int) -> None:
  if checkpointer is None:
    return
  done = int(state.step)
  checkpointer.save(done, trainer.checkpointed(state), checkpoint_files.Meta(
      syncs_done=0, snapshot_version=0, data_position=done * batch_size, seed=seed))


def _batches(examples: Sequence[Demonstration], seq_len: int, batch_size: int, layout: Layout, seed: int,
             first: int) -> Iterator[Mapping[str, Any]]:
  """The trainer batches of steps `first`, `first` + 1, ...: the rows an uninterrupted warm start draws (the
  draws of the steps before `first` are replayed); each process feeds only its own rows."""
  data = pack_demonstrations(examples, seq_len)
  sharding = trainer.batch_sharding(layout, batch_size)
  local_rows = parallel.process_rows(sharding, batch_size)
  rng = np.random.default_rng(seed)
  for step in itertools.count():
    rows = rng.choice(len(examples), size=batch_size, replace=False)
    if step >= first:
      yield parallel.from_process_rows({k: v[rows][local_rows] for k, v in data.items()}, sharding, batch_size)


class _Progress:
  """The warm start's report (stepping.Report): step s's nll is logged under step s + 1 (every 50 steps, and the
  last but one: what an eval at that step would see) and a console line per tenth, with an ETA from steady-state
  steps (after the first step of this call, which compiled)."""

  def __init__(self, steps: int, first: int, log: Callable[[int, dict], None]):
    self.steps, self.first, self.log = steps, first, log
    self.report_every = max(1, steps // 10)
    self.start, self.last, self.steady = time.perf_counter(), None, None

  def __call__(self, step: int, metrics: dict, extra: dict) -> None:
    del extra
    label = step + 1
    if label < self.steps and (label % 50 == 0 or label == self.steps - 1):
      self.log(label, {"warmstart/nll": float(metrics["nll"]), "warmstart/seconds": time.perf_counter() - self.start})
    if step == self.first:  # the first step compiled; time from here
      self.steady = (step, time.perf_counter())
    elif step % self.report_every == 0 or step == self.steps - 1:
      per_step = (time.perf_counter() - self.steady[1]) / (step - self.steady[0])
      logging.info("warm start: step %d/%d, nll %.4f, %.2f s/step, ETA %.0f s", step + 1, self.steps,
                   float(metrics["nll"]), per_step, per_step * (self.steps - step - 1))
    self.last = metrics
