"""One loader of a model for sampling: a run's checkpoint, a Hugging Face directory, or a config's warm start.
Eval (apps/eval.py), serve (apps/serve.py), export (run/export.py) and the shared warm start
(apps/sweep_warmstart.py; the study's experiments/claims.warm_start) all call it.

    p = policy("runs/demo")                        # the newest checkpoint, with the run's recorded config
    p = policy("runs/demo", step=40, config=rc)    # checkpoint 40, with rc's task and eval settings
    p = policy("/ckpt/Qwen3-4B", config=rc)        # an HF directory: its own model; rc's task and eval settings
    p = warm_started(rc, task)                     # rc's model after rc's warm start (on the trainer's devices)
    p.load_into(sampler)                           # the sampler now holds it

A checkpoint's params are read alone (no optimizer state), checked against the run's model (names, shapes,
dtypes) before any array is read, into host memory on one device; a LoRA run's adapters are merged into its
frozen base (RUN/lora_base), so every caller sees a plain model.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Optional

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from oapl_jax import checkpoint_files, checkpoints
from oapl_jax.models import factory, lora
from oapl_jax.models.api import CausalLM
from oapl_jax.rl import preemption
from oapl_jax.rl.trainer import Params
from oapl_jax.run import assemble, schema
from oapl_jax.run.schema import RunConfig
from oapl_jax.sampler import api as sampler_api
from oapl_jax.tasks.base import Task


@dataclasses.dataclass
class Policy:
  """A model and its params, and the config that says what they are (its model section names the source)."""
  config: RunConfig
  model: CausalLM
  params: Optional[Params]  # None: an HF directory, which the sampler reads itself (sharded as it loads)
  source: str  # the run or HF directory ('' for a warm start made here)
  kind: str  # "run", "hf" or "warmstart"
  step: Optional[int] = None  # a run's checkpoint step
  meta: Optional[checkpoint_files.Meta] = None  # and what was saved with it

  def load_into(self, sampler: sampler_api.GroupSampler) -> None:
    if self.params is None:
      sampler.load(self.source)
    else:
      sampler.refresh(self.params)


def is_run_dir(path: str) -> bool:
  return os.path.isdir(os.path.join(path, "checkpoints"))


def policy(source: str, *, config: Optional[RunConfig] = None, step: Optional[int] = None) -> Policy:
  """The policy at `source`: a run directory's checkpoint `step` (default: the newest), with `config` or else the
  run's recorded one; or an HF directory (`config` required: it gives the task and eval settings; the model
  is the directory's own, a preset's overrides dropped)."""
  source = str(checkpoint_files.absolute(source))
  config = None if config is None else schema.from_config(config)  # a ConfigDict from --config, or typed
  if is_run_dir(source):
    return from_run(source, step, config)
  if config is None:
    raise ValueError(f"{source} is a Hugging Face directory: give the task and eval settings with --config FILE:ARG")
  if step is not None:
    raise ValueError(f"a step is for run directories; {source} has no checkpoints/ directory")
  config = for_hf(config, source)
  return Policy(config, factory.model_of(config.model), None, source, "hf")


def for_hf(config: RunConfig, source: str) -> RunConfig:
  """`config` with its model read from HF directory `source` (a config whose model was a preset, as an export's
  run, keeps none of the preset's overrides: config.json says it all)."""
  values = schema.to_mapping(config)
  if not config.model.checkpoint:
    values["model"]["overrides"] = {}
  values["model"]["checkpoint"] = os.path.abspath(source)
  return schema.from_config(values)


def warm_started(config: RunConfig, task: Task, log: Callable[[int, dict], None] = lambda step, metrics: None,
                 *, workdir: Optional[str] = None, stop: Optional[preemption.StopFlag] = None) -> Policy:
  """`config`'s model (an HF checkpoint or a preset) after its warm start's supervised steps on `task`'s
  demonstrations (unchanged when warmstart.steps = 0), on the trainer's devices. With a `workdir` it saves there
  and continues a save it finds; a `stop` agreed during it saves and raises preemption.Stopped (assemble.warm_start)."""
  layout = assemble.placement(config).trainer
  if stop is not None:
    stop.across(layout.mesh)
  model, params = assemble.build_model(config, layout)
  seq = assemble.seq_len(config, assemble.longest_prompt(task))
  params = assemble.warm_start(config, task, model, params, layout, seq, log, workdir=workdir, stop=stop)
  return Policy(config, model, params, "", "warmstart")


def resolve_step(checkpoint_dir: str, step: Optional[int]) -> int:
  steps = sorted(checkpoint_files.step_dirs(epath.Path(checkpoint_dir))[0])
  if not steps:
    raise FileNotFoundError(f"{checkpoint_dir} holds no finished checkpoint (is it a run directory's checkpoints/?)")
  if step is None:
    return steps[-1]
  if step not in steps:
    raise ValueError(f"{checkpoint_dir} has no checkpoint at step {step}; it has steps {steps}")
  return step


def from_run(run: str, step: Optional[int] = None, config: Optional[RunConfig] = None) -> Policy:
  """Params of checkpoint `step` (default: the newest) of run directory `run` (host numpy, training layout), with
  `config` or else the run's recorded one."""
  run = str(checkpoint_files.absolute(run))
  config = schema.from_run_dir(run) if config is None else schema.from_config(config)
  model = factory.model_of(config.model)
  directory = os.path.join(run, "checkpoints")
  step = resolve_step(directory, step)
  step_dir = epath.Path(directory) / str(step)
  meta, saved = checkpoint_files.check_files(step_dir, step)
  abstract = nn.unbox(jax.eval_shape(lambda: model.init_params(jax.random.PRNGKey(0))))
  settings = config.trainer.lora
  trained = abstract  # what the step checkpoint holds: the params, or a LoRA run's adapters
  if settings.enabled:
    trained = jax.eval_shape(lambda: lora.init_adapters(settings, model, abstract, jax.random.PRNGKey(0)))
  saved_params = {k: v for k, v in saved.items() if k.startswith("params.")}
  checkpoint_files.check_tree(saved_params, {"params": trained}, step)
  cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
  on_cpu = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=cpu), tree)  # noqa: E731
  target = {"params": on_cpu(trained)}
  restore_args = jax.tree.map(lambda _: ocp.ArrayRestoreArgs(sharding=cpu), target)
  with ocp.PyTreeCheckpointer() as reader:  # only the params subtree: no optimizer state in memory
    params = reader.restore(step_dir / "state", args=ocp.args.PyTreeRestore(
        item=target, restore_args=restore_args, partial_restore=True))["params"]
  if settings.enabled:  # merged into the plain model's params: export, eval and serve see no adapters
    params = jax.jit(functools.partial(lora.merge, settings, model))(
        checkpoints.restore_base(run, on_cpu(abstract)), params)
  return Policy(config, model, jax.tree.map(np.asarray, params), run, "run", step, meta)
