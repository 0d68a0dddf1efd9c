"""The OAPL loop end to end on CPU: a killed run resumes with the same metrics, a NaN stops the run with the last
good checkpoint kept, the summary; (slow) it learns and the buffer stays version-pure. What one step computes is
tests/golden_step_test.py's."""
import json
import os
import shutil
import types

import numpy as np
import pytest

from configs import arithmetic
from oapl_jax import reporting
from oapl_jax.run import assemble, schema
from oapl_jax.rl import loop, preemption
from oapl_jax.rl.buffer import RolloutBuffer
from oapl_jax.rl.monitors import HealthMonitor, MonitorConfig
from oapl_jax.sampler.scripted import fingerprint as scripted_fingerprint


def tiny_config(**loop_overrides):
  """configs/arithmetic.py shrunk: a smaller model, fewer prompts, short windows."""
  c = arithmetic.get_config()
  c.model.overrides.update(hidden_size=64, intermediate_size=256, head_dim=16)
  c.task.update(num_train=2048, num_held_out=64)
  c.warmstart.update(steps=1000, batch_size=64)
  c.sampler.update(num_slots=64, max_new_tokens=4)
  c.loop.update(sync_every=5, num_syncs=6, batch_prompts=8, prompts_per_rollout=16, group_size=8,
                steps_per_rollout=3, eval_every_syncs=3)
  c.loop.update(**loop_overrides)
  c.eval.update(num_prompts=64, samples=8, ks=(1, 4), max_new_tokens=4)
  c.checkpoint.every_syncs = 1
  return c


def fast_config(**loop_overrides):
  """A run of seconds: configs/arithmetic.py with a 1-layer model, a short warm start, windows of 2 steps."""
  c = tiny_config(**loop_overrides)
  c.model.overrides.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                           head_dim=16)
  c.task.update(num_train=256, num_held_out=16)
  c.warmstart.update(steps=20, batch_size=32)
  c.sampler.update(num_slots=32)
  c.loop.update(sync_every=2, batch_prompts=4, prompts_per_rollout=4, group_size=4, steps_per_rollout=1,
                eval_every_syncs=2)
  c.loop.update(**loop_overrides)
  c.eval.update(num_prompts=16, samples=2, ks=(1, 2))
  return c


def _history(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _buffer_versions(monkeypatch) -> list[tuple[int, set]]:
  """(the buffer's version, the versions it held) at every draw the trainer makes, filled as the run goes."""
  seen = []
  original_sample = RolloutBuffer.sample

  def spy(self, *args, **kwargs):
    batch = original_sample(self, *args, **kwargs)
    seen.append((self.version, self.versions()))
    return batch

  monkeypatch.setattr(RolloutBuffer, "sample", spy)
  return seen


@pytest.mark.slow
def test_loop_learns_and_buffer_holds_one_version(tmp_path, monkeypatch):
  seen_versions = _buffer_versions(monkeypatch)
  run = assemble.setup(tiny_config(), str(tmp_path))
  summary = loop.train(run)
  start, end = summary["eval/held_out/pass@1 (start)"], summary["eval/held_out/pass@1 (end)"]
  assert start <= 0.4 and end >= start + 0.3, (start, end)
  # Every batch came from a buffer holding exactly the current snapshot's groups.
  assert seen_versions and all(held == {current} for current, held in seen_versions)
  assert sorted({v for v, _ in seen_versions}) == list(range(1, 7))  # one refresh per window
  history = _history(str(tmp_path))
  lags = [h["train/policy_lag"] for h in history if "train/policy_lag" in h]
  assert max(lags) == 4 and min(lags) == 0  # L = 5: lag runs 0..4 inside every window
  for key in ("paths",):
    assert os.path.exists(summary[key]["curve"]) and os.path.exists(summary[key]["summary"])


def test_each_window_trains_on_its_own_snapshot_and_ends_in_a_checkpoint(tmp_path, monkeypatch):
  """The loop's contract, window by window, on the scripted sampler (no decoding): window k's rollouts come from
  snapshot k and every batch the trainer draws holds only that version; the snapshot is the trainer's params at
  the window's start; a checkpoint is saved at every window's end. (The JAX sampler's run of the same contract,
  which also learns: test_loop_learns_and_buffer_holds_one_version, slow.)"""
  seen = _buffer_versions(monkeypatch)
  config = fast_config(num_syncs=3)
  config.sampler.backend = "scripted"
  config.checkpoint.max_to_keep = 10
  run = assemble.setup(config, str(tmp_path))
  snapshots = []
  refresh = run.sampler.refresh

  def recording_refresh(params, **kw):
    out = refresh(params, **kw)
    snapshots.append((run.sampler.snapshot_version, int(run.state.step), scripted_fingerprint(out)))
    return out
  run.sampler.refresh = recording_refresh
  loop.train(run)
  assert seen and all(held == {current} for current, held in seen)
  assert [v for v, _ in seen] == [1, 1, 2, 2, 3, 3]  # L = 2: two draws per window, each from its snapshot
  training_calls = {v for v, _, ids in run.sampler.calls if v > 0}
  assert training_calls == {1, 2, 3, 4}  # windows 1-3, then the final eval's refresh (4)
  assert [(v, step) for v, step, _ in snapshots] == [(1, 0), (2, 2), (3, 4), (4, 6)]  # the params at each start
  assert len({f for _, _, f in snapshots}) == 4  # and they moved between windows
  steps = sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit())
  assert steps == [2, 4, 6]


