"""Trainer: sharded == single device, gradient accumulation == one batch, loss vs numpy, schedule."""
import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from oapl_jax import objectives, sections, parallel
from oapl_jax.models import api, decoder
from oapl_jax.models.lora import LoraSettings
from oapl_jax.models.qwen.config import QwenConfig
from benchmarks import train_bench
from oapl_jax.rl import trainer
from oapl_jax.rl.optim import OptimConfig, make_schedule

CONFIG = QwenConfig.tiny()


def _one_device_mesh():
  return parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1])


def _params(config=CONFIG, seed=0):
  params, _ = parallel.init_sharded(lambda: decoder.init_params(config, jax.random.PRNGKey(seed)),
                                    _one_device_mesh(), parallel.DEFAULT_RULES)
  return params


def _batch(B, G, T, seed=0, prompt_len=4, vocab=CONFIG.vocab_size):
  return train_bench.make_batch(B, G, T, vocab, seed=seed, prompt_len=prompt_len, min_response=1)


def _run(config, model_config, params, mesh, batches, loss_fn=None):
  model, layout = api.for_config(model_config), parallel.Layout(mesh)
  state = trainer.create_train_state(config, model, params, layout)
  step = trainer.make_train_step(config, model, layout, loss_fn=loss_fn)
  metrics = []
  for batch in batches:
    state, m = step(state, batch, jax.random.PRNGKey(0))
    metrics.append(jax.device_get(m))
  return state, metrics


def _assert_trees_close(a, b, atol):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=0), a, b)


TRAIN = trainer.TrainConfig(loss_settings=objectives.OAPLSettings(beta1=0.5, beta2=0.05), temperature=0.7,
                            optim=OptimConfig(lr=1e-3, eps=1e-6, weight_decay=0.01, max_grad_norm=1.0))


@pytest.mark.devices(8)
def test_sharded_step_matches_one_device():
  params = _params()
  batches = [_batch(4, 2, 16, seed=s) for s in (1, 2)]
  mesh8 = parallel.make_mesh((1, 4, 2))
  state1, metrics1 = _run(TRAIN, CONFIG, params, _one_device_mesh(), batches)
  state8, metrics8 = _run(TRAIN, CONFIG, params, mesh8, batches)

  emb = state8.params["embed"]["embedding"]
  assert emb.sharding.spec == P("tensor", "fsdp")
  assert len(emb.addressable_shards) == 8 and emb.addressable_shards[0].data.shape == (128, 16)
  moments = [x for x in jax.tree.leaves(state8.opt_state) if x.shape == emb.shape]
  assert len(moments) == 2 and all(m.sharding == emb.sharding for m in moments)  # mu, nu

  assert int(state8.step) == 2
  _assert_trees_close(state8.params, state1.params, atol=1e-5)
  moved = jax.tree.map(lambda a, b: np.max(np.abs(np.asarray(a) - np.asarray(b))), state8.params, params)
  assert min(jax.tree.leaves(moved)) > 1e-4  # every parameter actually took the steps
  for m1, m8 in zip(metrics1, metrics8):
    for name in ("loss", "grad_norm", "entropy", "token_log_ratio_mean", "seq_log_ratio_abs_mean"):
      np.testing.assert_allclose(m8[name], m1[name], rtol=1e-5, err_msg=name)


@pytest.mark.devices(8)
def test_gradient_accumulation_matches_one_batch():
  params = _params(seed=1)
  batch = _batch(16, 2, 16, seed=3)
  mesh8 = parallel.make_mesh((1, 4, 2))
  state_big, (m_big,) = _run(TRAIN, CONFIG, params, mesh8, [batch])
  accum = dataclasses.replace(TRAIN, micro_batches=4)
  state_acc, (m_acc,) = _run(accum, CONFIG, params, mesh8, [batch])
  _assert_trees_close(state_acc.params, state_big.params, atol=1e-5)
  for name in ("loss", "grad_norm", "tokens", "entropy", "token_log_ratio_abs_mean", "seq_log_ratio_mean"):
    np.testing.assert_allclose(m_acc[name], m_big[name], rtol=1e-5, err_msg=name)


