"""The claims harness end to end on a user's records task (configs/own_task.py through --config, at smoke size:
S = 4 steps, lag 2, seeds 0 and 1, one tuning point per loss): every planned cell ran once, paired cells share
everything but the method, the report's claim numbers are recomputed here from the runs' own files; a bad data
file or reward fails before the warm start, naming it; the warm start rebuilds bit-identically from its seed."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import paired_stats, plan, results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "")  # 1 device
  return env


def _study(*args):
  return subprocess.run([sys.executable, "-m", "experiments.study", *map(str, args)], cwd=REPO, env=_env(),
                        capture_output=True, text=True, timeout=1200)


# The smoke study is 15 whole runs (3.6 min of one CI worker, the suite's longest piece): `make test-all` runs it.
# In `make test`, its pieces are tested apart: the plan's cells (experiments_tuning_rules_test, experiments_lag_test),
# the statistics recomputed (experiments_stats_test), a bad config before the warm start and the warm start's
# bit-identical rebuild (below).
SMOKE = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  base = tmp_path_factory.mktemp("claims")
  proc = _study("--config", "configs/own_task.py", "--smoke", "--out", base / "report", "--runs", base / "runs")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return base, proc.stdout


def _finals(runs):
  out = {}
  for path in glob.glob(os.path.join(str(runs), "*", "*", "*", "*", results.FINAL_EVAL)):
    with open(path) as f:
      final = json.load(f)
    out[final["cell"]] = final
  return out


@SMOKE
def test_every_planned_cell_ran_once_at_its_generation_budget(smoke):
  base, stdout = smoke
  study = plan.make_study(config="configs/own_task.py", smoke=True)
  finals = _finals(base / "runs")
  chosen = {loss: study.middle(loss) for loss in plan.PRIMARY_LOSSES}
  expected = {c.name for c in plan.main_cells(study, chosen)} | {c.name for c in plan.pilot_cells(study)}
  expected |= {c.name for loss in plan.PRIMARY_LOSSES for c in plan.tuning_cells(study, loss)}
  assert set(finals) == expected and len(expected) == 2 * 5 + 5  # 2 seeds x 5 arms, 5 pilots (3 also tuning)
  assert "[claims] config and data OK: experiments/task_config.py:configs/own_task.py" in stdout
  assert stdout.count("[claims] headroom ") == 5  # every primary arm
  for name, final in finals.items():
    shape = study.arms()[final["arm"]].shape
    assert final["generations"] == 4 * 4 * 8 // (2 if shape == "reuse2" else 1)  # S x B x G (reuse2: half)
    assert final["command"].startswith("python -m oapl_jax.main --config experiments/task_config.py:configs/own")
    assert set(final["test"]) == {"test"}  # the records task's own 'test' set, held out of the loop's evals
    for metrics in final["test"].values():
      values = [metrics[f"pass@{k}"] for k in (1, 2, 4, 8)]
      assert values == sorted(values) and all(0 <= v <= 1 for v in values)


@SMOKE
def test_policy_eval_on_validation_only_and_recorded_configs(smoke):
  base, _ = smoke
  runs = base / "runs"
  (warm,) = glob.glob(str(runs / "own_task" / "warm_*" / "warmstart"))
  for path in glob.glob(str(runs / "own_task" / "*" / "*" / "seed0")):
    history = results.read_history(path)
    assert [s for s, _ in results.series(history, "policy_eval/dev/pass@1")] == [0, 2, 4], path
    assert not results.series(history, "policy_eval/test/pass@1")  # the test set never enters a curve
    with open(os.path.join(path, "config.json")) as f:
      recorded = json.load(f)
    assert recorded["warmstart"]["steps"] == 0 and recorded["seed"] == 0
    assert recorded["model"]["checkpoint"] == warm
    assert recorded["task"]["name"] == "experiments.split_task:from_config"
    assert recorded["task"]["base"]["reward"] == "examples.sort_letters.reward:score"
  a, b = (json.load(open(glob.glob(str(runs / "own_task" / arm / "*" / "seed1" / "config.json"))[0]))
          for arm in ("oapl_L2", "grpo_obo"))
  assert plan.config_differences(a, b) == []


def _claim_rows(text):
  section = text.split("## The claims", 1)[1].split("\n## ", 1)[0]
  return {r[0]: r for r in ([c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
                            if line.startswith("| ") and line[2] in "12345")}


@SMOKE
def test_report_claims_are_the_runs_paired_differences(smoke):
  base, _ = smoke
  text = (base / "report" / "report.md").read_text()
  for heading in ("## Rules fixed before any run", "## The warm start", "## Pilot", "## Tuning",
                  "## The claims", "## Other paired comparisons", "## Arms", "## Pairing check", "## Wall time",
                  "## Plots", "## Rerunning one cell"):
    assert heading in text
  assert "differ only in the method's fields" in text and "Config and data checked before any run" in text
  finals = _finals(base / "runs")
  p1 = lambda arm, s: next(f for n, f in finals.items() if f"/{arm}/" in n and n.endswith(f"seed{s}"))[  # noqa: E731
      "test"]["test"]["pass@1"]
  d1 = [p1("oapl_L2", s) - p1("grpo_obo", s) for s in (0, 1)]
  d3 = [p1("oapl_L4", s) - p1("oapl_L2", s) for s in (0, 1)]  # shown as measured; tested + the margin 0.05
  rows = _claim_rows(text)
  assert list(rows) == list("12345")
  for key, diffs, margin in (("1", d1, 0.0), ("3", d3, 0.05)):
    n, mean, interval, p = rows[key][3], rows[key][4], rows[key][5], rows[key][6]
    assert n == "2 (2)" and float(mean) == pytest.approx(np.mean(diffs), abs=5e-5)
    s = paired_stats.paired(diffs)
    if np.isfinite(s.ci_low):
      low, high = (float(x) for x in interval.strip("[]").split(","))
      assert (low, high) == (pytest.approx(s.ci_low, abs=5e-5), pytest.approx(s.ci_high, abs=5e-5))
    assert float(p) == pytest.approx(paired_stats.paired([d + margin for d in diffs]).p)
  for name in ("pilot.png", "tuning.png", "val_pass1.png", "entropy.png", "claims.png"):
    assert f"![{name}]({name})" in text
    assert (base / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "--config.trainer.loss_settings.oapl.beta2=0.25" in text  # the per-cell commands


@SMOKE
def test_rerun_skips_finished_runs_and_the_warm_start(smoke):
  base, _ = smoke
  before = {p: os.path.getmtime(p) for p in glob.glob(str(base / "runs" / "*" / "*" / "*" / "*" / results.FINAL_EVAL))}
  proc = _study("--config", "configs/own_task.py", "--smoke", "--out", base / "report", "--runs", base / "runs")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "[claims] run (" not in proc.stdout and "[sweep] warm start: making it" not in proc.stdout
  assert {p: os.path.getmtime(p) for p in before} == before


def _bad_config(tmp_path, **task):
  """configs/own_task.py with task fields replaced (a user's mistake)."""
  path = tmp_path / "bad.py"
  path.write_text("import importlib.util\n\ndef get_config(arg=''):\n"
                  f"  spec = importlib.util.spec_from_file_location('own', {os.path.join(REPO, 'configs', 'own_task.py')!r})\n"
                  "  m = importlib.util.module_from_spec(spec)\n  spec.loader.exec_module(m)\n  c = m.get_config()\n"
                  + "".join(f"  c.task.{k} = {v!r}\n" for k, v in task.items()) + "  return c\n")
  return path


@pytest.mark.parametrize("field, value, named", [
    ("reward", "records:score", "No module named 'records'"),  # the issue's: a reward module not on the path
    ("train_path", "TRAIN", "bad.jsonl"),  # a broken data line: the file is named
])
def test_a_bad_config_stops_before_the_warm_start(tmp_path, field, value, named):
  if value == "TRAIN":
    value = str(tmp_path / "bad.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "dcba", "answer": "abcd"}\n{"prompt": "ba", \n')
  config = _bad_config(tmp_path, **{field: value})
  proc = _study("--config", config, "--smoke", "--out", tmp_path / "report", "--runs", tmp_path / "runs")
  assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert named in proc.stderr and proc.stderr.startswith("error: --config ")
  assert not glob.glob(str(tmp_path / "runs" / "*" / "warm_*")) and "[claims] run (" not in proc.stdout


def _params(directory):
  from safetensors.numpy import load_file
  out = {}
  for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
    out.update(load_file(path))
  return out


@pytest.mark.slow  # two whole warm starts; fast: rl_warmstart_test (the same rows give the same params)
def test_the_warm_start_rebuilds_bit_identically(tmp_path):
  """run/shared_warmstart.build (the command apps/sweep_warmstart) twice from the same config and seed, into two
  directories: equal bytes."""
  for d in ("a", "b"):
    proc = subprocess.run([sys.executable, "-m", "oapl_jax.apps.sweep_warmstart",
                           "--config=experiments/task_config.py:configs/own_task.py", f"--workdir={tmp_path / d}",
                           "--config.warmstart.steps=30"], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
  a, b = _params(tmp_path / "a" / "warmstart"), _params(tmp_path / "b" / "warmstart")
  assert a and sorted(a) == sorted(b)
  assert all(a[k].tobytes() == b[k].tobytes() for k in a)


def test_ab_checks_its_config_first(tmp_path):
  config = _bad_config(tmp_path, reward="records:score")
  proc = subprocess.run([sys.executable, "-m", "experiments.ab", "--config", str(config), "--smoke", "--out",
                         str(tmp_path / "ab"), "--warm", str(tmp_path / "warm"), "--seeds", "0", "--arm", "a"],
                        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 2 and "No module named 'records'" in proc.stderr, proc.stderr[-2000:]
  assert not os.path.exists(tmp_path / "warm") and not os.path.exists(tmp_path / "ab" / "runs")
