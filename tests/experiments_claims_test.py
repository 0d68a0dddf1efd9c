"""The claims harness end to end at smoke size (2 losses x 2 lags x 1 seed): the report's structure, and
every number checked in it is recomputed here from the runs' own files (final_eval.json, metrics.jsonl)."""
import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from experiments import claims, claims_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(out, runs):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "")  # 1 device
  return subprocess.run([sys.executable, "-m", "experiments.study", "--task", "arithmetic", "--smoke",
                         "--out", str(out), "--runs", str(runs)], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=900)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  base = tmp_path_factory.mktemp("claims")
  proc = _run(base / "report", base / "runs")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return base, proc.stdout


def _finals(runs):
  out = {}
  for path in glob.glob(os.path.join(runs, "*", claims.FINAL_EVAL)):
    with open(path) as f:
      final = json.load(f)
    cell = claims.Cell(**final["cell"])
    out[(cell.loss, cell.lag, cell.seed)] = (final, os.path.dirname(path))
  return out


def _table_rows(text, header_start):
  section = text.split(header_start, 1)[1].split("\n## ", 1)[0]
  return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
          if line.startswith("| ") and not line.startswith("| loss")]


def test_every_cell_ran_once_at_the_same_generation_budget(smoke):
  base, _ = smoke
  finals = _finals(base / "runs")
  # the smoke study: oapl and grpo at lags 1 and 2, seed 0 (the tuning run at lag 2 is the main run too)
  assert set(finals) == {(loss, lag, 0) for loss in ("oapl", "grpo") for lag in (1, 2)}
  # configs/claims.py smoke: 4 trainer steps x 4 prompts x 8 responses, whatever the loss and lag
  assert {f["generations"] for f, _ in finals.values()} == {4 * 4 * 8}
  for (loss, lag, _), (final, workdir) in finals.items():
    with open(os.path.join(workdir, "config.json")) as f:
      recorded = json.load(f)
    assert recorded["trainer"]["loss"] == loss and recorded["loop"]["sync_every"] == lag
    assert recorded["loop"]["num_syncs"] * lag == 4 and recorded["warmstart"]["steps"] == 0
    assert recorded["model"]["checkpoint"].endswith(os.path.join("runs", "warmstart"))
    # the smoke's final eval: 8 samples per test prompt, 4 per validation prompt
    for split, ks in (("val", (1, 2, 4)), ("test", (1, 2, 4, 5, 8))):
      assert {k for k in final[split] if k.startswith("pass@")} == {f"pass@{k}" for k in ks}
      values = [final[split][f"pass@{k}"] for k in ks]
      assert all(0.0 <= v <= 1.0 for v in values) and values == sorted(values)  # pass@k is monotone in k


def test_report_structure_and_its_numbers_are_the_runs(smoke):
  base, _ = smoke
  text = (base / "report" / "report.md").read_text()
  for heading in ("## Tuning", "## Final test pass@k", "## Training: generations to", "## The paper's five claims",
                  "## Plots"):
    assert heading in text
  finals = _finals(base / "runs")
  rows = _table_rows(text, "## Final test pass@k")
  assert {(r[0], int(r[1])) for r in rows} == {(loss, lag) for loss, lag, _ in finals}
  for loss, lag, *cells in rows:
    final = finals[(loss, int(lag), 0)][0]
    for k, cell in zip((1, 5), cells):  # pass@10 and @64 exceed the smoke's 8 samples
      mean, sd, n = re.fullmatch(r"(\S+) ± (\S+) \(n=(\d+)\)", cell).groups()
      assert float(mean) == pytest.approx(final["test"][f"pass@{k}"], abs=5e-4) and float(sd) == 0 and n == "1"
  for loss, lag, gens, entropy, *_, collapses in _table_rows(text, "## Training: generations to"):
    final, workdir = finals[(loss, int(lag), 0)]
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      history = [json.loads(line) for line in f]
    ent = [(h["step"], h["train/entropy"]) for h in history if "train/entropy" in h]
    last = max(s for s, _ in ent)
    expected = np.mean([v for s, v in ent if s >= 0.75 * last])  # the last quarter of training
    assert float(entropy.split(" ")[0]) == pytest.approx(expected, abs=5e-4)
    assert re.fullmatch(r"[01]/1", collapses)
  for loss, point, lag, val, chosen in _table_rows(text, "## Tuning"):
    assert float(val) == pytest.approx(finals[(loss, int(lag), 0)][0]["val"]["pass@1"], abs=5e-4) and chosen == "yes"
  claims_lines = [line for line in text.splitlines() if re.match(r"[1-5]\. ", line)]
  assert [line[0] for line in claims_lines] == list("12345")
  for line in claims_lines:  # one seed: no spread to compare against, so no claim can be decided
    assert "**inconclusive**" in line
  for name in ("pass1_vs_generations.png", "passk_vs_k.png", "entropy.png", "log_ratio.png"):
    assert f"![{name}]({name})" in text
    assert (base / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rerun_skips_finished_runs(smoke):
  base, _ = smoke
  before = {p: os.path.getmtime(p) for p in glob.glob(str(base / "runs" / "*" / claims.FINAL_EVAL))}
  proc = _run(base / "report", base / "runs")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "[claims] tuning" not in proc.stdout and "[claims] main" not in proc.stdout
  assert {p: os.path.getmtime(p) for p in before} == before


def test_verdict_rules_on_hand_made_seeds():
  assert claims_report.compare([0.5, 0.6, 0.7], [0.1, 0.2, 0.3]) == "better"  # means 0.6 vs 0.2, sds 0.1
  assert claims_report.compare([0.5, 0.6, 0.7], [0.45, 0.55, 0.65]) == "tie"
  assert claims_report.compare([0.5], [0.1]) == "one seed"
  assert claims_report._verdict(["better", "better", "tie"]) == "supported"
  assert claims_report._verdict(["better", "worse", "better"]) == "inconclusive"
  assert claims_report._verdict(["tie", "worse"]) == "not supported"
  assert claims_report.generation_ratio(100.0, 300.0) == 3.0
  assert claims_report.generation_ratio(float("inf"), float("inf")) == 1.0
  assert claims_report.generation_ratio(100.0, float("inf")) == float("inf")