def _reference(params, batch, temperature, beta1, beta2):
  """float64 numpy: per-token logp at temperature, entropy, and the OAPL loss (Eq. 2-3)."""
  B, G, T = batch["tokens"].shape
  logits = np.asarray(decoder.logits(params, CONFIG, batch["tokens"].reshape(B * G, T),
                                  batch["positions"].reshape(B * G, T)), np.float64) / temperature
  z = logits - logits.max(-1, keepdims=True)
  logq = z - np.log(np.exp(z).sum(-1, keepdims=True))
  logp = np.take_along_axis(logq, batch["targets"].reshape(B * G, T, 1), -1).reshape(B, G, T)
  entropy = -(np.exp(logq) * logq).sum(-1).reshape(B, G, T)
  mask = batch["response_mask"].astype(bool)
  seq_policy = np.where(mask, logp, 0).sum(-1)
  seq_sampler = np.where(mask, batch["sampler_token_logp"], 0).sum(-1).astype(np.float64)
  r = batch["rewards"].astype(np.float64)
  v = beta1 * np.log(np.mean(np.exp(r / beta1), axis=-1))
  loss = np.mean((beta2 * (seq_policy - seq_sampler) - (r - v[:, None])) ** 2)
  return np.where(mask, logp, 0), entropy[mask].mean(), loss


def test_first_loss_entropy_and_scores_match_numpy():
  params = _params(seed=2)
  batch = _batch(4, 3, 12, seed=4)
  logp_ref, entropy_ref, loss_ref = _reference(params, batch, 0.7, 0.5, 0.05)
  config = dataclasses.replace(TRAIN, micro_batches=2)
  mesh = _one_device_mesh()
  _, (metrics,) = _run(config, CONFIG, params, mesh, [batch])
  np.testing.assert_allclose(metrics["loss"], loss_ref, rtol=1e-5)
  np.testing.assert_allclose(metrics["entropy"], entropy_ref, rtol=1e-5)
  mask = batch["response_mask"].astype(bool)
  np.testing.assert_allclose(metrics["tokens"], mask.sum())
  np.testing.assert_allclose(metrics["token_log_ratio_mean"],
                             (logp_ref - batch["sampler_token_logp"])[mask].mean(), rtol=1e-5)
  logp = trainer.make_score_fn(config, api.for_config(CONFIG), parallel.Layout(mesh))(params, batch)
  np.testing.assert_allclose(np.asarray(logp), logp_ref, atol=1e-5)


def test_schedules():
  cosine = make_schedule(OptimConfig(lr=1e-3, schedule="cosine", warmup_ratio=0.1, min_ratio=0.05, total_steps=100))
  # warmup 10 steps linear from 0; cosine over steps 10..100 down to 0.05 * lr, then flat.
  for step, want in [(0, 0.0), (5, 5e-4), (10, 1e-3), (55, 1e-3 * (0.05 + 0.95 * 0.5)),
                     (100, 5e-5), (150, 5e-5)]:
    np.testing.assert_allclose(float(cosine(step)), want, rtol=1e-6, atol=1e-12, err_msg=f"step {step}")
  assert float(make_schedule(OptimConfig(lr=3e-4))(1234)) == pytest.approx(3e-4)
  with pytest.raises(ValueError, match="total_steps"):
    make_schedule(OptimConfig(schedule="cosine"))


def test_bf16_compute_keeps_float32_master_params():
  config = CONFIG.replace(dtype="bfloat16", param_dtype="float32")
  params = _params(config)
  state, (metrics,) = _run(TRAIN, config, params, _one_device_mesh(), [_batch(2, 2, 16, seed=5)])
  assert np.isfinite(metrics["loss"]) and np.isfinite(metrics["grad_norm"])
  chex.assert_trees_all_equal_dtypes(state.params, jax.tree.map(lambda p: p.astype(jnp.float32), params))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.opt_state) if x.ndim > 0)


def test_trainer_section_reads_the_chosen_loss_and_rejects_unknown_settings():
  cfg = sections.build(trainer.TrainConfig, ml_collections.ConfigDict(
      {"loss": "grpo", "micro_batches": 2, "optim": {"lr": 2e-6},
       "loss_settings": {"grpo": {"clip_eps": 0.3}, "oapl": {"beta2": 0.5}}}), "trainer")
  assert cfg.loss == "grpo" and cfg.micro_batches == 2 and cfg.optim.lr == 2e-6
  assert cfg.optim.b2 == 0.95 and cfg.optim.max_grad_norm == 1.0  # the trainer's defaults, from OptimConfig
  assert cfg.loss_settings == objectives.GRPOSettings(clip_eps=0.3)  # only the chosen loss's entry is read
  with pytest.raises(sections.ConfigError, match=r"trainer.loss_settings.oapl.clip_eps: unknown setting"):
    sections.build(trainer.TrainConfig, {"loss": "oapl", "loss_settings": {"oapl": {"clip_eps": 0.2}}}, "trainer")
  with pytest.raises(sections.ConfigError, match=r"trainer.optim.learning_rate: unknown setting"):
    sections.build(trainer.TrainConfig, {"optim": {"learning_rate": 1e-6}}, "trainer")


