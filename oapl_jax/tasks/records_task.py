"""Your own task from a config and data files alone (config_base.records_task documents each field).

- Prompts: `train_path` and the named `eval_paths`, each a JSONL or Parquet file or 'tfds:NAME/SPLIT'.
- Reward: a name in rewards.REWARDS (gold answer from `answer_key`), or an import path
  'package.module:function' to `score(record: dict, response: str) -> float`, which gets the prompt's whole
  source record; it runs in worker processes, `reward_timeout_s` per item.
- Warm start: `demonstrations_path` holds records with `prompt_key` and `completion_key`.
- Tokenizer: "chars" (printable ASCII, one id per character, for tiny models trained from scratch) or an
  HF checkpoint directory, whose chat template wraps each prompt.

With "chars" the response reaches the reward without its end marker; a response cut at the token
budget (no eos) scores `unfinished_reward` and is never shown to the reward.
"""
from __future__ import annotations

import dataclasses
import json
import os

from oapl_jax import sections
from oapl_jax.tasks import base, char_tokenizer, rewards, sources
from oapl_jax.tasks.templates import ChatTokenizer

CHARS_TOKENIZER = "chars"


class PrintableTokenizer(char_tokenizer.CharTokenizer):
  """<pad>=0, <bos>=1, <eos>=2, then newline, tab and printable ASCII (space to '~'); 128 ids."""
  chars = "\n\t" + "".join(chr(c) for c in range(32, 127))
  vocab_size, name = 128, "printable ASCII"


@dataclasses.dataclass(frozen=True)
class RecordsSettings:
  """task.name='records': your own task from data files. Sources are .jsonl, .parquet or tfds:NAME/SPLIT.
  Each record's prompt is record[prompt_key] + instruction_suffix (an HF tokenizer's chat template wraps it,
  with system_prompt). An import-path (or math_verify) reward runs in worker processes: what an item starts is
  killed when it returns, and what it prints is logged (first lines) and counted, never on the trainer's stdout."""
  name: str = "records"  # task.name: this task
  train_path: str = ""  # training records
  eval_paths: dict = dataclasses.field(default_factory=dict)  # {eval set name: its records' source}
  # a name in tasks/rewards.REWARDS, or 'package.module:function' to `score(record, response) -> float` (it gets
  # the prompt's whole record; else record[answer_key] is the answer)
  reward: str = "exact_match"
  tokenizer: str = CHARS_TOKENIZER  # "chars" (printable ASCII, tiny models) or an HF checkpoint directory
  # records with prompt_key (the same key as the prompts) and completion_key, for the warm start ('' = none)
  demonstrations_path: str = ""
  prompt_key: str = "prompt"  # the record field holding the prompt
  answer_key: str = "answer"  # the record field holding the gold answer
  completion_key: str = "completion"  # a demonstration's field holding its response
  system_prompt: str = ""  # the chat template's system message ('' = none)
  instruction_suffix: str = ""  # appended to each prompt
  reward_workers: int = sections.rule(2, low=1)  # the reward's worker processes
  reward_timeout_s: float = sections.rule(10.0, low=0, low_open=True)  # per item (past it: 0, a reward failure)
  # the memory (address space) an item may allocate in its worker, 0: no limit; past it the item scores 0 and
  # counts as a reward failure
  reward_memory_mb: int = sections.rule(0, low=0)
  max_train: int = sections.rule(0, low=0)  # the first this many training records (0: all)
  unfinished_reward: float = sections.rule(0.0, low=-1e9)  # "chars": what a response cut at the budget scores

  def __post_init__(self):
    sections.enforce(self)

  @property
  def has_demonstrations(self) -> bool:
    return bool(self.demonstrations_path)


