"""Demonstrations in the buffer (loop.demo_fraction): the sampler's score of a sequence is the log-prob it records
when it samples that sequence, mixed groups hold the prompt's own demonstrations rewarded by the task, and a
config that cannot give a demonstration a sampler log-prob is refused."""
import jax
import numpy as np
import pytest

from configs import arithmetic as arithmetic_config
from oapl_jax import objectives, parallel, sections
from oapl_jax.models import api, decoder
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.rl import buffer
from oapl_jax.rl.demo_mix import DemoMixer
from oapl_jax.run import assemble, check, schema
from oapl_jax.sampler import core, rollout
from oapl_jax.sampler.settings import SamplingSettings
from oapl_jax.tasks import arithmetic

CONFIG = QwenConfig.tiny().replace(vocab_size=32, max_position_embeddings=64)


@pytest.fixture(scope="module")
def sampler_and_params():
  params, _ = parallel.init_sharded(lambda: decoder.init_params(CONFIG, jax.random.PRNGKey(3)),
                                    parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1]), parallel.DEFAULT_RULES)
  sampler = core.Sampler(api.for_config(CONFIG), num_slots=8, max_prefill_length=16, max_new_tokens=6)
  sampler.refresh(params)
  return sampler, params


def test_scoring_a_sampled_response_gives_the_log_probs_the_sampler_recorded(sampler_and_params):
  sampler, params = sampler_and_params
  task = arithmetic.make_task(num_train=16, num_held_out=4)
  prompts = [p.prompt_tokens for p in task.train[:4]]
  groups = rollout.generate_groups(sampler, sampler.params, prompts, 3, SamplingSettings(max_new_tokens=6,
                                   temperature=0.8, stop_tokens=(task.tokenizer.eos_id,)), seed=5)
  pairs = [(p, g) for p in range(4) for g in range(3)]
  responses = [groups.response_tokens[p, g, :groups.lengths[p, g]] for p, g in pairs]
  scored = sampler.score(sampler.params, [prompts[p] for p, _ in pairs], responses, 0.8)
  for (p, g), logp in zip(pairs, scored):
    np.testing.assert_allclose(logp, groups.sampler_logp[p, g, :groups.lengths[p, g]], atol=2e-5, rtol=0)
  # and the trainer's independent forward (scanned layers, chunked projection) agrees
  model = api.for_config(CONFIG)
  seq = np.concatenate([prompts[0], responses[0]])[None].astype(np.int32)
  trainer_logp = model.token_logprobs(params, seq[:, :-1], seq[:, 1:], temperature=0.8)
  n = len(prompts[0])
  np.testing.assert_allclose(np.asarray(trainer_logp)[0, n - 1:], scored[0], atol=2e-5, rtol=0)


def test_mixed_groups_hold_the_prompts_demonstrations_rewarded_by_the_task(sampler_and_params):
  sampler, _ = sampler_and_params
  task = arithmetic.make_task(num_train=16, num_held_out=4, teacher_slip_rate=0.5)
  demos = task.demonstrations(0)
  mixer = DemoMixer.build(demos, fraction=0.25, group_size=4, temperature=1.0, max_new_tokens=6)
  assert mixer.per_group == 1
  problems = task.train[:5]
  groups = rollout.generate_groups(sampler, sampler.params, [p.prompt_tokens for p in problems], 4,
                                   SamplingSettings(max_new_tokens=6, stop_tokens=(task.tokenizer.eos_id,)), seed=1)
  sampled = groups.response_tokens.copy()
  slots = mixer.mix(sampler, groups, np.random.default_rng(0))
  assert slots == [(p, 3) for p in range(5)]
  np.testing.assert_array_equal(groups.response_tokens[:, :3], sampled[:, :3])  # the sampled ones untouched
  rewards, _ = task.score_groups(problems, groups.response_tokens, groups.lengths)
  for p, problem in enumerate(problems):
    demo = groups.response_tokens[p, 3, :groups.lengths[p, 3]]
    own = [d.completion_tokens for d in demos if tuple(d.prompt_tokens) == tuple(problem.prompt_tokens)]
    assert tuple(demo) in own and groups.response_mask[p, 3].sum() == len(demo)
    correct = task.tokenizer.decode(demo) == problem.answer + arithmetic.EOS
    assert rewards[p, 3] == float(correct)  # a slipped demonstration scores 0, like any wrong answer
    np.testing.assert_allclose(groups.sampler_logp[p, 3, :len(demo)],
                               sampler.score(sampler.params, [problem.prompt_tokens], [demo], 1.0)[0], atol=1e-6)