@pytest.mark.devices(8)
def test_one_prompt_per_micro_batch_spreads_its_sequences_and_matches_one_device():
  """2 prompts x 8 samples, 2 micro-batches of ONE prompt on 8 devices: the batch cannot be split by
  prompt, so the step spreads each micro-batch's 8 sequences; loss, metrics and update match one device."""
  params = _params(seed=3)
  batch = _batch(2, 8, 16, seed=6)
  config = dataclasses.replace(TRAIN, micro_batches=2)
  mesh8 = parallel.make_mesh((1, 8, 1))
  assert trainer.batch_sharding(parallel.Layout(mesh8), num_prompts=2).is_fully_replicated
  model, layout8 = api.for_config(CONFIG), parallel.Layout(mesh8)
  state8 = trainer.create_train_state(config, model, params, layout8)
  state8, m8 = trainer.make_train_step(config, model, layout8, num_prompts=2)(state8, batch, jax.random.PRNGKey(0))
  state1, (m1,) = _run(config, CONFIG, params, _one_device_mesh(), [batch])
  _assert_trees_close(state8.params, state1.params, atol=1e-5)
  for name in ("loss", "grad_norm", "entropy", "v_star_mean", "seq_log_ratio_mean"):
    np.testing.assert_allclose(m8[name], m1[name], rtol=1e-5, err_msg=name)


def test_blockwise_attention_trains_like_the_reference_path():
  """Three steps with the flash-style kernel (small blocks, so several q and kv blocks) vs the full-scores path."""
  params = _params(seed=4)
  batches = [_batch(2, 2, 24, seed=s) for s in (7, 8, 9)]
  mesh = _one_device_mesh()
  _, ref = _run(TRAIN, CONFIG.replace(attention="reference"), params, mesh, batches)
  _, blockwise = _run(TRAIN, CONFIG.replace(attention="blockwise", attention_block_q=8, attention_block_kv=8),
                      params, mesh, batches)
  for step, (a, b) in enumerate(zip(ref, blockwise)):
    for name in ("loss", "grad_norm", "entropy"):
      np.testing.assert_allclose(b[name], a[name], rtol=1e-5, err_msg=f"step {step} {name}")


def test_a_finite_blow_up_is_skipped_like_a_non_finite_update():
  """Issue 27.3: at lr 1e30 AdamW's first update is finite (~1e30 per weight) but would poison every later
  checkpoint; its norm is far beyond the params' own, so the step keeps the old state (update_skipped)."""
  mesh, params = _one_device_mesh(), _params()
  batch = _batch(2, 2, 12, seed=3)
  for lr in (1e30, 1e15):  # the update's norm overflows float32 / stays finite: skipped either way
    blown = dataclasses.replace(TRAIN, optim=OptimConfig(lr=lr))
    state, (metrics,) = _run(blown, CONFIG, params, mesh, [batch])
    assert metrics["update_norm"] > 1e10 * metrics["param_norm"] and metrics["update_skipped"] == 1.0
    _assert_trees_close(jax.device_get(state.params), jax.device_get(params), atol=0)  # untouched
  sane = dataclasses.replace(TRAIN, optim=OptimConfig(lr=1e-3))
  state, (metrics,) = _run(sane, CONFIG, params, mesh, [batch])
  assert metrics["update_skipped"] == 0.0 and 0 < metrics["update_norm"] < 0.1 * metrics["param_norm"]
  off = dataclasses.replace(blown, max_update_ratio=0.0)  # the guard off: the blow-up lands
  state, (metrics,) = _run(off, CONFIG, params, mesh, [batch])
  assert metrics["update_skipped"] == 0.0 and float(optax.tree.norm(state.params)) > 1e10


