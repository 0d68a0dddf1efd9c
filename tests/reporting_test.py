"""reporting.Reporter where clu's TensorBoard writers cannot import (a GPU image without tensorflow); summary.md;
a metrics.jsonl that cannot be written stops the run in one line and never holds half a line."""
import json
import logging
import os
import re
import subprocess
import sys

import clu
import pytest

from oapl_jax import reporting
from oapl_jax.apps import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _without_clus_writers(monkeypatch):
  monkeypatch.setitem(sys.modules, "clu.metric_writers", None)  # `import` of it now raises ImportError
  monkeypatch.delattr(clu, "metric_writers", raising=False)


def test_without_clus_writers_tensorboards_own_writes_the_events(tmp_path, monkeypatch, caplog):
  """A GPU image without tensorflow: clu's writers cannot import, the tensorboard package's writer takes the scalars
  and texts, read back here by TensorBoard's own loader."""
  from tensorboard.backend.event_processing import event_accumulator
  _without_clus_writers(monkeypatch)
  with caplog.at_level(logging.WARNING):
    reporter = reporting.Reporter(str(tmp_path), total_steps=2)
    reporter.scalars(1, {"loss": 0.5})
    reporter.scalars(2, {"loss": 0.25})
    reporter.texts(2, {"generations": "| a |\n|---|\n| 1 |"})
    paths = reporter.finish({"trainer_steps": 2})
    reporter.close()
  assert paths["tensorboard"] == str(tmp_path) and "through tensorboard's own writer" in caplog.text
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 0.5), (2, 0.25)]
  assert events.Tensors("generations")[0].tensor_proto.string_val == [b"| a |\n|---|\n| 1 |"]


def test_without_any_events_writer_the_history_is_still_written(tmp_path, monkeypatch, caplog):
  _without_clus_writers(monkeypatch)
  monkeypatch.setitem(sys.modules, "tensorboard.summary.writer.record_writer", None)
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


TENSORBOARDS_OWN = """
import sys
from oapl_jax import reporting
reporter = reporting.Reporter(sys.argv[1], total_steps=3, events="tensorboard")
for step in (1, 2, 3):
  reporter.scalars(step, {"loss": 1 / step})
reporter.close()
resumed = reporting.Reporter(sys.argv[1], total_steps=3, events="tensorboard")
resumed.resume_from(3)  # steps 1 and 2 kept: the events are rebuilt from metrics.jsonl by the same writer
resumed.texts(2, {"generations": "| a |"})
resumed.finish({"trainer_steps": 2})
resumed.close()
print(type(resumed.writer).__name__, "tensorflow" in sys.modules)
"""


def test_report_events_tensorboard_writes_the_same_events_without_tensorflow(tmp_path):
  """report.events='tensorboard': scalars and texts reach TensorBoard's own loader, a resume rebuilds them with the
  same writer, and the process never imports tensorflow (clu's writer does)."""
  from tensorboard.backend.event_processing import event_accumulator

  from oapl_jax.run import schema
  done = subprocess.run([sys.executable, "-c", TENSORBOARDS_OWN, str(tmp_path)], cwd=REPO, capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == ["TensorBoardEvents", "False"]
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 1.0), (2, 0.5)]
  assert events.Tensors("generations")[0].tensor_proto.string_val == [b"| a |"]
  cfg = schema.defaults()
  cfg.report.events = "tf"
  with pytest.raises(Exception, match="report.events"):
    schema.from_config({**cfg.to_dict(), "task": {"name": "arithmetic"}})


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


def test_a_metrics_file_that_cannot_be_written_stops_the_command_in_one_line(tmp_path, capsys):
  """A directory put in metrics.jsonl's place during a run: the next write is cli.run's one line, exit 1."""
  path = tmp_path / "metrics.jsonl"

  def run(argv):
    reporter = reporting.Reporter(str(tmp_path), total_steps=3)
    try:
      reporter.scalars(1, {"loss": 0.5})
      path.unlink()
      path.mkdir()
      reporter.scalars(2, {"loss": 0.25})
    finally:
      reporter.close()
    return 0

  with pytest.raises(SystemExit) as exit_info:
    cli.run(run, [])
  assert exit_info.value.code == 1
  assert capsys.readouterr().err == (
      f"error: {path} could not be written at step 2 (Is a directory): the run stopped, no line half-written; make it "
      "a writable file (or move it aside), then run the same command to resume from the last checkpoint\n")


def test_a_resume_that_cannot_rewrite_the_metrics_file_names_it(tmp_path):
  (tmp_path / "metrics.jsonl").mkdir()
  reporter = reporting.Reporter(str(tmp_path), total_steps=3)
  with pytest.raises(reporting.MetricsUnwritable, match=rf"^{re.escape(str(tmp_path))}/metrics.jsonl could not be "
                                                        r"rewritten to resume at step 5 \(Is a directory\)"):
    reporter.resume_from(5)
  reporter.close()


CUT_SHORT = """
import json, resource, sys
sys.modules["clu.metric_writers"] = None  # no TensorBoard events: metrics.jsonl is the only file that grows
sys.modules["tensorboard.summary.writer.record_writer"] = None
from oapl_jax import reporting
reporter = reporting.Reporter(sys.argv[1], total_steps=1000)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # a full disk at 1000 bytes, mid-line
try:
  for step in range(1000):
    reporter.scalars(step, {"train/loss": step / 7})
except reporting.MetricsUnwritable as e:
  print(json.dumps({"step": step, "error": str(e)}))
"""


def test_a_write_cut_short_leaves_no_half_line(tmp_path):
  """A file-size limit cuts the line that crosses it short; that part is taken back off, so the file holds whole
  lines only: every step before the failed one, as written."""
  done = subprocess.run([sys.executable, "-c", CUT_SHORT, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  failed = json.loads(done.stdout)
  assert "could not be written at step" in failed["error"] and "(File too large)" in failed["error"]
  text = (tmp_path / "metrics.jsonl").read_text()
  lines = [json.dumps({"step": step, "train/loss": step / 7}) + "\n" for step in range(failed["step"] + 1)]
  assert text == "".join(lines[:-1]) and len(text) < 1000 < len(text) + len(lines[-1])  # the last one crossed it