@pytest.mark.parametrize("make_config, L, backend", [(fast_config, 2, "scripted"),
                                                     pytest.param(fast_config, 2, "jax", marks=pytest.mark.slow),
                                                     pytest.param(tiny_config, 5, "jax", marks=pytest.mark.slow)])
def test_resume_gives_the_same_metrics(tmp_path, make_config, L, backend):
  """With the scripted sampler (fast) the responses still depend on the snapshot, so a resume that restored the
  wrong sampler params, draws or data position gives other losses; the JAX sampler's runs are in `make test-all`."""
  config = make_config(num_syncs=3)
  config.sampler.backend = backend
  config.warmstart.steps = 20
  full = str(tmp_path / "full")
  loop.train(assemble.setup(config, full))
  killed = str(tmp_path / "killed")
  loop.train(assemble.setup(config, killed), max_windows=2)  # "killed" after 2 windows (checkpoints at L and 2L)
  assert not any(h["step"] >= 2 * L and "train/loss" in h for h in _history(killed))
  shutil.rmtree(os.path.join(killed, "checkpoints", str(2 * L), "meta"))  # the newest checkpoint is damaged
  loop.train(assemble.setup(config, killed))  # restart: falls back to step L and re-runs windows 2 and 3
  assert os.listdir(os.path.join(killed, "checkpoints", "damaged"))  # moved aside, not deleted

  def by_step(history, key):
    return {h["step"]: h[key] for h in history if key in h}

  for key in ("train/loss", "train/grad_norm", "rollout/reward_mean", "eval/held_out/pass@1"):
    want, got = by_step(_history(full), key), by_step(_history(killed), key)
    later = [s for s in want if s >= L]
    assert later, key
    np.testing.assert_array_equal([got[s] for s in later], [want[s] for s in later], err_msg=key)  # bit-identical
  # The re-run steps replaced the first attempt's points: every (step, metric) is logged once.
  logged = [(h["step"], k) for h in _history(killed) for k in h if k != "step" and not k.startswith("warmstart/")]
  assert len(logged) == len(set(logged))


def test_grpo_trained_on_arrival_skips_the_old_policy_scorer_and_learns_alike(tmp_path, monkeypatch):
  """One chunk of one batch a step (steps_per_rollout 1, prompts_per_rollout = batch_prompts): each group is trained
  once, by the step that first sees it, so pi_old is that step's params and the loss's stop_gradient(pi) replaces
  the scorer's forward. Forcing the scorer gives the same losses and gradients to float noise; two steps a chunk
  keep it."""
  from oapl_jax.rl import schedule, windows
  def run(workdir, **loop_overrides):
    config = fast_config(num_syncs=2, **loop_overrides)
    config.sampler.backend = "scripted"
    config.trainer.loss = "grpo"
    online = assemble.setup(config, str(tmp_path / workdir))
    scorers = [h for h in online.hooks if isinstance(h, windows.OldPolicyScorer)]
    loop.train(online)
    return len(scorers), {h["step"]: (h["train/loss"], h["train/grad_norm"]) for h in _history(tmp_path / workdir)
                          if "train/loss" in h}
  scorers, skipped = run("on_arrival")
  assert scorers == 0 and len(skipped) == 4
  monkeypatch.setattr(schedule.LoopConfig, "trains_each_group_on_arrival", property(lambda self: False))
  scorers, scored = run("scored")
  assert scorers == 1 and sorted(scored) == sorted(skipped)
  np.testing.assert_allclose([scored[s] for s in sorted(scored)], [skipped[s] for s in sorted(skipped)], rtol=1e-4,
                             atol=1e-6)
  monkeypatch.undo()
  assert run("twice", steps_per_rollout=2, prompts_per_rollout=8)[0] == 1


