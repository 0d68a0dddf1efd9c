"""Run health: non-finite updates are skipped by the train step and stop the run when they repeat;
divergence and collapse warn."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oapl_jax import objectives, parallel
from benchmarks import train_bench
from oapl_jax.models import api
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.rl import trainer
from oapl_jax.rl.monitors import DivergenceError, HealthMonitor, MonitorConfig


def test_a_non_finite_reward_skips_the_update_and_keeps_the_state():
  model, layout = api.for_config(QwenConfig.tiny()), parallel.Layout.single_device()
  params, _ = parallel.init_sharded(lambda: model.init_params(jax.random.PRNGKey(0)), layout.mesh, layout.rules)
  config = trainer.TrainConfig(loss_settings=objectives.OAPLSettings(beta1=0.5, beta2=0.1))
  state = trainer.create_train_state(config, model, params, layout)
  before = jax.device_get(state.params)
  step = trainer.make_train_step(config, model, layout)
  batch = train_bench.make_batch(2, 2, 12, 256, seed=1, prompt_len=3, min_response=1)
  poisoned = dict(batch, rewards=np.where(np.arange(4).reshape(2, 2) == 3, np.nan, batch["rewards"]).astype(np.float32))
  state, metrics = step(state, poisoned, jax.random.PRNGKey(0))
  assert float(metrics["update_skipped"]) == 1.0 and not np.isfinite(float(metrics["loss"]))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), before)  # untouched
  assert int(state.step) == 1
  state, metrics = step(state, batch, jax.random.PRNGKey(0))  # a clean batch updates again
  assert float(metrics["update_skipped"]) == 0.0
  moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), jax.device_get(state.params), before)
  assert max(jax.tree.leaves(moved)) > 0
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(state.params)))


def test_a_nan_weight_no_token_reads_still_skips_the_update():
  """The guard reads norms, not every entry: a NaN in an input-embedding row no token of the batch looks up leaves
  the loss and every gradient finite, and only the params' norm sees it. The step is skipped, state untouched."""
  model = api.for_config(QwenConfig.tiny(tie_word_embeddings=False))
  layout = parallel.Layout.single_device()
  params, _ = parallel.init_sharded(lambda: model.init_params(jax.random.PRNGKey(0)), layout.mesh, layout.rules)
  batch = train_bench.make_batch(2, 2, 12, 256, seed=1, prompt_len=3, min_response=1)
  unread = int(np.setdiff1d(np.arange(256), batch["tokens"])[0])
  params["embed"]["embedding"] = params["embed"]["embedding"].at[unread, 0].set(jnp.nan)
  config = trainer.TrainConfig(loss_settings=objectives.OAPLSettings(beta1=0.5, beta2=0.1))
  state = trainer.create_train_state(config, model, params, layout)
  before = jax.device_get(state.params)
  state, metrics = trainer.make_train_step(config, model, layout)(state, batch, jax.random.PRNGKey(0))
  assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
  assert np.isnan(float(metrics["param_norm"])) and float(metrics["update_skipped"]) == 1.0
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), before)

def test_repeated_skips_stop_with_a_clear_error():
  monitor = HealthMonitor(MonitorConfig(max_skipped_updates=3))
  monitor.observe(0, {"loss": 0.5, "update_skipped": 0.0}, None)
  monitor.observe(1, {"loss": float("nan"), "update_skipped": 1.0}, None)
  assert monitor.diverging
  monitor.observe(2, {"loss": 0.4, "update_skipped": 0.0}, None)  # a good step resets the run
  assert not monitor.diverging
  monitor.observe(3, {"loss": float("inf"), "update_skipped": 1.0}, 40)
  monitor.observe(4, {"loss": float("nan"), "update_skipped": 1.0}, 40)
  with pytest.raises(DivergenceError, match=r"loss became nan at trainer step 5.*3 updates in a row.*"
                                            r"last good checkpoint \(step 40\)"):
    monitor.observe(5, {"loss": float("nan"), "update_skipped": 1.0}, 40)
  assert monitor.summary()["health/skipped_updates"] == 4


def test_explosion_collapse_and_no_signal_warn(caplog):
  monitor = HealthMonitor(MonitorConfig(loss_explosion_factor=100, entropy_floor=1e-3, no_signal_steps=3))
  for s in range(6):
    monitor.observe(s, {"loss": 1e-3, "entropy": 1.0, "frac_groups_all_equal_reward": 0.5}, None)
  assert not monitor.summary()
  monitor.observe(6, {"loss": 1.0, "entropy": 1e-5, "frac_groups_all_equal_reward": 1.0}, None)
  for s in (7, 8):
    monitor.observe(s, {"loss": 1e-3, "entropy": 1.0, "frac_groups_all_equal_reward": 1.0}, None)
  assert monitor.summary() == {"health/entropy_collapse": 1, "health/loss_explosion": 1, "health/no_signal": 1}
  assert "over 100x the recent median" in caplog.text and "collapsed" in caplog.text and "equal rewards" in caplog.text


