"""The task registry: task.name -> its section's typed settings, its builder and its pre-compute check.

    settings = settings_of(cfg_task_mapping, problems)     # the run config's front door calls this
    task = build_task(settings)                             # prompts, named eval sets, reward

A name not registered is an import path 'package.module:function'; the function receives its section as
typed settings when it carries `function.settings = <a sections dataclass>`, else as a plain dict.
"""
import dataclasses
import importlib
import os
from typing import Any, Callable, Mapping, Optional

from oapl_jax import sections
from oapl_jax.tasks import arithmetic, base, chain_task, code_task, records_task, rewards, sources
from oapl_jax.tasks.templates import ChatTokenizer


@dataclasses.dataclass(frozen=True)
class ChatSettings:
  """task.name='chat': problem/answer records (math/GSM8K-style) templated with the model's chat template.
  The reward's limits are math_verify's worker processes, as in tasks/records_task.RecordsSettings."""
  name: str = "chat"  # task.name: this task
  tokenizer_dir: str = ""  # the model's HF checkpoint directory (its tokenizer and chat template)
  train_path: str = ""  # training records: .jsonl, .parquet or tfds:NAME/SPLIT
  eval_paths: dict = dataclasses.field(default_factory=dict)  # {eval set name: its records' source}
  problem_key: str = "problem"  # the record field holding the problem
  answer_key: str = "answer"  # the record field holding the gold answer
  system_prompt: str = ""  # the chat template's system message ('' = none)
  # appended to each problem
  instruction_suffix: str = " Let's think step by step and output the final answer within \\boxed{}."
  reward: str = sections.rule("math_verify", choices=tuple(rewards.REWARDS))  # how a response is scored
  reward_workers: int = sections.rule(4, low=1)  # math_verify's worker processes
  reward_timeout_s: float = sections.rule(10.0, low=0, low_open=True)  # per item (past it: 0, a reward failure)
  reward_memory_mb: int = sections.rule(0, low=0)  # the memory an item may allocate in its worker (0: no limit)
  max_train: int = sections.rule(0, low=0)  # the first this many training records (0: all)
  answer_after: str = ""  # e.g. "####" for GSM8K: the answer is what follows it in the answer field

  def __post_init__(self):
    sections.enforce(self)


def check_chat(cfg: ChatSettings) -> list[str]:
  problems = sources.missing_sources({"task.train_path": cfg.train_path,
                                      **{f"task.eval_paths.{k}": v for k, v in cfg.eval_paths.items()}})
  if not os.path.isdir(os.path.expanduser(cfg.tokenizer_dir)):
    problems.insert(0, f"task.tokenizer_dir={cfg.tokenizer_dir!r}: not a directory (point it at the model's HF "
                       "checkpoint)")
  return problems


def chat_task(cfg: ChatSettings) -> base.Task:
  tokenizer_dir = os.path.expanduser(cfg.tokenizer_dir)
  if not os.path.isdir(tokenizer_dir):
    raise FileNotFoundError(f"config field task.tokenizer_dir: {tokenizer_dir!r} is not a directory "
                            f"(point it at the model's HF checkpoint directory)")
  tokenizer = ChatTokenizer(tokenizer_dir)
  keys = (cfg.problem_key, cfg.answer_key)
  template = dict(system=cfg.system_prompt or None, instruction_suffix=cfg.instruction_suffix)

  def problems(spec, field, limit=0):
    records = sources.load_source(spec, field, *keys)[:limit or None]
    if cfg.answer_after:  # e.g. GSM8K: "reasoning ... #### 42" -> "42"
      records = [dict(r, answer=r["answer"].split(cfg.answer_after)[-1].strip()) for r in records]
    return tokenizer.problems(records, **template)

  train = problems(cfg.train_path, "train_path", cfg.max_train)
  eval_sets = {name: problems(path, f"eval_paths.{name}") for name, path in cfg.eval_paths.items()}
  reward_kw = dict(num_workers=cfg.reward_workers, timeout_s=cfg.reward_timeout_s, memory_mb=cfg.reward_memory_mb) \
      if cfg.reward == "math_verify" else {}
  return base.Task(name=cfg.reward, tokenizer=tokenizer, train=train, eval_sets=eval_sets,
                   reward_fn=rewards.make_reward(cfg.reward, **reward_kw), 
                   reward_detail=None if ":" in cfg.reward else boxed_detail)  # an own score: no detail


def boxed_detail(completion: str, answer: str) -> str:
  """The last \\boxed{} of a chat task's response, the answer its rewards compare (math_verify parses more)."""
  boxed = rewards.last_boxed(completion)
  return "no \\boxed{}" if boxed is None else f"boxed {boxed!r}"


@dataclasses.dataclass(frozen=True)
class TaskEntry:
  settings: type  # the section's dataclass: its fields, defaults and rules
  build: Callable[[Any], base.Task]
  check: Optional[Callable[[Any], list[str]]] = None  # 'field=value: why' problems found before compute


TASKS: dict[str, TaskEntry] = {
    "arithmetic": TaskEntry(arithmetic.ArithmeticSettings, arithmetic.from_config),
    "chat": TaskEntry(ChatSettings, chat_task, check_chat),
    "code_synthetic": TaskEntry(code_task.CodeSyntheticSettings, code_task.from_config),
    "records": TaskEntry(records_task.RecordsSettings, records_task.from_config, records_task.check),
    "chain": TaskEntry(chain_task.ChainSettings, chain_task.from_config),
}


def _import(name: str) -> Callable:
  module, _, attr = name.partition(":")
  return getattr(importlib.import_module(module), attr)


def settings_of(section: Any, problems: sections.Problems) -> Any:
  """The `task` section as its typed settings (a plain dict for an import path without `.settings`);
  every problem goes to `problems` (None is then returned)."""
  if not isinstance(section, Mapping) and not hasattr(section, "items"):
    problems.add("task", section, "must be a mapping")
    return None
  values = dict(section.items())
  name = values.get("name")
  if not isinstance(name, str):
    problems.add("task.name", name if "name" in values else sections.MISSING, "must be a task name or import path")
    return None
  if ":" in name:
    try:
      builder = _import(name)
    except (ImportError, AttributeError, ValueError) as e:
      problems.add("task.name", name, f"cannot be imported ({type(e).__name__}: {e})")
      return None
    kind = getattr(builder, "settings", None)
    return sections.build(kind, values, "task", problems) if kind else sections.plain(values)
  if name not in TASKS:
    problems.add("task.name", name, f"must be one of {sorted(TASKS)} or 'package.module:function'")
    return None
  return sections.build(TASKS[name].settings, values, "task", problems)


def check_task(settings: Any) -> list[str]:
  """The task's own checks before compute (its files exist, its reward imports): 'field=value: why' lines."""
  name = settings["name"] if isinstance(settings, Mapping) else settings.name
  entry = TASKS.get(name)
  return entry.check(settings) if entry is not None and entry.check is not None else []


def build_task(settings: Any) -> base.Task:
  """The Task of typed task settings (`settings_of`); a mapping is read as a `task` section first."""
  if isinstance(settings, Mapping) or hasattr(settings, "to_dict"):
    problems = sections.Problems()
    settings = settings_of(settings, problems)
    problems.raise_if_any()
  name = settings["name"] if isinstance(settings, Mapping) else settings.name
  if ":" in name:
    return _import(name)(settings)
  return TASKS[name].build(settings)
