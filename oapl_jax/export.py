"""A Hugging Face directory from any checkpoint of a run.

  info = export("runs/demo", "/tmp/demo_hf", step=None)   # the newest checkpoint (CLI: oapl-export, apps/export.py)

Writes the trained weights (safetensors), config.json with the eos/pad/bos ids of the run's tokenizer,
generation_config.json (those ids and the run's eval sampling settings) and the tokenizer files of the
checkpoint the run started from (task.tokenizer_dir, else model.checkpoint), plus export_info.json (which
run, step and tokenizer). A task whose tokenizer has no HF files (the arithmetic CharTokenizer) gets none,
and the export says so. The run's config comes from RUN_DIR/config.json (run_dir.record_config) or --config.

Only the params are read from the checkpoint (not the optimizer state), into host memory on one device. A LoRA
run's adapters are merged into its frozen base (RUN/lora_base), so what is written is a plain HF model.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from oapl_jax import checkpoints, run_dir
from oapl_jax.run import schema
from oapl_jax.models import api, factory, hf, lora


@dataclasses.dataclass
class RunWeights:
  """The trained params of one checkpoint of a run (host numpy, training layout) and what made them."""
  cfg: Any  # the run's config (run/schema.RunConfig)
  model: api.CausalLM
  params: Any
  step: int
  meta: checkpoints.Meta


def model_of(cfg) -> api.CausalLM:
  """The run's model (architecture and execution) without weights."""
  return factory.model_of(cfg.model)


def resolve_step(checkpoint_dir: str, step: Optional[int]) -> int:
  steps = sorted(checkpoints.step_dirs(epath.Path(checkpoint_dir))[0])
  if not steps:
    raise FileNotFoundError(f"{checkpoint_dir} holds no finished checkpoint (is it a run directory's checkpoints/?)")
  if step is None:
    return steps[-1]
  if step not in steps:
    raise ValueError(f"{checkpoint_dir} has no checkpoint at step {step}; it has steps {steps}")
  return step


def read_params(run: str, step: Optional[int] = None, cfg=None) -> RunWeights:
  """Params of checkpoint `step` (default: the newest) of run directory `run`, checked against the
  run's model (names, shapes, dtypes) before any array is read."""
  run = str(checkpoints.absolute(run))
  cfg = schema.from_config(cfg if cfg is not None else run_dir.load_config(run))
  model = model_of(cfg)
  directory = os.path.join(run, "checkpoints")
  step = resolve_step(directory, step)
  step_dir = epath.Path(directory) / str(step)
  meta, saved = checkpoints.check_files(step_dir, step)
  abstract = nn.unbox(jax.eval_shape(lambda: model.init_params(jax.random.PRNGKey(0))))
  settings = cfg.trainer.lora
  trained = abstract  # what the step checkpoint holds: the params, or a LoRA run's adapters
  if settings.enabled:
    trained = jax.eval_shape(lambda: lora.init_adapters(settings, model, abstract, jax.random.PRNGKey(0)))
  saved_params = {k: v for k, v in saved.items() if k.startswith("params.")}
  checkpoints.check_tree(saved_params, {"params": trained}, step)
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
  return RunWeights(cfg, model, jax.tree.map(np.asarray, params), step, meta)


def _task_field(cfg, name: str) -> Any:
  """A field of the run's task section (typed settings, or a plain dict for an import-path task)."""
  return cfg.task.get(name, "") if isinstance(cfg.task, dict) else getattr(cfg.task, name, "")


def tokenizer_source(cfg) -> Optional[str]:
  """The directory whose HF tokenizer files the run's prompts were encoded with, or None."""
  for where in (_task_field(cfg, "tokenizer_dir"), cfg.model.checkpoint):
    if where and os.path.isdir(os.path.expanduser(where)) and hf.tokenizer_files(os.path.expanduser(where)):
      return os.path.expanduser(where)
  return None


def run_tokenizer(cfg):
  """The tokenizer the run's task used (the chat task's is its tokenizer_dir's; any other task is built)."""
  if _task_field(cfg, "tokenizer_dir"):
    from oapl_jax.tasks.templates import ChatTokenizer  # pylint: disable=import-outside-toplevel
    return ChatTokenizer(os.path.expanduser(_task_field(cfg, "tokenizer_dir")))
  from oapl_jax.tasks.factory import build_task  # pylint: disable=import-outside-toplevel
  task = build_task(cfg.task)
  task.close()
  return task.tokenizer


def generation_fields(cfg, token_ids: hf.TokenIds, source: Optional[str]) -> dict:
  """The source checkpoint's generation_config.json (if any) with the run's ids and eval sampling."""
  fields = {}
  if source and os.path.exists(os.path.join(source, "generation_config.json")):
    with open(os.path.join(source, "generation_config.json")) as f:
      fields = json.load(f)
  eos = fields.get("eos_token_id")
  keep_list = isinstance(eos, list) and token_ids.eos in eos  # e.g. Qwen's [<|im_end|>, <|endoftext|>]
  e = cfg.eval
  fields.update({k: v for k, v in token_ids.as_hf().items() if v is not None})
  if keep_list:
    fields["eos_token_id"] = eos
  fields.update(do_sample=e.temperature > 0, temperature=e.temperature, top_p=e.top_p,
                top_k=e.top_k, max_new_tokens=e.max_new_tokens)  # top_k 0: off (HF's default is 50)
  return {k: v for k, v in fields.items() if v is not None}


def export(run: str, out_dir: str, step: Optional[int] = None, cfg=None) -> dict:
  """Writes the HF directory; returns export_info (also written to OUT_DIR/export_info.json)."""
  weights = read_params(run, step, cfg)
  cfg = weights.cfg
  tokenizer = run_tokenizer(cfg)
  token_ids = hf.TokenIds(eos=int(tokenizer.eos_id), pad=int(tokenizer.pad_id),
                          bos=None if tokenizer.bos_id is None else int(tokenizer.bos_id))
  source = tokenizer_source(cfg)
  hf.save(out_dir, weights.model.config, weights.params, token_ids=token_ids,
          generation=generation_fields(cfg, token_ids, source), tokenizer_from=source)
  if source:
    note = f"copied from {source}: {', '.join(hf.tokenizer_files(source))}"
  else:
    note = (f"none: the run's tokenizer is {type(tokenizer).__module__}.{type(tokenizer).__name__}, which has no "
            f"Hugging Face tokenizer files; AutoTokenizer cannot load {out_dir}. Encode prompts with that class "
            f"(ids: eos={token_ids.eos}, pad={token_ids.pad}, bos={token_ids.bos}).")
  info = {"run_dir": os.path.abspath(run), "step": weights.step, "syncs_done": weights.meta.syncs_done,
          "snapshot_version": weights.meta.snapshot_version, "token_ids": dataclasses.asdict(token_ids),
          "tokenizer": note, "weights_dtype": weights.model.config.param_dtype}
  if jax.process_index() == 0:
    with open(os.path.join(out_dir, "export_info.json"), "w") as f:
      json.dump(info, f, indent=2)
  return info
