"""A Hugging Face directory from any checkpoint of a run, loadable by transformers alone.

  info = export("runs/demo", "/tmp/demo_hf", step=None)   # the newest checkpoint (CLI: oapl-export, apps/export.py)
  tok = AutoTokenizer.from_pretrained("/tmp/demo_hf"); model = AutoModelForCausalLM.from_pretrained("/tmp/demo_hf")
  model.generate(**tok(["12+34="], return_tensors="pt"), do_sample=False)   # the run's greedy answer

Writes the trained weights (safetensors), config.json with the eos/pad/bos ids of the run's tokenizer,
generation_config.json (those ids and the run's eval sampling settings), the tokenizer the run's prompts were
encoded with, and export_info.json (which run, step and tokenizer). The tokenizer: an HF tokenizer's files are
copied (task.tokenizer_dir); a character tokenizer (tasks/char_tokenizer.py) is written as a tokenizer.json whose
encoding starts with <bos>, as the run's prompts did; any other is refused unless weights_only. The run's config
comes from RUN_DIR/config.json (run_dir.record_config) or --config; the task's data and reward are not read.
run_tokenizer and tokenizer_source are also how oapl-serve (apps/serve.py) encodes a run's text.

Only the params are read from the checkpoint (run/policy.py; not the optimizer state), into host memory on one
device. A LoRA run's adapters are merged into its frozen base (RUN/lora_base), so what is written is a plain HF model.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

import jax

from oapl_jax.models import hf
from oapl_jax.run import policy
from oapl_jax.run.schema import RunConfig
from oapl_jax.tasks import arithmetic, chain_task, char_tokenizer, code_task, records_task
from oapl_jax.tasks.factory import build_task
from oapl_jax.tasks.templates import ChatTokenizer


def _task_field(cfg, name: str) -> Any:
  """A field of the run's task section (typed settings, or a plain dict for an import-path task)."""
  return cfg.task.get(name, "") if isinstance(cfg.task, dict) else getattr(cfg.task, name, "")


class TokenizerNotExportable(ValueError):
  """The run's tokenizer has no HF form to write (and the export was not asked for the weights alone)."""


# The registered tasks' character tokenizers, by task name ("records" with task.tokenizer="chars").
CHAR_TOKENIZERS = {"arithmetic": arithmetic.CharTokenizer, "chain": chain_task.CharTokenizer,
                   "code_synthetic": code_task.CodeCharTokenizer, "records": records_task.PrintableTokenizer}


def run_tokenizer(cfg):
  """The tokenizer the run's prompts were encoded with, from its task settings alone: no data is read and no
  reward imported. Only a task given by import path without task.tokenizer_dir is built (nothing else knows
  its tokenizer)."""
  name = _task_field(cfg, "name")
  hf_dir = _task_field(cfg, "tokenizer") if name == "records" else _task_field(cfg, "tokenizer_dir")
  if hf_dir and hf_dir != records_task.CHARS_TOKENIZER:
    return ChatTokenizer(os.path.expanduser(hf_dir))
  if name in CHAR_TOKENIZERS:
    return CHAR_TOKENIZERS[name]()
  task = build_task(cfg.task)
  task.close()
  return task.tokenizer


def tokenizer_source(tokenizer) -> Optional[str]:
  """The HF directory whose tokenizer files are `tokenizer` (a ChatTokenizer's), or None."""
  where = getattr(getattr(tokenizer, "hf", None), "name_or_path", "")
  return where if where and os.path.isdir(where) and hf.tokenizer_files(where) else None


def write_char_tokenizer(tokenizer: char_tokenizer.CharTokenizer, out_dir: str, max_length: int) -> list[str]:
  """`tokenizer` as HF files AutoTokenizer loads (CharTokenizer.to_hf); returns their names. The class is named
  PreTrainedTokenizerFast, which transformers 4 and 5 both load."""
  tokenizer.to_hf(max_length).save_pretrained(out_dir)
  path = os.path.join(out_dir, "tokenizer_config.json")
  with open(path) as f:
    fields = json.load(f)
  with open(path, "w") as f:
    json.dump({**fields, "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
  return hf.tokenizer_files(out_dir)


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


def export(run: str, out_dir: str, step: Optional[int] = None, cfg: Optional[RunConfig] = None,
           weights_only: bool = False) -> dict:
  """Writes the HF directory; returns export_info (also written to OUT_DIR/export_info.json). A tokenizer that is
  neither an HF one nor a CharTokenizer is refused (TokenizerNotExportable) unless `weights_only`."""
  weights = policy.from_run(run, step, cfg)
  cfg = weights.config
  tokenizer = run_tokenizer(cfg)
  source = tokenizer_source(tokenizer)
  is_chars = isinstance(tokenizer, char_tokenizer.CharTokenizer)
  kind = f"{type(tokenizer).__module__}.{type(tokenizer).__name__}"
  if not (source or is_chars or weights_only):
    raise TokenizerNotExportable(f"the run's tokenizer ({kind}) has neither Hugging Face tokenizer files nor a character "
                     f"vocabulary to write, so AutoTokenizer could not load the export; pass --weights_only to "
                     f"write the weights alone")
  token_ids = hf.TokenIds(eos=int(tokenizer.eos_id), pad=int(tokenizer.pad_id),
                          bos=None if tokenizer.bos_id is None else int(tokenizer.bos_id))
  hf.save(out_dir, weights.model.config, weights.params, token_ids=token_ids,
          generation=generation_fields(cfg, token_ids, source), tokenizer_from=source)
  if source:
    note = f"copied from {source}: {', '.join(hf.tokenizer_files(source))}"
  elif is_chars:
    files = write_char_tokenizer(tokenizer, out_dir, weights.model.config.max_position_embeddings) \
        if jax.process_index() == 0 else []
    note = (f"the {tokenizer.name} character tokenizer ({kind}) as {', '.join(files)}: "
            f"AutoTokenizer's ids start with <bos> (id {tokenizer.bos_id}), as the run's prompts did")
  else:
    note = (f"none (--weights_only): the run's tokenizer is {kind}; encode prompts with it "
            f"(ids: eos={token_ids.eos}, pad={token_ids.pad}, bos={token_ids.bos})")
  info = {"run_dir": os.path.abspath(run), "step": weights.step, "syncs_done": weights.meta.syncs_done,
          "snapshot_version": weights.meta.snapshot_version, "token_ids": dataclasses.asdict(token_ids),
          "tokenizer": note, "weights_dtype": weights.model.config.param_dtype}
  suffix = _task_field(cfg, "instruction_suffix")
  if suffix:
    info["prompt_suffix"] = suffix  # what the run appended to every prompt before encoding it
  if jax.process_index() == 0:
    with open(os.path.join(out_dir, "export_info.json"), "w") as f:
      json.dump(info, f, indent=2)
  return info
