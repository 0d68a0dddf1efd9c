"""Adaptive lag (loop.refresh_drift): a window ends after the step following one whose drift from the sampler
passed the threshold, L = sync_every bounds it, the step budget is kept, and a resumed run is identical."""
import json
import os

import pytest

from oapl_jax import sections
from oapl_jax.rl import loop, windows
from oapl_jax.rl.schedule import LoopConfig
from oapl_jax.run import assemble
from tests.loop_test import tiny_config

L, BUDGET_WINDOWS, THRESHOLD = 6, 3, 0.05


def _config():
  config = tiny_config(sync_every=L, num_syncs=BUDGET_WINDOWS, steps_per_rollout=1, prompts_per_rollout=8,
                       refresh_drift=THRESHOLD, eval_every_syncs=100)
  config.warmstart.steps = 20
  config.trainer.optim.lr = 1e-3
  config.checkpoint.every_syncs = 1
  return config


def _history(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _windows_by_hand(drifts: list[float], budget: int) -> list[int]:
  """The rule, applied to the logged drifts: from a window's first step w, end after step t + 1 for the first
  t >= w with drift[t] > THRESHOLD (t + 1 inside the window and the budget), else after L steps."""
  starts, w = [], 0
  while w < budget:
    starts.append(w)
    end = min(w + L, budget)
    for t in range(w, end - 1):
      if drifts[t] > THRESHOLD:
        end = t + 2
        break
    w = end
  return starts


@pytest.mark.slow  # a whole run; fast: the window policy's rules below and preemption_test's resume inside a window
def test_windows_end_where_the_logged_drift_says_and_resume_is_identical(tmp_path):
  full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
  summary = loop.train(assemble.setup(_config(), full))
  history = _history(full)
  drifts = {h["step"]: h["train/seq_log_ratio_abs_mean"] for h in history if "train/seq_log_ratio_abs_mean" in h}
  budget = L * BUDGET_WINDOWS
  assert sorted(drifts) == list(range(budget)) and summary["trainer_steps"] == budget  # the step budget, kept
  refreshes = sorted(h["step"] for h in history if "sampler/refresh_seconds" in h)
  assert refreshes == _windows_by_hand([drifts[t] for t in range(budget)], budget)
  lengths = [b - a for a, b in zip(refreshes, refreshes[1:] + [budget])]
  assert max(lengths) <= L and min(lengths[:-1]) < L, lengths  # some window ended early, none outlived L
  lags = {h["step"]: h["train/policy_lag"] for h in history if "train/policy_lag" in h}
  assert all(lags[t] == t - max(r for r in refreshes if r <= t) for t in range(budget))
  generated = sum(h.get("rollout/generations", 0) for h in history)
  trained_chunks = budget  # one chunk of 8 prompts x 8 per step
  assert trained_chunks * 64 <= generated <= (trained_chunks + len(refreshes)) * 64  # at most 1 chunk wasted a window

  loop.train(assemble.setup(_config(), killed), max_windows=2)
  loop.train(assemble.setup(_config(), killed))
  losses = lambda h: {x["step"]: x["train/loss"] for x in h if "train/loss" in x}  # noqa: E731
  assert losses(_history(killed)) == losses(history)


def test_an_adaptive_lag_with_a_delayed_sampler_is_a_config_error():
  with pytest.raises(sections.ConfigError, match="refresh_drift=0.1: an adaptive lag needs loop.sampler_delay_windows=0"):
    sections.build(LoopConfig, {"refresh_drift": 0.1, "sampler_delay_windows": 1}, "loop")


def test_a_window_saved_inside_resumes_to_the_length_its_policy_says():
  """The resume rule is the window policy's (rl/windows.py), not the loop's: an adaptive window whose last saved
  step asked to end runs one more step; a fixed or delayed one, and an adaptive one that was not asked, its length."""
  adaptive = windows.AdaptiveWindows(0.1, "train/drift")
  assert adaptive.resumed_length(50, 7, ended_last=True) == 8
  assert adaptive.resumed_length(50, 7, ended_last=False) == 50
  for policy in (windows.FixedWindows(), windows.DelayedWindows()):
    assert policy.resumed_length(50, 7, ended_last=True) == 50
