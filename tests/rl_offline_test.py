"""Offline mode: the rollout store round-trips exactly and resumes, the filter, stored batches give the online
step's loss, and the two stages chained from configs/code.py:smoke (shrunk further)."""
import dataclasses
import importlib
import os

import jax
import numpy as np
import pytest

from oapl_jax import parallel
from oapl_jax.models import api
from oapl_jax.models.families import preset
from oapl_jax import sections
from oapl_jax.rl import offline, preemption, trainer
from oapl_jax.run import assemble
from oapl_jax.rl.buffer import RolloutBuffer, pack_groups
from oapl_jax.rl.rollout_store import RolloutStore, StoreHeader, take_groups
from oapl_jax.sampler import api as sampler_api, core, rollout
from oapl_jax.sampler.settings import SamplingSettings
from oapl_jax.tasks.base import Problem

SETTINGS = SamplingSettings(max_new_tokens=6, temperature=1.0, stop_tokens=(2,))


def _header(**changes) -> StoreHeader:
  values = dict(task="t", stage=1, snapshot_version=1, policy_step=0, group_size=3, num_prompts=5, chunk_prompts=3,
                seed=7, settings=SETTINGS)
  return StoreHeader(**{**values, **changes})


def _groups(P: int, seed: int) -> tuple[sampler_api.RolloutGroups, np.ndarray, list[Problem]]:
  """Random rollout groups as the sampler leaves them: zero past each length, varied prompt lengths."""
  rng = np.random.default_rng(seed)
  prompts = [list(rng.integers(3, 50, rng.integers(1, 5))) for _ in range(P)]
  out = sampler_api.RolloutGroups.empty(prompts, 3, SETTINGS, snapshot_version=1, seed=int(rng.integers(1000)))
  out.lengths[:] = rng.integers(0, 7, (P, 3))
  live = np.arange(6) < out.lengths[..., None]
  out.response_tokens[live] = rng.integers(0, 64, live.sum())
  out.sampler_logp[live] = -rng.exponential(size=live.sum()).astype(np.float32)
  out.response_mask[:] = live
  out.finish_reason[:] = rng.integers(1, 3, (P, 3))
  out.wall_seconds, out.num_tokens, out.num_decode_calls, out.num_prefill_calls = rng.random(), 17, 4, 2
  rewards = rng.choice([0.0, 1.0, 0.25], (P, 3)).astype(np.float32)
  problems = [Problem(f"prompt {seed}.{i} ✓", f'{{"answer": {i}}}', tuple(p)) for i, p in enumerate(prompts)]
  return out, rewards, problems


def test_store_round_trips_every_array_and_field(tmp_path):
  store = RolloutStore.create_or_resume(str(tmp_path / "s"), _header())
  written = []
  for chunk, P in ((0, 3), (1, 2)):
    groups, rewards, problems = _groups(P, seed=chunk)
    responses = [[f"r{p}{g}\n<eos>" for g in range(3)] for p in range(P)]
    store.write_chunk(chunk, groups, rewards, problems, [10 * chunk + p for p in range(P)], responses, num_failed=chunk,
                      num_timeout=2)
    written.append((groups, rewards, problems, responses))
  reopened = RolloutStore.open(str(tmp_path / "s"))
  assert reopened.header == _header() and reopened.complete
  for chunk, (groups, rewards, problems, responses) in enumerate(written):
    back = reopened.read_chunk(chunk)
    for field in dataclasses.fields(groups):
      want, got = getattr(groups, field.name), getattr(back.groups, field.name)
      if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, field.name
        np.testing.assert_array_equal(got, want, err_msg=field.name)
        if want.dtype == np.float32:  # bit for bit, not just equal
          np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
      else:
        assert got == want, field.name
    np.testing.assert_array_equal(back.rewards_PxG, rewards)
    np.testing.assert_array_equal(reopened.read_rewards(chunk), rewards)
    np.testing.assert_array_equal(back.prompt_indices, [10 * chunk + p for p in range(len(problems))])
    assert back.prompts == [p.prompt for p in problems] and back.answers == [p.answer for p in problems]
    assert back.responses == responses and (back.num_failed, back.num_timeout) == (chunk, 2)


def test_store_resumes_after_the_last_whole_chunk_and_refuses_another_header(tmp_path):
  directory = str(tmp_path / "s")
  store = RolloutStore.create_or_resume(directory, _header())
  groups, rewards, problems = _groups(3, seed=0)
  store.write_chunk(0, groups, rewards, problems, [0, 1, 2], [["x"] * 3] * 3)
  with open(store.chunk_path(1) + ".tmp", "wb") as f:  # a write killed half way
    f.write(b"PAR1 half a file")
  resumed = RolloutStore.create_or_resume(directory, _header())
  assert (resumed.num_complete, resumed.complete) == (1, False)
  with pytest.raises(ValueError, match="out of order"):
    resumed.write_chunk(2, *_groups(2, seed=1)[:1], rewards[:2], problems[:2], [3, 4], [["x"] * 3] * 2)
  groups1, rewards1, problems1 = _groups(2, seed=1)
  resumed.write_chunk(1, groups1, rewards1, problems1, [3, 4], [["x"] * 3] * 2)
  assert resumed.complete and not os.path.exists(store.chunk_path(1) + ".tmp")
  np.testing.assert_array_equal(resumed.read_chunk(1).groups.response_tokens, groups1.response_tokens)
  with pytest.raises(ValueError, match="policy_step: 0 on disk, 5 now"):
    RolloutStore.create_or_resume(directory, _header(policy_step=5))
  with pytest.raises(ValueError, match="do not match the store's header"):
    RolloutStore.create_or_resume(str(tmp_path / "t"), _header(group_size=4)).write_chunk(
        0, groups, rewards, problems, [0, 1, 2], [["x"] * 3] * 3)