def check(cfg: RecordsSettings) -> list[str]:
  """What can be checked before compute: the sources exist, the tokenizer and the reward resolve."""
  problems = sources.missing_sources({"task.train_path": cfg.train_path,
                                      **{f"task.eval_paths.{k}": v for k, v in cfg.eval_paths.items()},
                                      **({"task.demonstrations_path": cfg.demonstrations_path}
                                         if cfg.demonstrations_path else {})})
  if cfg.tokenizer != CHARS_TOKENIZER and not os.path.isdir(os.path.expanduser(cfg.tokenizer)):
    problems.append(f"task.tokenizer={cfg.tokenizer!r}: must be 'chars' or an HF checkpoint directory")
  if ":" in cfg.reward:
    try:
      rewards.import_score(cfg.reward)
    except ValueError as e:
      problems.append(f"task.reward={cfg.reward!r}: {e}")
  elif cfg.reward not in rewards.REWARDS:
    problems.append(f"task.reward={cfg.reward!r}: must be one of {sorted(rewards.REWARDS)} or "
                    "'package.module:function'")
  return problems


def _tokenizer(cfg: RecordsSettings):
  if cfg.tokenizer == CHARS_TOKENIZER:
    return PrintableTokenizer()
  path = os.path.expanduser(cfg.tokenizer)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"config field task.tokenizer: {cfg.tokenizer!r} is neither {CHARS_TOKENIZER!r} "
                            f"nor an HF checkpoint directory")
  return ChatTokenizer(path)


def _encode(tokenizer, text: str, where: str) -> list[int]:
  try:
    return tokenizer.encode(text)
  except ValueError as e:  # a character outside the vocabulary
    raise sources.DataError(f"{where}: {e}") from None


def _prompt_tokens(tokenizer, prompt: str, cfg: RecordsSettings, where: str) -> tuple[int, ...]:
  if isinstance(tokenizer, ChatTokenizer):  # the template renders its own special tokens
    return tokenizer.prompt_tokens(prompt, cfg.system_prompt or None, cfg.instruction_suffix)
  return (tokenizer.bos_id, *_encode(tokenizer, prompt + cfg.instruction_suffix, where))


def from_config(cfg: RecordsSettings) -> base.Task:
  tokenizer = _tokenizer(cfg)
  record_reward = ":" in cfg.reward
  answer_key = "" if record_reward else cfg.answer_key  # a record reward finds its answer in the record

  def problems(spec: str, field: str, limit: int = 0) -> list[base.Problem]:
    records = sources.load_source(spec, field, cfg.prompt_key, answer_key, keep_fields=record_reward)
    out = []
    for i, r in enumerate(records[:limit or None]):
      # A record reward reads the whole record, so it travels as the problem's answer (JSON).
      answer = json.dumps(r["record"]) if record_reward else r["answer"]
      out.append(base.Problem(prompt=r["problem"], answer=answer,
                              prompt_tokens=_prompt_tokens(tokenizer, r["problem"], cfg, f"{spec} record {i + 1}")))
    return out

  train = problems(cfg.train_path, "train_path", cfg.max_train)
  eval_sets = {name: problems(spec, f"eval_paths.{name}") for name, spec in dict(cfg.eval_paths).items()}
  in_workers = record_reward or cfg.reward == "math_verify"
  reward = rewards.reward_by_name(cfg.reward, **(dict(num_workers=cfg.reward_workers, timeout_s=cfg.reward_timeout_s,
                                                      memory_mb=cfg.reward_memory_mb) if in_workers else {}))
  if isinstance(tokenizer, PrintableTokenizer):
    reward = rewards.FinishedOnly(reward, char_tokenizer.EOS, cfg.unfinished_reward)

  demonstrations = None
  if cfg.demonstrations_path:
    spec = cfg.demonstrations_path
    demos = []
    for i, r in enumerate(sources.load_source(spec, "demonstrations_path", cfg.prompt_key, cfg.completion_key)):
      where = f"{spec} record {i + 1}"  # counted from 1, as lines are
      completion = (*_encode(tokenizer, r["answer"], where), tokenizer.eos_id)
      demos.append(base.Demonstration(_prompt_tokens(tokenizer, r["problem"], cfg, where), completion))
    demonstrations = lambda seed: demos  # noqa: E731  (the warm start shuffles by its own seed)

  return base.Task(name=os.path.basename(cfg.train_path) or "records", tokenizer=tokenizer, train=train,
                   eval_sets=eval_sets, reward_fn=rewards.Guarded(reward), demonstrations=demonstrations)
