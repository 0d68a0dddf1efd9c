"""One truth per fact (issue 55.4): each test reads the two places that state the same fact and asserts they agree."""
import json
import os
import shutil

import numpy as np
import pytest
import yaml

from configs import arithmetic as arithmetic_config
from experiments import claims, claims_report, claims_stats, paired_stats, plan
from oapl_jax import run_dir
from oapl_jax.apps import train as train_app
from oapl_jax.run import assemble, export, schema
from oapl_jax.rl import loop
from tests.loop_test import fast_config

OWN_TASK = "examples/sort_letters"


def test_a_dry_run_counts_the_warnings_it_printed(tmp_path, capsys, caplog):
  """A duplicate training record (the task's data check) and an unused remat_policy (the config's rule): two lines
  logged, and the closing line says 2."""
  shutil.copytree(OWN_TASK, tmp_path / "data")
  train = tmp_path / "data" / "train.jsonl"
  first = train.read_text().splitlines()[0]
  train.write_text(train.read_text() + first + "\n")
  with caplog.at_level("WARNING"):
    assert train_app.main(["--config", "configs/own_task.py", "--dry_run",
                           f"--config.task.train_path={train}", "--config.model.remat=False",
                           "--config.model.remat_policy=save_dots_no_batch"]) == 0
  printed = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert any("duplicate" in m for m in printed) and any("remat_policy" in m for m in printed), printed
  assert f"config and data OK ({len(printed)} warning(s) above)" in capsys.readouterr().out


def test_the_model_is_named_once_when_a_checkpoint_is_given(tmp_path):
  """config.yaml (summary.md folds it) and the summary's model line name the checkpoint; the preset reads unused."""
  cfg = arithmetic_config.get_config()
  cfg.model.checkpoint = "/ckpt/Qwen3-4B"
  rc = schema.from_config(cfg)
  run_dir.record_config(str(tmp_path), schema.to_mapping(rc))
  shown = yaml.safe_load(open(tmp_path / run_dir.CONFIG_YAML))["model"]
  assert shown["checkpoint"] == assemble.switches(rc)["model"] == "/ckpt/Qwen3-4B"
  assert shown["preset"] == run_dir.PRESET_UNUSED
  assert schema.from_run_dir(str(tmp_path)) == rc  # config.json stays the whole record


def test_a_preset_model_is_named_by_its_preset(tmp_path):
  rc = schema.from_config(arithmetic_config.get_config())
  run_dir.record_config(str(tmp_path), schema.to_mapping(rc))
  assert yaml.safe_load(open(tmp_path / run_dir.CONFIG_YAML))["model"]["preset"] == "tiny"
  assert assemble.switches(rc)["model"].startswith("preset tiny")


def test_claim_3_shows_the_difference_measured_and_the_margin_apart():
  """Both arms at 0 on every seed: the report's differences read +0.0000 (the margin is the test's, said apart)."""
  study = plan.make_study("arithmetic", smoke=True)
  claim3 = next(c for c in claims_stats.claims(study) if c.key == "3")
  diffs = [0.0 + claim3.shift] * 4  # what the test sees
  outcome = claims_stats.Outcome(claim3, claim3.arm, [0, 1, 2, 3], paired_stats.paired(diffs), 4)
  lines = "\n".join(claims_report._claim_lines([outcome]))  # pylint: disable=protected-access
  assert "seed 0: +0.0000" in lines and f"{claim3.shift:+.4f}" not in lines.split("Differences:")[1].split(".")[0]
  assert f"The test adds the margin {claim3.shift:+.4f}" in lines
  assert outcome.measured().mean == 0.0 and outcome.summary.mean == pytest.approx(claim3.shift)


def test_a_smoke_study_says_so_and_that_it_went_past_a_failed_pilot():
  state = claims.State()
  state.pilot = type("Verdict", (), {"ok": False, "message": "no learning: 0.00 -> 0.00"})()
  line = claims_report.smoke_line(state)
  assert "smoke" in line and "no learning: 0.00 -> 0.00" in line and "went on" in line


def test_a_study_run_line_names_the_test_split_once(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(claims, "execute", lambda *a: {"wall_seconds": 3.0, "test": {"test": {"pass@1": 0.25}}})
  monkeypatch.setattr(claims.results, "load", lambda *a: None)
  study = plan.make_study("arithmetic", smoke=True)
  claims.Runner(study, str(tmp_path)).run("main", plan.pilot_cells(study)[0])
  out = capsys.readouterr().out
  assert "test pass@1 0.250" in out and "test test" not in out


@pytest.mark.slow
def test_a_run_s_summary_its_export_and_its_generations_agree(tmp_path):
  """snapshot_version: summary.json and export_info.json (the checkpoint's meta) say the same; evals/ and rollouts/
  hold the bounded generations, their rewards those the eval scored."""
  c = fast_config(num_syncs=2)
  c.eval.save_prompts = 2
  summary = loop.train(assemble.setup(c, str(tmp_path / "run")))
  info = export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  recorded = json.load(open(tmp_path / "run" / "summary.json"))
  assert summary["snapshot_version"] == recorded["snapshot_version"] == info["snapshot_version"] == summary["syncs"]
  end = str(summary["trainer_steps"])
  rows = [json.loads(line) for line in open(tmp_path / "run" / "evals" / end / "held_out.jsonl")]
  assert len(rows) == 2 * c.eval.samples and {"prompt", "response", "reward", "detail"} <= set(rows[0])
  assert np.mean([r["reward"] for r in rows]) <= 1.0
  window = [json.loads(line) for line in open(tmp_path / "run" / "rollouts" / "window_0.jsonl")]
  assert len(window) == 2 * c.loop.group_size and all("advantage" in r for r in window)
  assert sorted(os.listdir(tmp_path / "run" / "evals")) == ["0", end]
