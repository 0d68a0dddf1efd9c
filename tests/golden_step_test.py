"""One online step and one offline step of a tiny configs/arithmetic.py run against recorded metrics (nanodo's
test_train_step): any change to what a step computes (sampling, rewards, the buffer's draw, the loss, the update,
the eval) moves a number here, whichever refactor did it; and a short warm start against its recorded NLL.

The steps start from a recorded warm start (tests/data/golden_warm_start.npz: the tiny model after 120 supervised
steps at lr 1e-2, so rewards are mixed), not from one computed here: those 120 steps grow a difference of an ulp,
such as another CPU's matmul order or another XLA:CPU emitter's tanh, to 1e-2 in the NLL and other held-out samples
(an Intel Xeon and an AMD EPYC disagreed there at the same commit), while one step from the same params moves by
float noise only. The warm start's own numerics are checked over 10 steps from the random init, short enough that
the same noise stays in float noise.

The values were recorded on the 2-core CPU host with the suite's compiler settings (tests/conftest.py) by running
this file with GOLDEN_RECORD=1, which writes the warm start's params and prints the metrics instead of checking
them. A change that means to change numerics re-records them deliberately, in its own commit, saying why; a refactor
that moves one is a bug.
"""
import json
import os

import jax
import numpy as np
import pytest

from configs import arithmetic
from oapl_jax.rl import loop, offline
from oapl_jax.run import assemble, policy, schema

RTOL, ATOL = 1e-5, 1e-6  # ATOL: values at float noise (the sampler's and trainer's log-probs differ by ~1e-7)
# Adam's first update divides each gradient entry by its own size, so entries at float noise (|g| near eps) move the
# update's norm, and the policy after it, by up to 8e-4 relative under another codegen (XLA:CPU held to AVX2 with
# LLVM's optimizer on: a proxy for another CPU, checked at the recording); the metrics read after the update have
# this tolerance, the ones read before it (sampling, rewards, the loss, its gradient) RTOL
AFTER_UPDATE_RTOL = 2e-3
RECORD = bool(os.environ.get("GOLDEN_RECORD"))
WARM_PARAMS = os.path.join(os.path.dirname(__file__), "data", "golden_warm_start.npz")

# metrics.jsonl after one online step (window of L = 1), keyed "metric@step"
ONLINE = {
    'buffer/groups@0': 4.0,
    'buffer/reuse_mean@0': 1.0,
    'eval/held_out/pass@1@0': 0.125,
    'eval/held_out/pass@1@1': 0.125,
    'eval/held_out/pass@2@0': 0.25,
    'eval/held_out/pass@2@1': 0.25,
    'eval/held_out/response_length@0': 2.25,
    'eval/held_out/response_length@1': 2.25,
    'eval/held_out/reward_failures@0': 0.0,
    'eval/held_out/reward_failures@1': 0.0,
    'eval/held_out/reward_mean@0': 0.125,
    'eval/held_out/reward_mean@1': 0.125,
    'eval/held_out/sequence_entropy@0': 0.751713216304779,
    'eval/held_out/sequence_entropy@1': 0.762209415435791,
    'eval/held_out/truncated_fraction@0': 0.0,
    'eval/held_out/truncated_fraction@1': 0.0,
    'policy_eval/held_out/pass@1@0': 0.125,
    'policy_eval/held_out/pass@1@1': 0.125,
    'policy_eval/held_out/pass@2@0': 0.25,
    'policy_eval/held_out/pass@2@1': 0.25,
    'policy_eval/held_out/response_length@0': 2.25,
    'policy_eval/held_out/response_length@1': 2.25,
    'policy_eval/held_out/reward_failures@0': 0.0,
    'policy_eval/held_out/reward_failures@1': 0.0,
    'policy_eval/held_out/reward_mean@0': 0.125,
    'policy_eval/held_out/reward_mean@1': 0.125,
    'policy_eval/held_out/sequence_entropy@0': 0.751713216304779,
    'policy_eval/held_out/sequence_entropy@1': 0.762209415435791,
    'policy_eval/held_out/token_entropy@0': 0.5369609594345093,
    'policy_eval/held_out/token_entropy@1': 0.527955174446106,
    'policy_eval/held_out/truncated_fraction@0': 0.0,
    'policy_eval/held_out/truncated_fraction@1': 0.0,
    'rollout/frac_groups_all_equal_reward@0': 0.25,
    'rollout/generations@0': 16.0,
    'rollout/response_length@0': 2.4375,
    'rollout/reward_failures@0': 0.0,
    'rollout/reward_mean@0': 0.25,
    'rollout/snapshot_version@0': 1.0,
    'rollout/truncated_fraction@0': 0.0,
    'sampler/refresh_bytes@0': 45568.0,
    'train/advantage_abs_max@0': 0.7168903946876526,
    'train/advantage_mean@0': -0.1678372472524643,
    'train/advantage_std@0': 0.407010555267334,
    'train/entropy@0': 0.5376666188240051,
    'train/frac_groups_all_equal_reward@0': 0.25,
    'train/grad_norm@0': 7.326494216918945,
    'train/learning_rate@0': 9.999999747378752e-05,
    'train/log_ratio_abs_mean@0': 5.62518835067749e-07,
    'train/log_ratio_mean@0': -1.1175870895385742e-08,
    'train/loss@0': 0.19382703304290771,
    'train/param_norm@0': 15.053136825561523,
    'train/policy_lag@0': 0.0,
    'train/residual_mean@0': 0.1678372472524643,
    'train/residual_std@0': 0.40701067447662354,
    'train/reward_mean@0': 0.25,
    'train/seq_log_ratio_abs_mean@0': 5.720939952880144e-07,
    'train/seq_log_ratio_mean@0': -8.061761036515236e-09,
    'train/token_log_ratio_abs_mean@0': 3.1198112537822453e-07,
    'train/token_log_ratio_mean@0': -3.3073892513613146e-09,
    'train/tokens@0': 39.0,
    'train/update_norm@0': 0.010330208577215672,
    'train/update_skipped@0': 0.0,
    'train/v_star_mean@0': 0.4178372621536255,
}

