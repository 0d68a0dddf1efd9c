"""loop_bench's pure pieces: time to a pass@1 threshold on hand-made curves, the median with 'not reached', the lr
pick, and a result read back from a run directory's metrics.jsonl and summary.json. No run is timed here."""
import json

import pytest

from benchmarks import loop_curves


def _curve(*points):
  return [{"step": 10 * i, "seconds": s, "pass@1": p, "generations": 0} for i, (s, p) in enumerate(points)]


def test_time_to_a_threshold_is_interpolated_between_the_evals_around_it():
  curve = _curve((0.0, 0.5), (10.0, 0.7), (30.0, 0.9), (40.0, 0.85))
  assert loop_curves.time_to(curve, 0.8) == pytest.approx(20.0)  # halfway from 0.7 at 10 s to 0.9 at 30 s
  assert loop_curves.time_to(curve, 0.9) == pytest.approx(30.0)
  assert loop_curves.time_to(curve, 0.95) is None
  assert loop_curves.time_to(_curve((2.0, 0.92), (5.0, 0.5)), 0.9) == 2.0  # already there at the first eval


def test_the_median_counts_not_reached_as_later_than_any_time():
  assert loop_curves.median_time([30.0, None, 10.0]) == 30.0
  assert loop_curves.median_time([30.0, None, None]) is None


def test_the_lr_pick_takes_the_best_final_pass_then_the_best_mean():
  tuned = {1e-4: {"curve": _curve((0, 0.2), (1, 0.9))}, 3e-4: {"curve": _curve((0, 0.6), (1, 0.9))},
           3e-5: {"curve": _curve((0, 0.2), (1, 0.5))}}
  assert loop_curves.pick_lr(tuned) == 3e-4
  assert loop_curves.pick_lr({}) is None


def test_a_result_from_our_run_directory(tmp_path):
  rows = [{"step": 0, "policy_eval/held_out/pass@1": 0.2}, {"step": 0, "time/loop_seconds": 5.0, "time/eval_seconds": 3.0},
          {"step": 0, "rollout/generations": 256.0, "rollout/response_length": 3.0},
          {"step": 0, "train/tokens": 400.0},
          {"step": 4, "rollout/generations": 256.0, "rollout/response_length": 2.0},
          {"step": 10, "policy_eval/held_out/pass@1": 0.6}, {"step": 10, "time/loop_seconds": 25.0, "time/eval_seconds": 6.0},
          {"step": 20, "eval/held_out/pass@1": 0.7, "time/loop_seconds": 40.0, "time/eval_seconds": 10.0},
          {"step": 20, "policy_eval/held_out/pass@1": 0.8}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  phases = {"trainer": {"waiting for samples": 3.0, "eval": 7.0}, "sampler": {"waiting for the trainer": 12.0}}
  (tmp_path / "summary.json").write_text(json.dumps({"phase_seconds": phases}))
  r = loop_curves.from_ours(str(tmp_path))
  assert [(p["step"], p["seconds"], p["pass@1"], p["generations"]) for p in r["curve"]] == [
      (0, 2.0, 0.2, 0), (10, 19.0, 0.6, 512), (20, 30.0, 0.8, 512)]
  assert r["run_seconds"] == 30.0 and r["eval_seconds"] == 10.0
  assert r["generated_tokens"] == 256 * 5 and r["trained_tokens"] == 400
  assert (r["trainer_wait_seconds"], r["sampler_wait_seconds"]) == (3.0, 5.0)  # 12 less the trainer's 7 of eval
  row = loop_curves.row("ours", 1e-4, [r])
  assert row["to 0.8"] == pytest.approx(30.0) and row["trainer waits"] == pytest.approx(0.1)
  assert "| ours | 0.0001 | 1 |" in loop_curves.markdown([row])


def test_the_benchmark_refuses_two_libraries_that_do_not_run_one_model(tmp_path, monkeypatch):
  """loop_bench.same_model compares our logits on the warm start with what Tunix's worker prints: equal logits pass,
  logits 0.5 apart at one position (Tunix 0.1.7's fixed rope_theta did 1.5) stop the benchmark, naming the file."""
  import subprocess
  import numpy as np
  from benchmarks import loop_bench
  from oapl_jax.models import decoder, hf
  from tests.hf_fixtures import make_hf_checkpoint
  warm = tmp_path / "warm"
  make_hf_checkpoint(warm, "qwen3", seed=0)
  transformers = pytest.importorskip("transformers")
  from oapl_jax.run import export
  from oapl_jax.tasks import arithmetic
  export.write_char_tokenizer(arithmetic.CharTokenizer(), str(warm), 64)
  data = tmp_path / "data.json"
  data.write_text(json.dumps({"held_out": [{"prompt": "25+78=", "answer": "103"}]}))
  tokens = transformers.PreTrainedTokenizerFast.from_pretrained(str(warm))("25+78=")["input_ids"]
  config, params = hf.load(str(warm))
  ours = np.asarray(decoder.logits(params, config, np.asarray([tokens], np.int32))[0])
  for shift, workdir in ((0.0, tmp_path / "same"), (0.5, tmp_path / "other")):
    theirs = ours.copy()
    theirs[-1, 0] += shift
    printed = json.dumps({"logits": theirs.tolist()})
    monkeypatch.setattr(loop_bench, "tunix_python", lambda: "python")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, printed, ""))
    workdir.mkdir()
    if shift:
      with pytest.raises(SystemExit, match="do not run one model"):
        loop_bench.same_model(str(workdir), str(warm), str(data))
    else:
      assert loop_bench.same_model(str(workdir), str(warm), str(data)) < 1e-6
    assert json.loads((workdir / "same_model.json").read_text())["tokens"] == tokens


def test_tunix_is_given_the_checkpoints_rope_theta_once_however_often_a_model_is_loaded():
  """tunix_worker.honour_rope_theta replaces the module global Tunix's Qwen3 attention calls (0.1.7 calls it without
  the config's theta) by one bound to the checkpoint's theta; loading a second checkpoint rebinds, never stacks."""
  import types
  from benchmarks import tunix_worker

  def apply_rope(inputs, positions, head_dim, rope_theta=1_000_000):  # Tunix 0.1.7's signature and default
    return rope_theta

  module = types.SimpleNamespace(apply_rope=apply_rope)
  assert module.apply_rope(None, None, head_dim=4) == 1_000_000
  tunix_worker.honour_rope_theta(module, 10_000.0)
  assert module.apply_rope(None, None, head_dim=4) == 10_000.0
  tunix_worker.honour_rope_theta(module, 500.0)
  assert module.apply_rope(None, None, head_dim=4) == 500.0 and module.apply_rope.tunix_original is apply_rope