def test_grpo_second_mini_batch_of_a_round_is_clipped():
  """Off-by-one GRPO takes 2 mini-batches per update round, pi_old scored as the round starts: after the
  first update the ratio pi / pi_old leaves [0.8, 1.2] on some tokens, and the loss the second step
  reports is the clipped surrogate computed here by hand in numpy (not the unclipped one)."""
  config = trainer.TrainConfig(loss="grpo", loss_settings=objectives.GRPOSettings(clip_eps=0.2, tis_cap=2.0),
                               optim=OptimConfig(lr=3e-2, max_grad_norm=0.0), max_update_ratio=0.0)
  model, layout = api.for_config(CONFIG), parallel.Layout(_one_device_mesh())
  batch = _batch(4, 2, 16, seed=3)
  score = trainer.make_score_fn(config, model, layout)
  state = trainer.create_train_state(config, model, _params(), layout)
  batch["old_policy_token_logp"] = np.asarray(score(state.params, batch))  # pi_old: the round's start
  step = trainer.make_train_step(config, model, layout)
  state, first = step(state, batch, jax.random.PRNGKey(0))
  assert float(first["clip_fraction"]) == 0.0  # the round's first step: ratio 1 everywhere
  logp = np.asarray(score(state.params, batch), np.float64)
  _, second = step(state, batch, jax.random.PRNGKey(1))

  mask = batch["response_mask"] > 0
  ratio = np.exp(logp - batch["old_policy_token_logp"])
  r = batch["rewards"]
  adv = ((r - r.mean(-1, keepdims=True)) / (r.std(-1, ddof=1, keepdims=True) + 1e-6))[..., None]
  tis = np.minimum(np.exp(batch["old_policy_token_logp"] - batch["sampler_token_logp"]), 2.0)

  def loss_of(surrogate):
    per_seq = np.where(mask, -tis * surrogate, 0.0).sum(-1) / mask.sum(-1)
    return per_seq.mean()
  clipped = loss_of(np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv))
  unclipped = loss_of(ratio * adv)
  outside = mask & ((ratio < 0.8) | (ratio > 1.2))
  assert outside.sum() > 0 and float(second["clip_fraction"]) > 0.0
  np.testing.assert_allclose(float(second["loss"]), clipped, rtol=1e-4)
  assert abs(clipped - unclipped) > 1e-2  # the clip changed the loss: the test tells the two apart


def test_demo_slots_are_trained_by_nll_and_left_out_of_the_oapl_regression():
  """loop.demo_use='sft': loss = OAPL on the other samples (V* and mean over them only) + weight x the demo
  slots' token-mean NLL, each side computed here from the model's log-probs by the objectives alone."""
  params, model = _params(), api.for_config(CONFIG)
  batch = _batch(2, 4, 12, seed=5)
  batch["demo_slots"] = np.zeros((2, 4), np.float32)
  batch["demo_slots"][:, 3] = 1.0
  wrapped = objectives.with_demo_sft(functools.partial(objectives.compute_loss, TRAIN.loss), 0.5)  # the assembler's
  _, (metrics,) = _run(TRAIN, CONFIG, params, _one_device_mesh(), [batch], loss_fn=wrapped)
  logp = model.token_logprobs(params, batch["tokens"].reshape(8, 12), batch["targets"].reshape(8, 12),
                              batch["positions"].reshape(8, 12), temperature=TRAIN.temperature).reshape(2, 4, 12)
  mask = batch["response_mask"]
  seq = lambda x: objectives.sequence_logprob(x, mask)  # noqa: E731
  s = TRAIN.loss_settings
  rl, _ = objectives.oapl_loss(seq(logp)[:, :3], seq(batch["sampler_token_logp"])[:, :3], batch["rewards"][:, :3],
                               beta1=s.beta1, beta2=s.beta2)
  nll = -np.sum(np.asarray(logp)[:, 3] * mask[:, 3]) / mask[:, 3].sum()
  np.testing.assert_allclose(metrics["demo_nll"], nll, rtol=1e-5)
  np.testing.assert_allclose(metrics["loss"], float(rl) + 0.5 * nll, rtol=1e-5)
  full_rl, _ = objectives.oapl_loss(seq(logp), seq(batch["sampler_token_logp"]), batch["rewards"], beta1=s.beta1,
                                    beta2=s.beta2)
  assert abs(float(full_rl) - float(rl)) > 1e-4  # the slots would have changed the regression


