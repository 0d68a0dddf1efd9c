"""Checks of problem sets before compute: empty sets, oversized prompts, duplicates, token ids, demonstrations.

    problems, counts = validate_problems(problems, where="task.train_path /d/train.jsonl", max_prompt_tokens=1024,
                                         locations=locations)   # locations from sources.load_jsonl(with_locations=True)
    task, counts = validate_task(task, Demands(max_prompt_tokens=1024, policy=ValidationConfig()))

Errors are sources.DataError naming the set and the file and line (or record); skips and duplicates are
counted and logged. run/assemble.build_task runs validate_task on every entry point's task, before any model is built.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

from oapl_jax import sections
from oapl_jax.tasks.base import Problem, Task
from oapl_jax.tasks.sources import DataError

log = logging.getLogger(__name__)


def validate_problems(problems: Sequence[Problem], *, where: str, max_prompt_tokens: int,
                      on_oversized: str = "error", on_duplicates: str = "keep",
                      locations: Sequence[str] | None = None,
                      vocab_size: int | None = None) -> tuple[list[Problem], dict[str, int]]:
  """One problem set -> (the problems to use, counts).

  `where` names the set ("task.train_path /d/train.jsonl"); `locations[i]` where problem i came from
  ("/d/train.jsonl line 7"; default "<where> record i+1": records count from 1, as lines do). A prompt
  longer than `max_prompt_tokens` (sampler.max_prefill_length) is a DataError naming it, or with
  on_oversized="skip" a counted, logged skip. Duplicates (same prompt tokens and answer) are counted and
  logged, then kept or dropped; a prompt repeated with another answer is counted and logged
  (conflicting_answers) and kept.
  An empty set, an empty prompt or a token id outside [0, vocab_size) is always a DataError."""
  if on_oversized not in ("error", "skip") or on_duplicates not in ("keep", "drop"):
    raise ValueError(f"on_oversized={on_oversized!r} (error|skip), on_duplicates={on_duplicates!r} (keep|drop)")
  locations = (list(locations) if locations is not None
               else [f"{where} record {i}" for i in range(1, len(problems) + 1)])
  if len(locations) != len(problems):
    raise ValueError(f"{where}: {len(locations)} locations for {len(problems)} problems")
  if not problems:
    raise DataError(f"{where} holds no records")
  kept, oversized, first_seen, repeats, answers, conflicts = [], [], {}, [], {}, []
  for problem, at in zip(problems, locations):
    tokens = problem.prompt_tokens
    if not tokens:
      raise DataError(f"{at}: the prompt has no tokens")
    if vocab_size is not None and any(not 0 <= t < vocab_size for t in tokens):
      raise DataError(f"{at}: prompt token ids outside the model's vocabulary [0, {vocab_size}): "
                      f"{[t for t in tokens if not 0 <= t < vocab_size][:5]}")
    if len(tokens) > max_prompt_tokens:
      oversized.append(f"{at} ({len(tokens)} tokens)")
      continue
    key = (tuple(tokens), problem.answer)
    if answers.setdefault(key[0], (problem.answer, at))[0] != problem.answer:
      conflicts.append(f"{at} has answer {problem.answer!r}, {answers[key[0]][1]} {answers[key[0]][0]!r}")
    if key in first_seen:
      repeats.append(f"{at} repeats {first_seen[key]}")
      if on_duplicates == "drop":
        continue
    else:
      first_seen[key] = at
    kept.append(problem)
  limit = f"sampler.max_prefill_length={max_prompt_tokens}"
  if oversized and on_oversized == "error":
    raise DataError(f"{where}: {len(oversized)} prompt(s) longer than {limit}: {', '.join(oversized[:5])}"
                    f"{' ...' if len(oversized) > 5 else ''} (raise the limit, or set validation.on_oversized='skip')")
  if oversized:
    log.warning("%s: skipped %d prompt(s) longer than %s, e.g. %s", where, len(oversized), limit, oversized[0])
  if repeats:
    log.warning("%s: %d duplicate record(s) %s, e.g. %s", where, len(repeats),
                "dropped" if on_duplicates == "drop" else "kept", repeats[0])
  if conflicts:
    log.warning("%s: %d record(s) repeat a prompt with another answer (kept), e.g. %s", where, len(conflicts),
                conflicts[0])
  if not kept:
    raise DataError(f"{where}: none of its {len(problems)} records is usable (all longer than {limit})")
  counts = dict(records=len(problems), kept=len(kept), oversized_skipped=len(oversized), duplicates=len(repeats),
                duplicates_dropped=len(repeats) if on_duplicates == "drop" else 0, conflicting_answers=len(conflicts))
  return kept, counts


def _where(task_settings, task_name: str, set_name: str) -> str:
  """'task.train_path /d/train.jsonl', 'task.eval_paths.aime25 /d/aime25.jsonl', or 'task 'arithmetic' train set'."""
  get = (lambda k: task_settings.get(k)) if isinstance(task_settings, dict) else \
      (lambda k: getattr(task_settings, k, None))  # noqa: E731
  if set_name == "train":
    path, field = get("train_path"), "train_path"
  else:
    path, field = dict(get("eval_paths") or {}).get(set_name), f"eval_paths.{set_name}"
  return f"task.{field} {path}" if path else f"task {task_name!r} {set_name} set"


@dataclasses.dataclass(frozen=True)
class Demands:
  """What the run asks of a task's data: prompt length, vocabulary, and the warm start's demonstrations."""
  max_prompt_tokens: int
  policy: "ValidationConfig"
  warmstart_steps: int = 0
  warmstart_batch: int = 0
  seed: int = 0
  vocab_size: int | None = None


def validate_task(task: Task, demands: Demands, *, task_settings=None,
                  locations: dict[str, Sequence[str]] | None = None) -> tuple[Task, dict[str, dict[str, int]]]:
  """validate_problems over the task's train set and every eval set, plus the warm start's demonstrations.
  task_settings: the task's config section (for file names in messages).

  locations: optional {"train" | eval set name: per-record locations}. Returns (the task with the kept
  problems, {set: counts}); eval prompts that also appear in the train set are counted and logged."""
  kw = dict(max_prompt_tokens=demands.max_prompt_tokens, vocab_size=demands.vocab_size,
            on_oversized=demands.policy.on_oversized, on_duplicates=demands.policy.on_duplicates)
  locations, counts = locations or {}, {}
  where = {name: _where(task_settings, task.name, name) for name in ("train", *task.eval_sets)}
  train, counts["train"] = validate_problems(task.train, where=where["train"], locations=locations.get("train"), **kw)
  if not task.eval_sets:
    log.warning("task %r has no eval sets: nothing will be evaluated", task.name)
  eval_sets, seen = {}, {tuple(p.prompt_tokens) for p in train}
  for name, problems in task.eval_sets.items():
    eval_sets[name], counts[name] = validate_problems(problems, where=where[name], locations=locations.get(name), **kw)
    counts[name]["in_train"] = sum(tuple(p.prompt_tokens) in seen for p in eval_sets[name])
    if counts[name]["in_train"]:
      log.warning("eval set %r: %d prompt(s) also in the train set", name, counts[name]["in_train"])
  steps, batch = demands.warmstart_steps, demands.warmstart_batch
  if steps:
    if task.demonstrations is None:
      raise DataError(f"warmstart.steps={steps}, but task {task.name!r} has no demonstrations")
    available = len(task.demonstrations(demands.seed))
    if batch > available:
      raise DataError(f"warmstart.batch_size={batch} exceeds the {available} demonstrations of task {task.name!r}")
  return dataclasses.replace(task, train=train, eval_sets=eval_sets), counts


@dataclasses.dataclass(frozen=True)
class ValidationConfig:
  """The `validation` section: what the checks of a task's data before compute do with what they find."""
  on_oversized: str = sections.rule("error", choices=("error", "skip"))  # a prompt over sampler.max_prefill_length
  on_duplicates: str = sections.rule("keep", choices=("keep", "drop"))  # duplicate records (counted either way)

  def __post_init__(self):
    sections.enforce(self)
