"""reporting.Reporter where clu's TensorBoard writers cannot import (a GPU image without tensorflow); summary.md."""
import json
import logging
import os
import re
import sys

import clu

from oapl_jax import reporting


def test_without_clus_writers_the_history_is_still_written(tmp_path, monkeypatch, caplog):
  monkeypatch.setitem(sys.modules, "clu.metric_writers", None)  # `import` of it now raises ImportError
  monkeypatch.delattr(clu, "metric_writers", raising=False)
  with caplog.at_level(logging.WARNING):
    reporter = reporting.Reporter(str(tmp_path), total_steps=2)
    reporter.scalars(1, {"loss": 0.5})
    reporter.scalars(2, {"loss": 0.25})
    paths = reporter.finish({"trainer_steps": 2})
    reporter.close()
  with open(tmp_path / "metrics.jsonl") as f:
    assert [json.loads(line) for line in f] == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]
  assert not [n for n in os.listdir(tmp_path) if n.startswith("events.out.tfevents")]
  assert paths["tensorboard"] is None and os.path.exists(paths["curve"])
  assert "no TensorBoard events" in caplog.text


def test_with_clus_writers_events_are_written(tmp_path):
  reporter = reporting.Reporter(str(tmp_path), total_steps=1)
  reporter.scalars(1, {"loss": 0.5})
  paths = reporter.finish({"trainer_steps": 1})
  reporter.close()
  assert paths["tensorboard"] == str(tmp_path)
  assert [n for n in os.listdir(tmp_path) if n.startswith("events.out.tfevents")]


def test_summary_says_the_wall_time_the_switches_and_the_config(tmp_path):
  from configs import arithmetic
  from oapl_jax import run_dir
  from oapl_jax.run import assemble, schema
  cfg = arithmetic.get_config("smoke")
  cfg.trainer.lora.rank = 4
  cfg.loop.refresh_drift = 0.25
  run_dir.record_config(str(tmp_path), cfg)
  reporter = reporting.Reporter(str(tmp_path), total_steps=1, switches=assemble.switches(schema.from_config(cfg)))
  reporter.scalars(1, {"loss": 0.5})
  reporter.finish({"trainer_steps": 1})
  reporter.close()
  summary = open(tmp_path / "summary.md").read()
  wall = json.load(open(tmp_path / "summary.json"))["wall_seconds"]
  shown = re.search(r"- \*\*wall time\*\*: (\d+)s \(this process", summary)
  assert 0 < wall < 60 and shown and abs(int(shown.group(1)) - wall) <= 1
  assert "- **config**: [config.json](config.json), [config.yaml](config.yaml)" in summary
  assert "- **LoRA**: rank 4, alpha 16.0, on q_proj, k_proj, v_proj, o_proj" in summary
  assert f"- **adaptive lag**: a refresh when {cfg.loop.drift_metric} > 0.25 (L bounds a window)" in summary
  assert "- **demonstrations in RL batches**: off" in summary and "- **task**: arithmetic" in summary
  assert summary.rstrip().endswith(open(tmp_path / "config.yaml").read().rstrip() + "\n```\n\n</details>")
