"""Build a Task (with its named evaluation sets) from the `task` section of an experiment config."""
import importlib
import os
from typing import Any, Callable, Mapping

from oapl_jax.tasks import arithmetic, base, chain_task, code_task, records_task, rewards, sources
from oapl_jax.tasks.templates import ChatTokenizer


def chat_task(cfg: Mapping[str, Any]) -> base.Task:
  """Problem/answer records (math/GSM8K-style) templated with a local HF tokenizer's chat template."""
  tokenizer_dir = os.path.expanduser(cfg["tokenizer_dir"])
  if not os.path.isdir(tokenizer_dir):
    raise FileNotFoundError(f"config field task.tokenizer_dir: {tokenizer_dir!r} is not a directory "
                            f"(point it at the model's HF checkpoint directory)")
  tokenizer = ChatTokenizer(tokenizer_dir)
  keys = (cfg["problem_key"], cfg["answer_key"])
  template = dict(system=cfg["system_prompt"] or None, instruction_suffix=cfg["instruction_suffix"])

  def problems(spec, field, limit=0):
    records = sources.load_source(spec, field, *keys)[:limit or None]
    if cfg["answer_after"]:  # e.g. GSM8K: "reasoning ... #### 42" -> "42"
      records = [dict(r, answer=r["answer"].split(cfg["answer_after"])[-1].strip()) for r in records]
    return tokenizer.problems(records, **template)

  train = problems(cfg["train_path"], "train_path", cfg["max_train"])
  eval_sets = {name: problems(path, f"eval_paths.{name}") for name, path in dict(cfg["eval_paths"]).items()}
  reward_kw = dict(num_workers=cfg["reward_workers"], timeout_s=cfg["reward_timeout_s"]) \
      if cfg["reward"] == "math_verify" else {}
  return base.Task(name=cfg["reward"], tokenizer=tokenizer, train=train, eval_sets=eval_sets,
                   reward_fn=rewards.make_reward(cfg["reward"], **reward_kw))


# task.name -> builder of a Task from the `task` config section.
TASKS: dict[str, Callable[[Mapping[str, Any]], base.Task]] = {"arithmetic": arithmetic.from_config, "chat": chat_task,
                                                              "code_synthetic": code_task.from_config,
                                                              "records": records_task.from_config,
                                                              "chain": chain_task.from_config}


def build_task(cfg: Mapping[str, Any]) -> base.Task:
  """The Task named by cfg.name: a key of TASKS, or an import path 'package.module:function' to a
  builder taking the `task` config section."""
  name = cfg["name"]
  if ":" in name:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)(cfg)
  if name not in TASKS:
    raise ValueError(f"config field task.name={name!r}; expected one of {sorted(TASKS)} or 'package.module:function'")
  return TASKS[name](cfg)
