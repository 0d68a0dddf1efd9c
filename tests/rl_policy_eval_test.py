"""The current policy evaluated every N trainer steps whatever the lag (rl/policy_eval.py), the entropy probe,
off-by-one sampling (loop.sampler_delay_windows) and the on-policy loss's refusal of a lag."""
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import arithmetic
from oapl_jax import sections
from oapl_jax.rl import loop
from oapl_jax.run import assemble, check, schema


def _config(**loop_fields):
  c = arithmetic.get_config("smoke")
  c.warmstart.steps = 0
  c.eval.update(num_prompts=4, samples=2, ks=(1, 2), every_steps=3)
  c.loop.update(batch_prompts=4, prompts_per_rollout=8, steps_per_rollout=2, **loop_fields)
  return c


def _history(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_probe_scores_the_params_it_is_given(tmp_path):
  run = assemble.setup(_config(sync_every=2, num_syncs=1), str(tmp_path))
  try:
    params = run.state.params
    first, again = run.policy_eval(params), run.policy_eval(params)
    assert first == again  # the run's eval seed: the same params give the same draws
    assert {"policy_eval/held_out/pass@1", "policy_eval/held_out/token_entropy"} <= set(first)
    shifted = jax.tree.map(lambda x: x * 1.5, params)
    assert run.policy_eval(shifted)["policy_eval/held_out/token_entropy"] != first["policy_eval/held_out/token_entropy"]
    # every logit 0 (all-zero params): the full-distribution entropy is ln V at every token, by hand
    zeros = jax.tree.map(jnp.zeros_like, params)
    uniform = run.policy_eval(zeros)["policy_eval/held_out/token_entropy"]
    assert uniform == pytest.approx(math.log(run.model.config.vocab_size), rel=1e-5)
    assert run.sampler.params is None or run.sampler.snapshot_version == 0  # the lagged snapshot untouched
  finally:
    run.task.close()
    run.checkpointer.close()
    run.reporter.close()


def test_eval_grid_ignores_the_lag_and_off_by_one_samples_the_previous_window(tmp_path):
  """L = 2, eval every 3 steps: points at 0, 3 and the end (6), which no window start gives. With
  sampler_delay_windows = 1 the snapshot of window w is the params at the start of window w - 1."""
  cfg = _config(sync_every=2, num_syncs=3, sampler_delay_windows=1)
  cfg.trainer.loss = "sft"  # params move whatever the rewards (a smoke run without warm start scores 0)
  run = assemble.setup(cfg, str(tmp_path))
  refreshed = []
  refresh = run.sampler.refresh
  run.sampler.refresh = lambda params: refreshed.append(float(sum(jnp.sum(x) for x in jax.tree.leaves(params)))) \
      or refresh(params)
  loop.train(run)
  steps = [h["step"] for h in _history(tmp_path) if "policy_eval/held_out/pass@1" in h]
  assert steps == [0, 3, 6]
  windows = refreshed[:3]  # the final refresh (the end's eval) takes the trained params
  assert windows[1] == windows[0]  # window 1 samples from window 0's start
  assert windows[2] != windows[1] and refreshed[3] != windows[2]  # window 2 from window 1's start; the end's


def test_on_policy_loss_refuses_a_lag():
  for fields in (dict(sync_every=2), dict(sync_every=1, sampler_delay_windows=1)):
    cfg = _config(**fields)
    cfg.trainer.loss = "grpo_onpolicy"
    with pytest.raises(sections.ConfigError, match=r"loop.sync_every=.*on-policy loss 'grpo_onpolicy'"):
      check.check(schema.from_config(cfg))
  cfg = _config(sync_every=1)
  cfg.trainer.loss = "grpo_onpolicy"
  check.check(schema.from_config(cfg))
