"""Any training config as a study task: `experiments/task_config.py:FILE[:ARG]` is FILE's get_config(ARG) with
its eval sets split into validation (the loop's policy eval; every choice) and test (the study's final eval), and
the loop's own snapshot evals and no-signal alarm turned off (the study's policy eval is the curve).

  python -m experiments.study --config configs/own_task.py --out reports/own_task --smoke
  python -m oapl_jax.main --config experiments/task_config.py:configs/own_task.py --workdir runs/x ...  # one cell

The task section becomes experiments.split_task (test_sets 'auto': eval sets named test*; a task with a single
eval set is halved). A config whose task already comes with test sets (split_task, hard_tail_task: the claims
study's configs/claims.py) is kept as it is. The study's cells then set only the method's fields and the run's
shape (experiments/plan.py). Model, task, warm start and sampling stay the user's.
"""
from __future__ import annotations

import importlib

from ml_collections import ConfigDict

STUDY_TASKS = ("experiments.split_task:", "experiments.hard_tail_task:")  # tasks that already give test sets


def has_test_sets(task_section) -> bool:
  return str(task_section.get("name", "")).startswith(STUDY_TASKS)


def task_and_tests(task_section):
  """(the loop's task, {test set name: problems}) from the study task's own `build` (split_task, hard_tail)."""
  module = importlib.import_module(task_section["name"].partition(":")[0])
  return module.build(task_section)


def get_config(arg: str = "") -> ConfigDict:
  from oapl_jax.run import files  # pylint: disable=import-outside-toplevel
  if not arg:
    raise ValueError("experiments/task_config.py needs the config to study: experiments/task_config.py:FILE[:ARG]")
  c = files.load(arg)
  return study_shape(c)


def study_shape(c: ConfigDict) -> ConfigDict:
  """The config as the study runs it (in place and returned): validation/test split, no snapshot evals."""
  if not has_test_sets(c.task):
    c.task = ConfigDict(dict(name="experiments.split_task:from_config", base=c.task, test_sets="auto", num_val=0,
                             num_test=0))
  c.loop.eval_every_syncs = 1_000_000  # the snapshot eval at step 0 only; the policy eval is the curve
  c.monitors.no_signal_steps = 1_000_000  # all-equal groups are common on a hard task; not an alarm here
  c.checkpoint.max_to_keep = 1
  return c


class ConfigRefused(ValueError):
  """The study's config or its data failed the project's own checks (before anything trains)."""


def preflight(spec: str, overrides: dict) -> list[str]:
  """The checks `oapl-train --dry_run` makes, on the config as the study runs it, before the warm start or any
  seed: the typed config and its cross-section rules (run/check), the base task's own checks (its files, its
  reward's import), the task built and validated with its reward probed (assemble.build_task), and its test sets
  present. Returns the warnings; raises ConfigRefused naming the config and every problem."""
  from oapl_jax import sections  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import assemble, check, files, schema  # pylint: disable=import-outside-toplevel
  from oapl_jax.tasks import factory  # pylint: disable=import-outside-toplevel
  try:
    cfg = files.load(spec, overrides)
    base = cfg.task.get("base")
    if base is not None:  # the user's own task inside the split: its checks (files, reward) run first
      problems = sections.Problems()
      settings = factory.settings_of(base, problems)
      problems.raise_if_any()
      if errors := factory.check_task(settings):
        raise ValueError("task.base: " + "; ".join(errors))
    rc = schema.from_config(cfg)
    with check.warnings_logged() as warnings:  # the config's and the task's data checks, as printed
      check.check(rc)
      assemble.build_task(rc).close()
    task, tests = task_and_tests(rc.task)
    task.close()
    if not tests or not all(tests.values()):
      raise ValueError(f"the task gives no test problems ({ {n: len(p) for n, p in tests.items()} })")
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigRefused(f"--config {spec}: {type(e).__name__}: {e}") from e
  return warnings