def test_reward_failures_warn_then_stop(caplog):
  from oapl_jax.rl.monitors import check_reward_failures
  config = MonitorConfig(max_reward_failure_fraction=0.5)
  check_reward_failures(0, 16, config, "chunk 0")
  check_reward_failures(8, 16, config, "chunk 1")  # half failed: warned, scored 0, the run goes on
  assert "chunk 1: 8 of 16 rewards failed" in caplog.text
  with pytest.raises(RuntimeError, match="chunk 2: 9 of 16 rewards failed"):
    check_reward_failures(9, 16, config, "chunk 2")


def _explosions(losses, factor=1e4):
  monitor = HealthMonitor(MonitorConfig(loss_explosion_factor=factor))
  for step, loss in enumerate(losses):
    monitor.observe(step, {"loss": loss}, None)
  return monitor.summary().get("health/loss_explosion", 0)


def test_a_signed_loss_around_zero_is_no_explosion_but_a_jump_is():
  grpo_like = [-0.02, 0.03, -0.01, 0.0, 0.025, -0.015, 0.0, 0.0, 0.03, -0.02, 0.01, 0.0, 0.0, 0.0, 0.03, -0.02]
  assert _explosions(grpo_like) == 0  # a negative median, zeros (no-signal steps) and sign flips are no jump
  assert _explosions(grpo_like + [1e3]) == 1
  assert _explosions([0.01, 0.012, 0.009, 0.011, 0.01, 0.01, 1e3]) == 1  # a positive (squared) loss jumps too
  assert _explosions([0.01, 0.012, 0.009, 0.011, 0.01, 0.01, 50.0]) == 0  # 5000x: under the default 1e4x
  # a window's first steps on groups with equal rewards: rounding noise, no scale (a study's sorting task warned
  # "loss 0.0342 is over 10000x the recent median magnitude 1.05e-10" on its first signal)
  assert _explosions([1e-14, 3e-12, 1e-10, 2e-13, 5e-11, 1e-10, 0.0342]) == 0
  assert _explosions([1e-14, 3e-12, 1e-10, 0.01, 0.012, 0.009, 0.011, 0.01, 1e3]) == 1


def test_cut_off_responses_and_a_zero_reward_window_warn_once_per_window(caplog):
  from oapl_jax.rl.monitors import RolloutChecks
  checks = RolloutChecks(MonitorConfig(max_truncated_fraction=0.5), max_new_tokens=8)
  with caplog.at_level("WARNING"):
    checks.chunk(0, 0, 1.0, np.zeros((2, 4)))
    checks.chunk(0, 1, 0.75, np.zeros((2, 4)))
    checks.window_end(0)
    checks.chunk(1, 0, 0.5, np.array([[0, 1.0], [0, 0]]))  # at the threshold, not over; one reward: a signal
    checks.window_end(1)
  cut = [r.message for r in caplog.records if "hit the token budget" in r.message]
  assert len(cut) == 1 and "window 0, chunk 0: 100%" in cut[0] and "sampler.max_new_tokens=8" in cut[0]
  zero = [r.message for r in caplog.records if "was 0" in r.message]
  assert len(zero) == 1 and "window 0" in zero[0]


def test_run_notes_say_what_a_run_never_checked_or_always_had():
  from oapl_jax.rl.monitors import run_notes
  config = MonitorConfig(no_signal_steps=20, max_truncated_fraction=0.5)
  history = [{"step": s, "rollout/truncated_fraction": 1.0, "rollout/reward_mean": 0.0} for s in range(4)]
  notes = run_notes(history, 4, config)
  assert set(notes) == {"health/not checked", "health/cut off", "health/zero reward"}
  assert "4 trainer steps are fewer than monitors.no_signal_steps=20" in notes["health/not checked"]
  assert notes["health/cut off"].startswith("100%")
  healthy = [{"step": s, "rollout/truncated_fraction": 0.1, "rollout/reward_mean": 0.5} for s in range(40)]
  assert run_notes(healthy, 40, config) == {}


def test_a_near_zero_warm_start_nll_reads_as_memorised(caplog):
  from oapl_jax.rl import warmstart
  config = warmstart.WarmStartConfig(steps=10, batch_size=2, memorised_nll=0.005)
  with caplog.at_level("WARNING"):
    assert warmstart.warn_if_memorised(0.0024, config)  # the chain task's first warm start
    assert not warmstart.warn_if_memorised(0.075, config)  # its second, calibrated one
  assert sum("memorised" in r.message for r in caplog.records) == 1
