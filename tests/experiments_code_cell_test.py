"""A study cell of the sandbox-graded code task (configs/claims.py:code,smoke), end to end: the warm start, the run,
and the final test eval, which must grade with a live sandbox (the run releases its own reward pool when it ends;
an eval on it would score every response 0 as a reward failure)."""
import os

import pytest

from experiments import claims, plan, results


@pytest.mark.slow  # about 70 CPU-s (a warm start, a run, the sandbox): outside CI's budget
def test_a_code_cell_grades_its_final_test_in_a_live_sandbox(tmp_path):
  study = plan.make_study(config="configs/claims.py:code", smoke=True)
  warm = claims.warm_dir_of(str(tmp_path), study)
  made = claims.warm_start(study, warm)
  assert made["test"]["test"]["reward_failures"] == 0
  cell = study.cell(study.tuning_arm("oapl"), study.middle("oapl"), plan.TUNE_SEED)
  workdir = os.path.join(str(tmp_path), cell.name)
  final = claims.execute(study, cell, workdir, warm)
  test = final["test"]["test"]
  assert test["reward_failures"] == 0 and 0.0 <= test["pass@1"] <= 1.0
  assert results.load(str(tmp_path), cell).final["test"] == final["test"]