def test_filter_drops_exactly_the_groups_without_a_correct_sample():
  rewards = np.array([[0, 0, 0], [0, 1, 0], [1, 1, 1], [0.4, 0.5, 0.0], [0.6, 0.0, 0.0], [1, 0, 1]], np.float32)
  np.testing.assert_array_equal(offline.keep_groups(rewards), [0, 1, 1, 0, 1, 1])  # correct: reward > 0.5
  np.testing.assert_array_equal(offline.keep_groups(rewards, drop_all_correct=True), [0, 1, 0, 0, 1, 1])
  np.testing.assert_array_equal(offline.keep_groups(rewards, drop_all_wrong=False), [1] * 6)


def test_stage_batches_visit_every_kept_group_once_per_epoch(tmp_path):
  store = RolloutStore.create_or_resume(str(tmp_path / "s"), _header())
  chunks = [_groups(3, seed=0), _groups(2, seed=1)]
  for c, (groups, rewards, problems) in enumerate(chunks):
    rewards[:] = [[1, 0, 0], [0, 0, 0], [0, 1, 1]][:len(rewards)] if c == 0 else [[0, 0, 0], [1, 1, 1]]
    store.write_chunk(c, groups, rewards, problems, list(range(3 * c, 3 * c + len(problems))), [["x"] * 3] * len(problems))
  keep = [offline.keep_groups(store.read_rewards(c)) for c in range(2)]
  assert [k.tolist() for k in keep] == [[True, False, True], [False, True]]
  batches = list(offline.stage_batches(store, keep, batch_prompts=2, epochs=4, seed=(0, 1), seq_len=12))
  assert len(batches) == 4 * 3 // 2 and all(b["tokens"].shape == (2, 3, 12) for b in batches)
  kept = [pack_groups(take_groups(chunks[c][0], [p]), chunks[c][1][[p]], 12) for c, p in ((0, 0), (0, 2), (1, 1))]
  seen = [next(k for k, group in enumerate(kept) if all(np.array_equal(b[key][i], group[key][0]) for key in group))
          for b in batches for i in range(2)]
  assert sorted(seen) == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]  # each kept group once per epoch, nothing else
  assert seen[:3] != seen[3:6] or seen[6:9] != seen[9:]  # and not in one fixed order every epoch


@pytest.fixture(scope="module")
def tiny():
  model = api.for_config(preset("tiny", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                                num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=64))
  layout = parallel.Layout.single_device()
  params = model.init_params(jax.random.PRNGKey(0))
  sampler = core.Sampler(model, layout=layout, num_slots=8, max_prefill_length=8, max_new_tokens=6)
  sampler.refresh(params)
  return model, layout, params, sampler


def test_stored_batch_gives_the_online_steps_loss(tiny, tmp_path):
  model, layout, params, sampler = tiny
  prompts = [[1, 5, 6, 7], [1, 9], [1, 4, 4, 4, 4]]
  groups = rollout.generate_groups(sampler, sampler.params, prompts, 3, SETTINGS, seed=3)
  rewards = np.array([[1, 0, 0], [0, 1, 1], [1, 1, 0]], np.float32)
  config = trainer.TrainConfig(temperature=1.0)
  step_fn = trainer.make_train_step(config, model, layout, 3)
  # online: the loop's buffer, as loop.train feeds the step
  buffer = RolloutBuffer(seq_len=10)
  buffer.reset(groups.snapshot_version)
  assert buffer.add(groups, rewards)
  online = buffer.sample(3, 1, np.random.default_rng(0))
  online.pop("reuse"), online.pop("version")
  _, online_metrics = step_fn(trainer.create_train_state(config, model, params, layout), online, jax.random.PRNGKey(0))
  # offline: through the Parquet store and the stage's batches
  store = RolloutStore.create_or_resume(str(tmp_path / "s"), _header(num_prompts=3, snapshot_version=groups.snapshot_version))
  problems = [Problem(str(p), "", tuple(p)) for p in prompts]
  store.write_chunk(0, groups, rewards, problems, [0, 1, 2], [["x"] * 3] * 3)
  (batch,) = offline.stage_batches(store, [np.ones(3, bool)], batch_prompts=3, epochs=1, seed=(0, 1), seq_len=10)
  order = [next(i for i in range(3) if np.array_equal(batch["tokens"][j], online["tokens"][i])) for j in range(3)]
  assert sorted(order) == [0, 1, 2]
  for key, value in online.items():
    np.testing.assert_array_equal(batch[key], value[order], err_msg=key)
  _, offline_metrics = step_fn(trainer.create_train_state(config, model, params, layout), batch, jax.random.PRNGKey(0))
  assert float(online_metrics["loss"]) > 0
  np.testing.assert_allclose(float(offline_metrics["loss"]), float(online_metrics["loss"]), rtol=1e-6)
  np.testing.assert_allclose(float(offline_metrics["grad_norm"]), float(online_metrics["grad_norm"]), rtol=1e-5)


