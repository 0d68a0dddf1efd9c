"""LoRA (models/lora.py, trainer.lora): merged weights equal peft's merge, the adapters' gradients are the
full gradient's projections, and a LoRA run checkpoints only adapters, resumes exactly and exports merged."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch

from oapl_jax import checkpoint_files, objectives, parallel, sections
from oapl_jax.models import api, decoder, hf, lora
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.rl import loop, trainer
from oapl_jax.rl.optim import OptimConfig
from oapl_jax.run import assemble, check, policy, schema
from benchmarks import train_bench
from tests import hf_fixtures
from tests.loop_test import tiny_config


def _ours_from_peft(peft_model, settings: lora.LoraSettings, config: QwenConfig) -> dict:
  """peft's lora_A [r, in] / lora_B [out, r] per layer -> our A [L, in..., r] / B [L, r, out...]."""
  H, K, D, E = config.num_heads, config.num_kv_heads, config.head_dim, config.hidden_size
  in_shape = {"o_proj": (H, D)}
  out_shape = {"q_proj": (H, D), "k_proj": (K, D), "v_proj": (K, D), "o_proj": (E,), "down_proj": (E,)}
  layers = peft_model.base_model.model.model.layers
  tree: dict = {"layers": {}}
  for name in settings.targets:
    group, module = ("attn", "self_attn") if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else ("mlp", "mlp")
    a, b = [], []
    for layer in layers:
      proj = getattr(getattr(layer, module), name)
      wa, wb = proj.lora_A["default"].weight.detach().numpy(), proj.lora_B["default"].weight.detach().numpy()
      a.append(wa.T.reshape(*in_shape.get(name, (wa.shape[1],)), settings.rank))
      b.append(wb.T.reshape(settings.rank, *out_shape.get(name, (wb.shape[0],))))
    tree["layers"].setdefault(group, {})[name] = {"lora_a": np.stack(a), "lora_b": np.stack(b)}
  return tree


def test_merge_equals_peft_merge_and_unload(tmp_path):
  settings = lora.LoraSettings(rank=4, alpha=8.0, targets=lora.PROJECTIONS)
  torch_model = hf_fixtures.make_hf_checkpoint(tmp_path / "base", seed=3)
  torch.manual_seed(0)  # init_lora_weights=False: B random too, so the merge is not a no-op
  peft_model = peft.get_peft_model(torch_model, peft.LoraConfig(
      r=settings.rank, lora_alpha=settings.alpha, target_modules=list(settings.targets), lora_dropout=0.0,
      init_lora_weights=False))
  config, base = hf.load(str(tmp_path / "base"))
  adapters = _ours_from_peft(peft_model, settings, config)
  peft_model.merge_and_unload().save_pretrained(str(tmp_path / "merged"))
  _, want = hf.load(str(tmp_path / "merged"))

  got = lora.merge(settings, api.for_config(config), base, adapters)
  flat = lambda tree: {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}  # noqa: E731
  got, want, base = flat(got), flat(want), flat(base)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], atol=2e-6, rtol=0, err_msg=name)
  moved = sorted(name for name in want if not np.array_equal(want[name], base[name]))
  assert len(moved) == len(lora.PROJECTIONS) and all(name.endswith("['kernel']") for name in moved)


def _setup(settings: lora.LoraSettings):
  config = QwenConfig.tiny()
  model, layout = api.for_config(config), parallel.Layout(parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1]))
  params, _ = parallel.init_sharded(lambda: decoder.init_params(config, jax.random.PRNGKey(0)), layout.mesh, layout.rules)
  cfg = trainer.TrainConfig(loss_settings=objectives.OAPLSettings(beta1=0.5, beta2=0.05), lora=settings,
                            optim=OptimConfig(lr=1e-2, max_grad_norm=0.0))
  return cfg, model, layout, params