def test_nan_loss_stops_with_clear_error_and_keeps_checkpoint(tmp_path):
  config = fast_config(num_syncs=1)
  config.warmstart.steps = 0
  workdir = str(tmp_path)
  loop.train(assemble.setup(config, workdir))
  checkpoints_before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  config.loop.num_syncs = 3
  config.trainer.optim.lr = 1e30  # blows the parameters up
  with pytest.raises(FloatingPointError, match=r"loss became .* at trainer step \d+.*last good checkpoint \(step 2\)"):
    loop.train(assemble.setup(config, workdir, allow_config_changes=True))  # a changed resume must be allowed
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == checkpoints_before


def _stopped_run(workdir, loss):
  """What loop._finish reads of a run stopped after 1 of 3 windows (no final eval), with a real Reporter; its
  settings as run/assemble makes them from a config with `loss`."""
  ns = types.SimpleNamespace
  config = tiny_config(num_syncs=3)
  config.trainer.loss = loss
  return ns(settings=assemble.loop_settings(schema.from_config(config)), hooks=[],
            meta=ns(syncs_done=1, snapshot_version=1), sampler=ns(snapshot_version=1),
            monitor=HealthMonitor(MonitorConfig()),
            reporter=reporting.Reporter(workdir, total_steps=15), checkpointer=ns(directory="checkpoints"))


def test_the_summary_is_titled_with_the_runs_loss(tmp_path):
  for loss in ("grpo", "oapl"):
    run = _stopped_run(str(tmp_path / loss), loss)
    loop._finish(run, 5, preemption.StopFlag())  # pylint: disable=protected-access
    run.reporter.close()
    with open(tmp_path / loss / "summary.md") as f:
      assert f.readline() == f"# {loss.upper()} run summary\n"


def test_the_summary_counts_failed_rewards_over_the_kept_history(tmp_path):
  def summary_json(run):
    loop._finish(run, 5, preemption.StopFlag())  # pylint: disable=protected-access
    run.reporter.close()
    with open(os.path.join(run.reporter.workdir, "summary.json")) as f:
      return json.load(f)

  run = _stopped_run(str(tmp_path / "none"), "oapl")
  run.reporter.scalars(0, {"rollout/reward_mean": 0.5, "rollout/reward_failures": 0.0})
  assert summary_json(run)["reward_failures"] == 0
  run = _stopped_run(str(tmp_path / "some"), "oapl")
  for step, failed in ((0, 2.0), (2, 0.0), (4, 3.0), (6, 7.0)):
    run.reporter.scalars(step, {"rollout/reward_failures": failed, "train/loss": 0.1})
  run.reporter.resume_from(5)  # a restart from step 5 re-runs (and will re-count) step 6's rollouts
  assert summary_json(run)["reward_failures"] == 5


def _tensorboard_points(directory):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  return sorted((e.step, v.tag) for name in os.listdir(directory) if name.startswith("events.out.tfevents")
                for e in tf.compat.v1.train.summary_iterator(os.path.join(directory, name)) for v in e.summary.value)


def test_a_restart_logs_every_step_once_with_or_without_a_checkpoint(tmp_path):
  """Issue 27.5: an attempt killed before its first checkpoint is set aside when the run starts afresh; a
  resume from step S keeps what was logged before S."""
  def attempt(resume_at=None, loss=0.5):
    reporter = reporting.Reporter(str(tmp_path), total_steps=10)
    if resume_at is not None:
      reporter.resume_from(resume_at)
    else:
      reporter.scalars(0, {"warmstart/loss": 2.0})
    for step in range(resume_at or 0, 3):
      reporter.scalars(step, {"sampler/refresh_seconds": 0.1, "train/loss": loss + step})
    reporter.close()
    return reporter.history()

  killed = attempt()  # killed before a checkpoint: the restart (no checkpoint) warm-starts and logs step 0 again
  fresh = attempt(loss=0.25)
  logged = [(h["step"], k) for h in fresh for k in h if k != "step"]
  assert sorted(logged) == sorted(set(logged)) and len(logged) == 7
  assert [h["train/loss"] for h in fresh if "train/loss" in h] == [0.25, 1.25, 2.25]
  assert _tensorboard_points(tmp_path) == sorted(logged)
  assert _history(str(tmp_path / "earlier-attempt-1")) == killed  # set aside, not lost
  assert _tensorboard_points(tmp_path / "earlier-attempt-1") == sorted(logged)
  resumed = attempt(resume_at=2, loss=0.75)  # restored from a checkpoint at step 2: steps 2.. are re-run
  assert [h["train/loss"] for h in resumed if "train/loss" in h] == [0.25, 1.25, 2.75]
  assert _tensorboard_points(tmp_path) == sorted(logged)
  assert not os.path.exists(tmp_path / "earlier-attempt-2")
