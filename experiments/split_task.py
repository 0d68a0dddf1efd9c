"""A task's held-out problems split into a validation set (the loop evaluates it; hyperparameters are
chosen on it) and a test set (scored once at the end by the claims harness, never seen by a choice).

  task.name = "experiments.split_task:from_config"
  task.base = <any task section: a factory.TASKS name or an import path>, task.num_val, task.num_test

The base task must have exactly one eval set with at least num_val + num_test problems; the first
num_val are 'val', the next num_test are 'test'. Every task of the claims study offers the same two
functions: `from_config` (the loop's view: validation sets only) and `build` (that task and its test sets).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from oapl_jax.tasks import base
from oapl_jax.tasks.factory import build_task


def held_out_of(task: base.Task, needed: int, who: str = "split_task") -> list[base.Problem]:
  """The base task's single eval set, checked to hold at least `needed` problems."""
  if len(task.eval_sets) != 1:
    raise ValueError(f"{who}: task {task.name!r} has eval sets {sorted(task.eval_sets)}; expected exactly one")
  (held_out,) = task.eval_sets.values()
  if len(held_out) < needed:
    raise ValueError(f"{who}: task {task.name!r} has {len(held_out)} held-out problems, fewer than the {needed} "
                     f"the split needs")
  return list(held_out)


def split_problems(task: base.Task, num_val: int, num_test: int) -> tuple[list[base.Problem], list[base.Problem]]:
  """(val, test) from the base task's single eval set."""
  if num_val < 1 or num_test < 1:
    raise ValueError(f"split_task: num_val={num_val} and num_test={num_test} must both be >= 1")
  held_out = held_out_of(task, num_val + num_test)
  return held_out[:num_val], held_out[num_val:num_val + num_test]


def build(cfg: Mapping[str, Any]) -> tuple[base.Task, dict[str, Sequence[base.Problem]]]:
  """(the task with eval_sets {'val': ...}, {'test': the test problems})."""
  task = build_task(cfg["base"])
  val, test = split_problems(task, int(cfg["num_val"]), int(cfg["num_test"]))
  return dataclasses.replace(task, eval_sets={"val": val}), {"test": test}


def from_config(cfg: Mapping[str, Any]) -> base.Task:
  """The loop's view: validation only (task.name import path)."""
  return build(cfg)[0]