def test_cpu_compile_options_reach_the_trainers_programs_and_fast_start_steps_alike(monkeypatch):
  """mesh.cpu_compile's XLA options reach the train step and the scorer (an unknown option fails their compile), and
  'fast_start' (fusion emitters off, LLVM at -O1) takes the same step as XLA's defaults, to float rounding."""
  monkeypatch.setenv("XLA_FLAGS", "")  # no flag of the environment's to win over the layout's (the suite sets -O0)
  mesh, model, batch = _one_device_mesh(), api.for_config(CONFIG), _batch(4, 2, 16, seed=5)
  stepped = {}
  for mode in ("fast_code", "fast_start"):
    layout = parallel.Layout(mesh, cpu_compile=mode)
    state = trainer.create_train_state(TRAIN, model, _params(), layout)
    state, metrics = trainer.make_train_step(TRAIN, model, layout)(state, batch, jax.random.PRNGKey(0))
    stepped[mode] = jax.device_get((state.params, metrics["loss"], metrics["grad_norm"]))
  assert parallel.Layout(mesh, cpu_compile="fast_start").compiler_options == parallel.CPU_COMPILE["fast_start"]
  assert parallel.Layout(mesh).compiler_options is None
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
  assert parallel.Layout(mesh, cpu_compile="fast_start").compiler_options == {"xla_cpu_use_fusion_emitters": False}
  monkeypatch.setenv("XLA_FLAGS", "")
  (params_code, *metrics_code), (params_fast, *metrics_fast) = stepped["fast_code"], stepped["fast_start"]
  np.testing.assert_allclose(metrics_code, metrics_fast, rtol=1e-5)  # the loss and gradient norm before the update
  _assert_trees_close(params_code, params_fast, atol=1e-5)  # lr 1e-3: Adam's step is ~1e-3 a weight
  monkeypatch.setitem(parallel.CPU_COMPILE, "bogus", {"xla_no_such_option": True})
  layout = parallel.Layout(mesh, cpu_compile="bogus")
  with pytest.raises(Exception, match="xla_no_such_option"):
    trainer.make_score_fn(TRAIN, model, layout)(_params(), batch)
  state = trainer.create_train_state(TRAIN, model, _params(), parallel.Layout(mesh))
  with pytest.raises(Exception, match="xla_no_such_option"):
    trainer.make_train_step(TRAIN, model, layout)(state, batch, jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="cpu_compile='fast'"):
    parallel.Layout(mesh, cpu_compile="fast")


def _shared_prompt_batch(B, G, T, seed, prompt_len=4):
  """_batch with one prompt per group, as the buffer's groups hold (tokens and targets are views of one array)."""
  batch = _batch(B, G, T, seed=seed, prompt_len=prompt_len)
  batch["tokens"][:, :, :prompt_len] = batch["tokens"][:, :1, :prompt_len]
  assert (batch["targets"][:, :, :prompt_len - 1] == batch["targets"][:, :1, :prompt_len - 1]).all()
  return batch


@pytest.mark.devices(8)
@pytest.mark.parametrize("loss, settings, rank", [("oapl", TRAIN.loss_settings, 0),
                                                  ("grpo", objectives.GRPOSettings(), 0),
                                                  ("oapl", TRAIN.loss_settings, 4)])
def test_prompts_shared_by_their_group_train_like_the_full_rows(loss, settings, rank):
  """trainer.share_prompts (each group packed into one row, its prompt run once) on 8 devices with 2
  micro-batches: the same losses, metrics and params (or LoRA adapters) as the full rows on one device."""
  batches = [_shared_prompt_batch(4, 4, 12, seed=s) for s in (1, 2)]
  full = dataclasses.replace(TRAIN, loss=loss, loss_settings=settings, lora=LoraSettings(rank=rank, alpha=8.0))
  shared = dataclasses.replace(full, share_prompts=True, longest_prompt=4, micro_batches=2)
  state_full, metrics_full = _run(full, CONFIG, _params(), _one_device_mesh(), batches)
  state_shared, metrics_shared = _run(shared, CONFIG, _params(), parallel.make_mesh((1, 4, 2)), batches)
  _assert_trees_close(state_shared.params, state_full.params, atol=2e-5)
  for want, got in zip(metrics_full, metrics_shared):
    for name in ("loss", "grad_norm", "entropy", "tokens", "seq_log_ratio_abs_mean"):
      np.testing.assert_allclose(got[name], want[name], rtol=1e-4, err_msg=name)


def test_shared_prompts_are_refused_where_the_step_is_made_without_a_kernel_reading_positions():
  model, layout = api.for_config(CONFIG.replace(attention="splash")), parallel.Layout(_one_device_mesh())
  shared = dataclasses.replace(TRAIN, share_prompts=True, longest_prompt=4)
  with pytest.raises(ValueError, match="reads positions"):
    trainer.make_train_step(shared, model, layout)
  with pytest.raises(ValueError, match="longest prompt is unknown"):
    trainer.make_score_fn(dataclasses.replace(shared, longest_prompt=0), api.for_config(CONFIG), layout)