def test_adapter_gradients_are_the_full_gradients_projections_and_only_adapters_train():
  settings = lora.LoraSettings(rank=2, alpha=4.0, targets=("q_proj", "o_proj", "up_proj"))
  cfg, model, layout, params = _setup(settings)
  batch = train_bench.make_batch(2, 4, 12, model.config.vocab_size, seed=1, prompt_len=4, min_response=1)
  state = trainer.create_train_state(cfg, model, params, layout, jax.random.PRNGKey(7))
  assert jax.tree.structure(state.params) == jax.tree.structure(lora.init_adapters(settings, model, params,
                                                                                   jax.random.PRNGKey(0)))
  mu = state.opt_state[0].mu  # AdamW's first moment: adapter-shaped, nothing of the base
  assert jax.tree.map(jnp.shape, mu) == jax.tree.map(jnp.shape, state.params)

  # The reference: full fine-tuning's gradient dW at the same (merged = base) weights, projected by hand:
  # W' = W + s A B  =>  dL/dA = s dW B^T = 0 (B = 0 at init), dL/dB = s A^T dW.
  full_cfg = trainer.TrainConfig(loss_settings=cfg.loss_settings, optim=cfg.optim)
  grads_W = jax.grad(lambda p: trainer._loss_and_sums(full_cfg, model, p, batch)[0])(params)
  s, expected_sq = settings.scale, 0.0
  for group, name in (("attn", "q_proj"), ("attn", "o_proj"), ("mlp", "up_proj")):
    dW = np.asarray(grads_W["layers"][group][name]["kernel"], np.float64)
    A = np.asarray(state.params["layers"][group][name]["lora_a"], np.float64)
    n_in = A.ndim - 2
    dW2 = dW.reshape(dW.shape[0], int(np.prod(dW.shape[1:1 + n_in])), -1)
    dB = s * np.einsum("lir,lio->lro", A.reshape(A.shape[0], -1, settings.rank), dW2)
    expected_sq += float(np.sum(dB ** 2))
  base_before = jax.tree.map(np.asarray, state.frozen)
  full_loss = float(trainer._loss_and_sums(full_cfg, model, params, batch)[0])

  step = trainer.make_train_step(cfg, model, layout)
  state, metrics = step(state, batch, jax.random.PRNGKey(0))
  assert float(metrics["loss"]) == pytest.approx(full_loss, rel=1e-6)  # B = 0: the merged model is the base
  assert float(metrics["grad_norm"]) == pytest.approx(np.sqrt(expected_sq), rel=1e-4)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state.frozen), base_before)
  merged = trainer.make_policy_params(cfg, model, layout)(state)
  moved = merged["layers"]["attn"]["q_proj"]["kernel"] - params["layers"]["attn"]["q_proj"]["kernel"]
  assert float(jnp.abs(moved).max()) > 1e-4  # the adapters' step reaches the policy the sampler gets
  np.testing.assert_array_equal(merged["layers"]["attn"]["k_proj"]["kernel"], params["layers"]["attn"]["k_proj"]["kernel"])


def test_bad_lora_settings_are_config_errors():
  with pytest.raises(sections.ConfigError, match=r"trainer.lora.targets.*must be"):
    sections.build(trainer.TrainConfig, {"lora": {"rank": 4, "targets": ["qproj"]}}, "trainer")
  with pytest.raises(sections.ConfigError, match=r"trainer.lora.rank=-1"):
    sections.build(trainer.TrainConfig, {"lora": {"rank": -1}}, "trainer")
  from configs import code  # the offline mode rebuilds full params between its stages
  cfg = code.get_config("smoke")
  cfg.trainer.lora.rank = 4
  with pytest.raises(sections.ConfigError, match="trainer.lora.rank=4: LoRA is not supported by the offline"):
    check.check(schema.from_config(cfg))


