"""The claims harness end to end at smoke size (S = 4 steps, lag 2, seeds 0 and 1, one learning rate): every
planned cell ran once, paired cells share everything but the method, the policy eval's step grid is there,
and the report's claim numbers are recomputed here from the runs' own files."""
import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from experiments import paired_stats, plan, results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(out, runs, *extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "")  # 1 device
  return subprocess.run([sys.executable, "-m", "experiments.study", "--smoke", "--out", str(out), "--runs", str(runs),
                         *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  base = tmp_path_factory.mktemp("claims")
  proc = _run(base / "report", base / "runs")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return base, proc.stdout


def _finals(runs):
  out = {}
  for path in glob.glob(os.path.join(str(runs), "*", "*", "*", "*", results.FINAL_EVAL)):
    with open(path) as f:
      final = json.load(f)
    out[final["cell"]] = final
  return out


def test_every_planned_cell_ran_once_at_its_generation_budget(smoke):
  base, stdout = smoke
  study = plan.make_study(smoke=True)
  finals = _finals(base / "runs")
  chosen = {loss: 1e-4 for loss in plan.PRIMARY_LOSSES}
  expected = {c.name for c in plan.main_cells(study, chosen)}
  expected |= {c.name for loss in plan.PRIMARY_LOSSES for c in plan.tuning_cells(study, loss, [1e-4])}
  assert set(finals) == expected
  assert "[claims] pilot: the task does not learn enough" in stdout  # a 5-step warm start: the smoke goes on
  for name, final in finals.items():
    key = final["arm"] if final["task"] == "arithmetic" else f"{final['task']}/{final['arm']}"
    shape = study.arms()[key].shape
    assert final["generations"] == 4 * 4 * 8 // (2 if shape == "reuse2" else 1)  # S x B x G (reuse2: half)
    assert final["command"].startswith("python -m oapl_jax.main --config configs/claims.py:")
    splits = {"test"} if final["task"] == "arithmetic" else {"test_easy", "test_hard"}
    assert set(final["test"]) == splits
    for metrics in final["test"].values():
      values = [metrics[f"pass@{k}"] for k in (1, 2, 4, 8)]
      assert values == sorted(values) and all(0 <= v <= 1 for v in values)


def test_policy_eval_grid_and_recorded_configs(smoke):
  base, _ = smoke
  runs = base / "runs"
  for path in glob.glob(str(runs / "arithmetic" / "*" / "*" / "seed0")):
    history = results.read_history(path)
    grid = [s for s, _ in results.series(history, "policy_eval/val/pass@1")]
    assert grid == [0, 2, 4], path  # every 2 steps whatever the lag, and at the end
    assert [s for s, _ in results.series(history, "policy_eval/val/token_entropy")] == [0, 2, 4]
    with open(os.path.join(path, "config.json")) as f:
      recorded = json.load(f)
    assert recorded["warmstart"]["steps"] == 0 and recorded["seed"] == 0
    assert recorded["model"]["checkpoint"] == str(runs / "arithmetic" / "warmstart")
    if "grpo_obo" in path:
      assert (recorded["loop"]["sync_every"], recorded["loop"]["steps_per_rollout"],
              recorded["loop"]["sampler_delay_windows"]) == (2, 2, 1)
  a, b = (json.load(open(runs / "arithmetic" / arm / "lr0.0001" / "seed1" / "config.json"))
          for arm in ("oapl_L2", "grpo_obo"))
  assert plan.config_differences(a, b) == []


def _claim_rows(text):
  section = text.split("## The five claims", 1)[1].split("\n## ", 1)[0]
  return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
          if re.match(r"\| [1-5] \|", line)]


def test_report_claims_are_the_runs_paired_differences(smoke):
  base, _ = smoke
  text = (base / "report" / "report.md").read_text()
  for heading in ("## Pilot", "## Rules fixed before any run", "## Warm starts", "## Tuning", "## The five claims",
                  "## Other paired comparisons", "## Arms", "## Pairing check", "## Wall time", "## Plots",
                  "## Rerunning one cell"):
    assert heading in text
  assert "differ only in the method's fields" in text
  finals = _finals(base / "runs")
  p1 = lambda arm, s: finals[f"arithmetic/{arm}/lr0.0001/seed{s}"]["test"]["test"]["pass@1"]  # noqa: E731
  d1 = [p1("oapl_L2", s) - p1("grpo_obo", s) for s in (0, 1)]
  hard = lambda arm, s: finals[f"hard_tail/{arm}/lr0.0001/seed{s}"]["test"]["test_hard"]["pass@8"]  # noqa: E731
  d4 = [hard("oapl_L2", s) - hard("grpo_obo", s) for s in (0, 1)]
  warm = json.load(open(base / "runs" / "arithmetic" / "warmstart" / "eval.json"))["test"]["test"]["pass@1"]
  d3 = [p1("oapl_L4", s) - warm for s in (0, 1)]
  rows = {r[0]: r for r in _claim_rows(text)}
  assert list(rows) == list("12345")
  ps = {}
  for key, diffs in (("1", d1), ("3", d3), ("4", d4)):
    n, mean, interval, p = rows[key][3], rows[key][4], rows[key][5], rows[key][6]
    assert n == "2 (2)" and float(mean) == pytest.approx(np.mean(diffs), abs=5e-5)
    s = paired_stats.paired(diffs)
    low, high = (float(x) for x in interval.strip("[]").split(","))
    assert (low, high) == (pytest.approx(s.ci_low, abs=5e-5), pytest.approx(s.ci_high, abs=5e-5))
    assert float(p) == pytest.approx(s.p)
    ps[key] = s.p
  for row in rows.values():  # Holm over five p-values: never below the raw p
    assert float(row[7]) >= float(row[6]) - 1e-9 and row[8].strip("*").split(" ")[0] in (
        "supported", "contradicted", "inconclusive")
  for name in ("pilot.png", "tuning.png", "val_pass1.png", "entropy.png", "claims.png", "passk_hard_tail.png"):
    assert f"![{name}]({name})" in text
    assert (base / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "--config.loop.sampler_delay_windows=1" in text  # the per-cell commands


def test_rerun_skips_finished_runs(smoke):
  base, _ = smoke
  before = {p: os.path.getmtime(p) for p in glob.glob(str(base / "runs" / "*" / "*" / "*" / "*" / results.FINAL_EVAL))}
  proc = _run(base / "report", base / "runs")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "[claims] run (" not in proc.stdout
  assert {p: os.path.getmtime(p) for p in before} == before