# metrics.jsonl after stage 1 of offline mode: its generation and its one trainer step
OFFLINE = {
    'offline/generate/frac_groups_all_wrong@0': 0.75,
    'offline/generate/response_length@0': 2.75,
    'offline/generate/reward_mean@0': 0.125,
    'offline/stage@0': 1.0,
    'train/advantage_abs_max@0': 0.7168903946876526,
    'train/advantage_mean@0': -0.05422259867191315,
    'train/advantage_std@0': 0.2670585513114929,
    'train/entropy@0': 0.5160335898399353,
    'train/frac_groups_all_equal_reward@0': 0.75,
    'train/grad_norm@0': 3.8818700313568115,
    'train/learning_rate@0': 0.0001,
    'train/log_ratio_abs_mean@0': 5.923211574554443e-07,
    'train/log_ratio_mean@0': 4.0978193283081055e-08,
    'train/loss@0': 0.07426030933856964,
    'train/param_norm@0': 15.053136825561523,
    'train/residual_mean@0': 0.05422262102365494,
    'train/residual_std@0': 0.26705843210220337,
    'train/reward_mean@0': 0.125,
    'train/seq_log_ratio_abs_mean@0': 5.80010237172246e-07,
    'train/seq_log_ratio_mean@0': 3.544846549630165e-08,
    'train/token_log_ratio_abs_mean@0': 3.270741331107274e-07,
    'train/token_log_ratio_mean@0': 1.2890351008820744e-08,
    'train/tokens@0': 44.0,
    'train/update_norm@0': 0.010303287766873837,
    'train/update_skipped@0': 0.0,
    'train/v_star_mean@0': 0.17922259867191315,
}


def _tiny(variant: str = ""):
  """configs/arithmetic.py shrunk: a 1-layer model, a short warm start (so rewards are mixed), 8 eval prompts."""
  c = arithmetic.get_config(variant)
  c.model.overrides.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                           head_dim=16)
  c.task.update(num_digits=1, num_train=64, num_held_out=8)
  c.warmstart.update(steps=120, batch_size=32)
  c.warmstart.optim.lr = 1e-2
  c.sampler.update(num_slots=32)
  c.loop.update(sync_every=1, num_syncs=1, batch_prompts=4, prompts_per_rollout=4, group_size=4, steps_per_rollout=1)
  c.eval.update(num_prompts=8, samples=2, ks=(1, 2))
  return c


def _metrics(workdir, keep) -> dict:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {f"{k}@{row['step']}": v for row in rows for k, v in row.items() if k != "step" and keep(k)}


def _numeric(key: str) -> bool:
  return not any(word in key for word in ("seconds", "per_second", "wall", "throughput"))


def _stepped(key: str) -> bool:  # the steps' metrics (the warm start's are replaced by the recorded params)
  return _numeric(key) and not key.startswith("warmstart/")