def test_demonstrations_need_unfiltered_rollouts():
  cfg = arithmetic_config.get_config("smoke")
  cfg.loop.demo_fraction = 0.25
  cfg.sampler.top_p = 0.9
  with pytest.raises(sections.ConfigError, match=r"loop.demo_fraction=0.25: needs unfiltered rollouts"):
    check.check(schema.from_config(cfg))


def test_as_sft_the_chunk_marks_the_replaced_slots_and_the_buffer_serves_them_with_their_groups(sampler_and_params):
  sampler, _ = sampler_and_params
  task = arithmetic.make_task(num_train=16, num_held_out=4, teacher_slip_rate=0.5)
  settings = SamplingSettings(max_new_tokens=6, stop_tokens=(task.tokenizer.eos_id,))
  problems = task.train[:3]
  groups = rollout.generate_groups(sampler, sampler.params, [p.prompt_tokens for p in problems], 4, settings, seed=2)
  in_buffer = DemoMixer.build(task.demonstrations(0), fraction=0.5, group_size=4, temperature=1.0, max_new_tokens=6)
  as_sft = DemoMixer.build(task.demonstrations(0), fraction=0.5, group_size=4, temperature=1.0, max_new_tokens=6,
                           as_sft=True)
  slots = as_sft.mix(sampler, groups, np.random.default_rng(0))
  assert in_buffer.chunk_fields(slots, groups) == {}
  fields = as_sft.chunk_fields(slots, groups)
  np.testing.assert_array_equal(fields["demo_slots"], [[0, 0, 1, 1]] * 3)
  rewards, _ = task.score_groups(problems, groups.response_tokens, groups.lengths)
  buf = buffer.RolloutBuffer(seq_len=16)
  buf.reset(groups.snapshot_version)
  assert buf.add(groups, rewards, fields)
  batch = buf.sample(3, 1, np.random.default_rng(1))
  np.testing.assert_array_equal(batch["demo_slots"], fields["demo_slots"])  # each row with its own group
  np.testing.assert_array_equal(batch["rewards"], rewards)


@pytest.mark.parametrize("change, message", [
    (dict(loss="grpo"), r"loop.demo_use='sft': 'sft' leaves the demonstrations out of the RL loss"),
    (dict(demo_fraction=0.0), r"loop.demo_use='sft': needs loop.demo_fraction > 0"),
    (dict(demo_fraction=0.95), r"loop.demo_fraction=0.95: with loop.demo_use='sft' leaves no sampled response"),
])
def test_demonstrations_by_sft_are_refused_where_they_cannot_work(change, message):
  cfg = arithmetic_config.get_config("smoke")
  cfg.loop.update(demo_fraction=change.get("demo_fraction", 0.25), demo_use="sft")
  cfg.trainer.loss = change.get("loss", "oapl")
  with pytest.raises(sections.ConfigError, match=message):
    check.check(schema.from_config(cfg))


@pytest.mark.parametrize("demo_use", ["sft", "buffer"])
def test_the_assembler_adds_the_demonstrations_nll_to_the_loss_only_for_sft(demo_use):
  """loop.demo_use='sft' wraps the trainer's loss (objectives/demo_sft.py): + weight x the demo slots' token-mean
  NLL, hand-computed here; 'buffer' leaves the loss as it is (the demonstrations are ordinary samples)."""
  cfg = arithmetic_config.get_config("smoke")
  cfg.loop.update(demo_fraction=0.25, demo_use=demo_use)
  cfg.trainer.demo_sft_weight = 0.5
  rc = schema.from_config(cfg)
  rng = np.random.default_rng(0)
  logp_BxGxT = -rng.exponential(size=(2, 4, 5)).astype(np.float32)
  batch = {"response_mask": (rng.random((2, 4, 5)) < 0.8).astype(np.float32), "rewards": rng.random((2, 4)),
           "sampler_token_logp": -rng.exponential(size=(2, 4, 5)).astype(np.float32),
           "demo_slots": np.array([[0, 0, 0, 1], [0, 1, 0, 0]], np.float32)}
  loss, metrics = assemble.loss_fn(rc)(logp_BxGxT, batch, rc.trainer.loss_settings)
  base, _ = objectives.compute_loss("oapl", logp_BxGxT, batch, rc.trainer.loss_settings)
  demo = batch["response_mask"] * batch["demo_slots"][..., None]
  nll = -np.sum(logp_BxGxT * demo) / demo.sum()
  want = float(base) + (0.5 * nll if demo_use == "sft" else 0.0)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  assert ("demo_nll" in metrics) == (demo_use == "sft")