def test_a_rank_at_or_above_a_layers_width_is_a_config_error_naming_the_layer():
  """Issue 41.3: rank 4096 on a width-128 model ran and saved adapters bigger than the model."""
  from configs import own_task  # pylint: disable=import-outside-toplevel
  cfg = own_task.get_config()
  o = cfg.model.overrides
  hidden, kv_width = o.hidden_size, o.num_kv_heads * o.head_dim  # 128 and 64: k_proj/v_proj are 128 -> 64
  assert kv_width < hidden == o.num_heads * o.head_dim
  cfg.trainer.lora.rank = 4096
  with pytest.raises(sections.ConfigError, match=r"trainer.lora.rank=4096: must be below min\(d_in, d_out\)") as info:
    check.validate(cfg)
  for name, d_out in (("q_proj", hidden), ("k_proj", kv_width), ("v_proj", kv_width), ("o_proj", hidden)):
    assert f"layers/attn/{name} ({hidden} -> {d_out})" in str(info.value)
  cfg.trainer.lora.rank = kv_width  # too wide for the kv projections only
  with pytest.raises(sections.ConfigError) as info:
    check.validate(cfg)
  assert "k_proj" in str(info.value) and "v_proj" in str(info.value) and "q_proj" not in str(info.value)
  cfg.trainer.lora.rank = kv_width - 1
  assert check.validate(cfg) == []


@pytest.mark.slow  # whole runs; fast: the adapter tests above and below (gradients, merge = PEFT's, log-probs)
@pytest.mark.parametrize("backend", ["scripted", "jax"])
def test_lora_run_saves_only_adapters_resumes_exactly_and_exports_merged(tmp_path, backend):
  """The scripted sampler's responses depend on its snapshot (the merged policy), so a wrong merge or base after the
  resume shows in the losses as it would with the JAX sampler (kept in `make test-all`)."""
  config = tiny_config(num_syncs=2, sync_every=3)
  config.sampler.backend = backend
  config.warmstart.steps = 20
  config.eval.num_prompts = 16
  config.trainer.lora.update(rank=4, alpha=8.0)
  config.trainer.optim.lr = 3e-3
  full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
  run = assemble.setup(config, full)
  loop.train(run)
  final_policy = jax.tree.map(np.asarray, run.policy_params(run.state))
  loop.train(assemble.setup(config, killed), max_windows=1)
  loop.train(assemble.setup(config, killed))  # resumes from step 3 with the saved base

  def losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      return {h["step"]: h["train/loss"] for h in map(json.loads, f) if "train/loss" in h}
  assert losses(full) == losses(killed) and len(losses(full)) == 6  # bit-identical after the resume

  step_dir = checkpoint_files.absolute(full) / "checkpoints" / "6"
  _, saved = checkpoint_files.check_files(step_dir, 6)
  assert any(".lora_a" in k for k in saved) and not any(k.endswith(".kernel") for k in saved)

  weights = policy.from_run(full)  # what export, eval and serve read: merged, plain model params
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=0), weights.params, final_policy)


@pytest.mark.parametrize("execution", [{}, {"remat": True, "mlp_chunks": 2}])
def test_in_layer_adapters_give_the_merged_models_log_probs(execution):
  settings = lora.LoraSettings(rank=3, alpha=6.0, targets=lora.PROJECTIONS)
  config = QwenConfig.tiny().replace(**execution)
  model = api.for_config(config)
  params = decoder.init_params(config, jax.random.PRNGKey(0))
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  params = nn.unbox(params)
  adapters = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(x.size), x.shape) * 0.05,
                          lora.init_adapters(settings, model, params, jax.random.PRNGKey(1)))  # B != 0
  batch = train_bench.make_batch(2, 2, 10, config.vocab_size, seed=2, prompt_len=3, min_response=1)
  tokens, targets = batch["tokens"].reshape(4, 10), batch["targets"].reshape(4, 10)
  in_layer = model.token_logprobs(params, tokens, targets, temperature=0.7, lora=lora.scaled(settings, adapters))
  merged = model.token_logprobs(lora.merge(settings, model, params, adapters), tokens, targets, temperature=0.7)
  plain = model.token_logprobs(params, tokens, targets, temperature=0.7)
  np.testing.assert_allclose(np.asarray(in_layer), np.asarray(merged), atol=2e-5, rtol=0)
  assert float(jnp.abs(in_layer - plain).max()) > 1e-2  # the adapters do act