def _rtol(key: str) -> float:  # evals at step 1 and the update's norm read the policy after its first update
  return AFTER_UPDATE_RTOL if key.endswith("@1") or key.startswith("train/update_norm") else RTOL


def _check(got: dict, want: dict) -> None:
  if RECORD:
    print("\n".join(f"    {k!r}: {v!r}," for k, v in sorted(got.items())))
    pytest.skip("GOLDEN_RECORD: printed, not checked")
  moved = []
  for key, value in want.items():
    if key not in got:
      moved.append(f"  {key}: recorded {value!r}, now missing")
    elif abs(got[key] - value) > _rtol(key) * abs(value) + ATOL:
      moved.append(f"  {key}: recorded {value!r}, now {got[key]!r} (moved by {got[key] - value:+.3g}, "
                   f"{(got[key] - value) / value if value else float('inf'):+.2e} relative)")
  assert not moved, ("a step's numerics moved; a refactor must not change them (if this change means to, "
                     "re-record with GOLDEN_RECORD=1 in its own commit and say why):\n" + "\n".join(moved))


# a warm start of 10 steps from the random init: its NLL before the last step, and its params' sum of squares
WARM = {
    'params_sum_of_squares@10': 143.82488045711858,
    'warmstart/nll@9': 1.8723033666610718,
}


def _by_path(tree) -> dict:
  return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.fixture
def recorded_warm_start(monkeypatch):
  """assemble.warm_start gives the recorded params (module docstring); with GOLDEN_RECORD it runs and writes them."""
  real = assemble.warm_start

  def warm_start(rc, task, model, params, layout, seq, log, **kwargs):
    if RECORD:
      params = real(rc, task, model, params, layout, seq, log, **kwargs)
      os.makedirs(os.path.dirname(WARM_PARAMS), exist_ok=True)
      np.savez(WARM_PARAMS, **{k: np.asarray(v) for k, v in _by_path(params).items()})
      return params
    with np.load(WARM_PARAMS) as saved:
      if set(saved.files) != set(_by_path(params)):
        raise AssertionError(f"{WARM_PARAMS} holds another parameter tree ({sorted(saved.files)[:3]}...) than the "
                             f"model's ({sorted(_by_path(params))[:3]}...): re-record it (module docstring)")
      return jax.tree_util.tree_map_with_path(
          lambda path, leaf: jax.device_put(saved[jax.tree_util.keystr(path)].astype(leaf.dtype), leaf.sharding),
          params)
  monkeypatch.setattr(assemble, "warm_start", warm_start)


def test_ten_warm_start_steps():
  c = _tiny()
  c.warmstart.steps = 10
  rc = schema.from_config(c)
  task = assemble.build_task(rc)
  got = {}
  try:
    warmed = policy.warm_started(rc, task, lambda step, m: got.update({f"{k}@{step}": v for k, v in m.items()
                                                                       if _numeric(k)}))
  finally:
    task.close()
  got["params_sum_of_squares@10"] = float(sum(np.sum(np.square(np.asarray(x), dtype=np.float64))
                                              for x in jax.tree.leaves(warmed.params)))
  assert set(got) == {"warmstart/nll@9", "params_sum_of_squares@10"}
  _check(got, WARM)


@pytest.mark.usefixtures("recorded_warm_start")
def test_one_online_step(tmp_path):
  c = _tiny()
  c.eval.every_steps = 1  # the policy probe (a step hook) at step 0 and at the end
  run = assemble.setup(c, str(tmp_path))
  summary = loop.train(run)
  assert summary["finished"] and summary["trainer_steps"] == 1
  _check(_metrics(tmp_path, _stepped), ONLINE)


@pytest.mark.usefixtures("recorded_warm_start")
def test_one_offline_step(tmp_path):
  c = _tiny()
  c.offline = dict(stages=1, prompts=(4,), epochs=(1,), chunk_prompts=4, drop_all_wrong=False)
  run = assemble.setup(c, str(tmp_path))
  try:
    offline.ensure_start_checkpoint(run)
    offline.generate_stage(run, _offline_section(c), 1, str(tmp_path))
    stats = offline.train_stage(run, _offline_section(c), 1, str(tmp_path))
  finally:
    offline.close(run)
  assert stats["steps"] == 1
  _check(_metrics(tmp_path, _stepped), OFFLINE)


def _offline_section(c) -> offline.OfflineConfig:
  return offline.OfflineConfig(**{k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in c.offline.items()})