def test_offline_config_refuses_bad_sections():
  with pytest.raises(ValueError, match="one entry per stage"):
    offline.OfflineConfig(stages=2, prompts=(0,), epochs=(1, 4))
  with pytest.raises(sections.ConfigError, match="offline.lag: unknown setting"):
    sections.build(offline.OfflineConfig, {"stages": 1, "prompts": (0,), "epochs": (1,), "lag": 3}, "offline")


@pytest.mark.slow
def test_two_stages_chained_from_the_smoke_config(tmp_path):
  c = importlib.import_module("configs.code").get_config("smoke")
  c.task.update(num_train=16, num_held_out=4)
  c.model.overrides.update(hidden_size=32, intermediate_size=64, num_layers=1)
  c.warmstart.steps = 0  # an untrained model: every sample is wrong, hence the filter off below
  c.eval.update(num_prompts=4, samples=2, ks=(1, 2), max_new_tokens=8)
  c.sampler.update(max_new_tokens=8, num_slots=16)
  c.offline.update(prompts=(8, 4), epochs=(1, 2), chunk_prompts=4, drop_all_wrong=False)
  summary = offline.run_stages(assemble.setup(c, str(tmp_path)), str(tmp_path))
  assert summary["stage 1/steps"] == 1 and summary["stage 2/steps"] == 1 and summary["trainer_steps"] == 2
  assert {f"eval/held_out/pass@1 after stage {s}" for s in (0, 1, 2)} <= set(summary)
  for stage, (chunks, version, policy_step) in {1: (2, 1, 0), 2: (1, 2, 1)}.items():
    store = RolloutStore.open(offline.stage_dir(str(tmp_path), stage))
    assert store.complete and store.header.num_chunks == chunks
    assert (store.header.snapshot_version, store.header.policy_step) == (version, policy_step)
  again = offline.run_stages(assemble.setup(c, str(tmp_path)), str(tmp_path))  # every stage trained: evaluates the final policy only
  assert again["trainer_steps"] == 2 and "stage 1/steps" not in again
  assert again["eval/held_out/pass@1 after stage 2"] == summary["eval/held_out/pass@1 after stage 2"]


def _two_stages():
  c = importlib.import_module("configs.code").get_config("smoke")
  c.task.update(num_train=16, num_held_out=4)
  c.model.overrides.update(hidden_size=32, intermediate_size=64, num_layers=1)
  c.warmstart.steps = 0
  c.sampler.backend = "scripted"  # the stop's bookkeeping does not depend on decoding
  c.eval.update(num_prompts=4, samples=2, ks=(1, 2), max_new_tokens=8)
  c.sampler.update(max_new_tokens=8, num_slots=16)
  c.offline.update(prompts=(8, 4), epochs=(1, 2), chunk_prompts=4, drop_all_wrong=False)
  return c


@pytest.mark.parametrize("cut_call, cut", [(0, "the eval after stage 0"), (2, None)])  # the first eval; stage 1's 2nd chunk
def test_a_stop_in_an_eval_or_a_chunk_cuts_it_and_the_same_command_goes_on_equal(tmp_path, cut_call, cut):
  """A stop asked for inside the sampler's `cut_call`-th generate call (0: the eval before stage 1; 1, 2: stage 1's
  chunks) ends that call (sampler/api.Interrupted); running the stages again gives the uninterrupted summary."""
  full = offline.run_stages(assemble.setup(_two_stages(), str(tmp_path / "full")), str(tmp_path / "full"))
  run, stop, calls = assemble.setup(_two_stages(), str(tmp_path / "cut")), preemption.StopFlag(), []
  generate = run.sampler.generate

  def generate_after_stop(*args, **kw):
    if len(calls) == cut_call:
      stop.request("SIGTERM")
    calls.append(1)
    return generate(*args, **kw)
  run.sampler.generate = generate_after_stop
  stopped = offline.run_stages(run, str(tmp_path / "cut"), stop)
  assert stopped["stopped_by"] == "SIGTERM" and stopped.get("cut") == cut and "stage 1/steps" not in stopped
  if cut is None:  # the chunk before the cut one is kept
    assert RolloutStore.open(offline.stage_dir(str(tmp_path / "cut"), 1)).num_complete == 1
  again = offline.run_stages(assemble.setup(_two_stages(), str(tmp_path / "cut")), str(tmp_path / "cut"))
  assert "stopped_by" not in again and "cut" not in again
  results = lambda s: {k: v for k, v in s.items() if "pass@" in k or k.endswith(("/steps", "trainer_steps"))}  # noqa: E731
  assert results(again) == results(full) and len(results(full)) >= 8
