"""A task's held-out problems split into validation sets (the loop evaluates them; every choice is made on them)
and test sets (scored once at the end by the study, never seen by a choice).

  task.name = "experiments.split_task:from_config"
  task.base = <any task section: a factory.TASKS name or an import path>
  task.test_sets = "auto" | "a,b" (names of the base task's eval sets held out as test)
  task.num_val, task.num_test (only when the base has one eval set and no set is named as test)

test_sets "auto": the base's eval sets whose names start with 'test' are the test sets, the others validation;
with no such set and exactly one eval set, its first num_val problems are 'val' and the next num_test 'test'
(num_val = num_test = 0: the first half and the second half). Every task of the study offers the same two
functions: `from_config` (the loop's view: validation sets only) and `build` (that task and its test sets).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from oapl_jax.tasks import base
from oapl_jax.tasks.factory import build_task

AUTO = "auto"


def held_out_of(task: base.Task, needed: int, who: str = "split_task") -> list[base.Problem]:
  """The base task's single eval set, checked to hold at least `needed` problems."""
  if len(task.eval_sets) != 1:
    raise ValueError(f"{who}: task {task.name!r} has eval sets {sorted(task.eval_sets)}; expected exactly one "
                     "(or name the test sets: task.test_sets)")
  (held_out,) = task.eval_sets.values()
  if len(held_out) < needed:
    raise ValueError(f"{who}: task {task.name!r} has {len(held_out)} held-out problems, fewer than the {needed} "
                     f"the split needs")
  return list(held_out)


def split_problems(task: base.Task, num_val: int, num_test: int) -> tuple[list[base.Problem], list[base.Problem]]:
  """(val, test) from the base task's single eval set (0 and 0: its two halves)."""
  if num_val == 0 and num_test == 0:
    held_out = held_out_of(task, 2)
    half = len(held_out) // 2
    return held_out[:half], held_out[half:]
  if num_val < 1 or num_test < 1:
    raise ValueError(f"split_task: num_val={num_val} and num_test={num_test} must both be >= 1 (or both 0)")
  held_out = held_out_of(task, num_val + num_test)
  return held_out[:num_val], held_out[num_val:num_val + num_test]


def test_names(eval_sets: Sequence[str], test_sets: str) -> list[str]:
  """The eval sets held out as test: named (comma-separated) or 'auto' (the names starting with 'test')."""
  if test_sets == AUTO:
    return [name for name in eval_sets if name.startswith("test")]
  names = [n.strip() for n in test_sets.split(",") if n.strip()]
  if missing := [n for n in names if n not in eval_sets]:
    raise ValueError(f"split_task: task.test_sets names {missing}, not among the task's eval sets {list(eval_sets)}")
  return names


def build(cfg: Mapping[str, Any]) -> tuple[base.Task, dict[str, Sequence[base.Problem]]]:
  """(the task with only its validation sets as eval_sets, {test set name: problems})."""
  task = build_task(cfg["base"])
  names = test_names(list(task.eval_sets), str(cfg.get("test_sets", AUTO)))
  if names:
    val = {n: p for n, p in task.eval_sets.items() if n not in names}
    if not val:
      raise ValueError(f"split_task: every eval set of task {task.name!r} ({names}) is a test set; the study needs "
                       "a validation set too (add one to the task, or name fewer in task.test_sets)")
    return dataclasses.replace(task, eval_sets=val), {n: task.eval_sets[n] for n in names}
  val, test = split_problems(task, int(cfg.get("num_val", 0)), int(cfg.get("num_test", 0)))
  return dataclasses.replace(task, eval_sets={"val": val}), {"test": test}


def from_config(cfg: Mapping[str, Any]) -> base.Task:
  """The loop's view: validation only (task.name import path)."""
  return build(cfg)[0]
