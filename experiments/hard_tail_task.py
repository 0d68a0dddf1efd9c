"""Task B of the claims study: 2-digit addition whose warm-start teacher is always wrong on one half.

  task.name = "experiments.hard_tail_task:from_config"
  task.base = an arithmetic task section (its teacher_slip_rate is the easy half's), task.hard_slip_rate
  (1.0: the teacher slips on every hard demonstration), task.num_val, task.num_test (per half)

A problem is hard when its first operand is odd: a rule of the prompt the model can read, so the warm
start learns to slip on every hard problem and never succeeds there (the study checks that). The
held-out problems are split by half; the first num_val of each are 'val_easy' / 'val_hard' (the loop's
eval sets), the next num_test are 'test_easy' / 'test_hard' (pass@k up to k = 256 at the end, per half).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

from oapl_jax.tasks import arithmetic, base
from oapl_jax.tasks.factory import build_task

from experiments.split_task import held_out_of

HALVES = ("easy", "hard")


def is_hard(problem: base.Problem) -> bool:
  """The first operand is odd ('37+58=' is hard, '36+58=' easy)."""
  match = re.match(r"\d+", problem.prompt)
  if match is None:
    raise ValueError(f"hard_tail_task: prompt {problem.prompt!r} does not start with an operand")
  return int(match.group()) % 2 == 1


def demonstrations(problems: Sequence[base.Problem], tokenizer, easy_slip_rate: float, hard_slip_rate: float,
                   seed: int) -> list[base.Demonstration]:
  """arithmetic.sft_examples with the slip rate of each problem's half, in the problems' order."""
  out: list = [None] * len(problems)
  for half, rate in zip(HALVES, (easy_slip_rate, hard_slip_rate)):
    index = [i for i, p in enumerate(problems) if is_hard(p) == (half == "hard")]
    demos = arithmetic.sft_examples([problems[i] for i in index], tokenizer, slip_rate=rate,
                                    seed=seed + HALVES.index(half))
    for i, demo in zip(index, demos):
      out[i] = demo
  return out


def build(cfg: Mapping[str, Any]) -> tuple[base.Task, dict[str, Sequence[base.Problem]]]:
  """(the task with eval_sets {'val_easy', 'val_hard'}, {'test_easy': ..., 'test_hard': ...})."""
  if cfg["base"]["name"] != "arithmetic":
    raise ValueError(f"hard_tail_task: task.base.name must be 'arithmetic', got {cfg['base']['name']!r}")
  num_val, num_test, hard_rate = int(cfg["num_val"]), int(cfg["num_test"]), float(cfg["hard_slip_rate"])
  if num_val < 1 or num_test < 1 or not 0 <= hard_rate <= 1:
    raise ValueError(f"hard_tail_task: num_val={num_val}, num_test={num_test} must be >= 1 and hard_slip_rate="
                     f"{hard_rate} in [0, 1]")
  task = build_task(cfg["base"])
  held_out = held_out_of(task, 2 * (num_val + num_test), "hard_tail_task")
  evals, tests = {}, {}
  for half in HALVES:
    problems = [p for p in held_out if is_hard(p) == (half == "hard")]
    if len(problems) < num_val + num_test:
      raise ValueError(f"hard_tail_task: {len(problems)} held-out {half} problems, fewer than num_val + num_test = "
                       f"{num_val + num_test} (raise task.base.num_held_out)")
    evals[f"val_{half}"], tests[f"test_{half}"] = problems[:num_val], problems[num_val:num_val + num_test]
  easy_rate, train, tokenizer = float(cfg["base"]["teacher_slip_rate"]), task.train, task.tokenizer
  return dataclasses.replace(
      task, name="hard_tail", eval_sets=evals,
      demonstrations=lambda seed: demonstrations(train, tokenizer, easy_rate, hard_rate, seed)), tests


def from_config(cfg: Mapping[str, Any]) -> base.Task:
  """The loop's view: the validation halves only (task.name import path)."""
  return build(cfg)[0]
