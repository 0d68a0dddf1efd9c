"""reporting.Reporter where clu's TensorBoard writers cannot import (a GPU image without tensorflow)."""
import json
import logging
import os
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
