"""tools/compare_runs.py: wall-clock and buffer-progress fields are left out; any other value or key that differs
is reported, with exit 1."""
import json

from tools import compare_runs


def _run(path, rows):
  path.mkdir()
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def test_timing_is_ignored_and_a_changed_value_is_not(tmp_path, capsys):
  base = [{"step": 0, "train/loss": 0.5, "train/step_seconds": 1.0, "buffer/groups": 3},
          {"step": 1, "train/loss": 0.25, "train/tokens_per_second": 10.0}]
  same = [{"step": 0, "train/loss": 0.5, "train/step_seconds": 9.0, "buffer/groups": 5},
          {"step": 1, "train/loss": 0.25, "train/tokens_per_second": 99.0}]
  a, b = _run(tmp_path / "a", base), _run(tmp_path / "b", same)
  assert compare_runs.main([a, b]) == 0
  assert capsys.readouterr().out.startswith("2 values compared, 0 differ, 0 keys in one run only")
  changed = [dict(same[0]), {**same[1], "train/loss": 0.2500001, "eval/x/pass@1": 0.5}]
  c = _run(tmp_path / "c", changed)
  assert compare_runs.main([a, c]) == 1
  out = capsys.readouterr().out
  assert "1 differ, 1 keys in one run only" in out and "step 1 train/loss: 0.25 -> 0.2500001" in out
