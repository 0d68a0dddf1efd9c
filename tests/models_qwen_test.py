"""Flax Qwen vs Hugging Face transformers: logits parity, log-probs, and sharded forward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from oapl_jax import parallel
from oapl_jax.models import decoder, hf
from oapl_jax.models.qwen.config import QwenConfig
from tests.hf_fixtures import make_hf_checkpoint

CASES = [("qwen3", False), ("qwen3", True), ("qwen2", False), ("qwen2", True)]


def _rel_err(a, b):
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{'tied' if c[1] else 'untied'}")
def checkpoint(request, tmp_path_factory):
  family, tie = request.param
  path = tmp_path_factory.mktemp(f"{family}_{tie}")
  torch_model = make_hf_checkpoint(path, family, tie)
  return path, torch_model


def test_config_read_from_checkpoint(checkpoint):
  path, torch_model = checkpoint
  config = hf.read_config(str(path))
  assert config.qk_norm == (torch_model.config.model_type == "qwen3")
  assert config.qkv_bias == (torch_model.config.model_type == "qwen2")
  assert config.tie_word_embeddings == torch_model.config.tie_word_embeddings
  assert config.head_dim == 16 and config.num_kv_heads == 2 and config.rope_theta == 10000.0


def test_logits_match_transformers_right_padded(checkpoint):
  path, torch_model = checkpoint
  config, params = hf.load(str(path))
  rng = np.random.RandomState(0)
  lengths = np.array([9, 5, 1])
  tokens = rng.randint(0, config.vocab_size, (3, 9))
  mask = (np.arange(9)[None] < lengths[:, None]).astype(np.int64)
  tokens = tokens * mask  # pad id 0 after each row's length
  with torch.no_grad():
    ref = torch_model(torch.tensor(tokens), attention_mask=torch.tensor(mask)).logits.numpy()
  ours = np.asarray(decoder.logits(params, config, jnp.asarray(tokens)))
  real = mask.astype(bool)
  assert _rel_err(ours[real], ref[real]) < 1e-4


def test_left_padding_with_positions_and_key_mask(checkpoint):
  path, torch_model = checkpoint
  config, params = hf.load(str(path))
  rng = np.random.RandomState(1)
  mask = np.array([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
  tokens = rng.randint(1, config.vocab_size, mask.shape) * mask
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  with torch.no_grad():
    ref = torch_model(torch.tensor(tokens), attention_mask=torch.tensor(mask),
                      position_ids=torch.tensor(positions)).logits.numpy()
  ours = np.asarray(decoder.logits(params, config, tokens, positions, key_mask_BxS=mask))
  real = mask.astype(bool)
  assert _rel_err(ours[real], ref[real]) < 1e-4


def test_token_logprobs_match_log_softmax_at_temperature(checkpoint):
  path, _ = checkpoint
  config, params = hf.load(str(path), logprob_chunk_tokens=4)  # 2 x 11 tokens -> 6 chunks of 1 x 4
  rng = np.random.RandomState(2)
  tokens = rng.randint(0, config.vocab_size, (2, 11))
  targets = rng.randint(0, config.vocab_size, (2, 11))
  for temperature in (1.0, 0.6):
    z = np.asarray(decoder.logits(params, config, tokens), np.float64) / temperature
    logp_ref = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)
    want = np.take_along_axis(logp_ref, targets[..., None], -1)[..., 0]
    p = np.exp(logp_ref)
    want_entropy = -(p * logp_ref).sum(-1)
    got, entropy = decoder.token_logprobs(params, config, tokens, targets, temperature=temperature, with_entropy=True)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4)
    np.testing.assert_allclose(np.asarray(entropy), want_entropy, atol=1e-4)


@pytest.mark.devices(8)
def test_sharded_forward_equals_single_device(checkpoint):
  path, _ = checkpoint
  assert jax.device_count() == 8
  config, params_1 = hf.load(str(path))
  mesh = parallel.make_mesh((1, 4, 2))
  _, params_8 = hf.load(str(path), mesh=mesh)
  q_kernel = params_8["layers"]["attn"]["q_proj"]["kernel"]  # [layers, embed, q_heads, head_dim]
  assert q_kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
  assert len({str(s.index) for s in q_kernel.addressable_shards}) == 8  # 8 distinct blocks, not replicas
  assert q_kernel.addressable_shards[0].data.shape == (2, 16, 2, 16)
  tokens = np.random.RandomState(3).randint(0, config.vocab_size, (4, 8))
  rules = parallel.DEFAULT_RULES
  with parallel.sharding_context(mesh, rules):  # activation constraints active, as in training
    forward = jax.jit(lambda p, t: decoder.logits(p, config, t))
    hlo = forward.lower(params_8, tokens).as_text()
    sharded = forward(params_8, tokens)
  # Activations constrained: the embedding output, plus q, the MLP hidden and the residual in the scanned layer.
  assert hlo.count("sdy.sharding_constraint") >= 4
  single = decoder.logits(params_1, config, tokens)
  np.testing.assert_allclose(np.asarray(sharded), np.asarray(single), rtol=1e-5, atol=1e-5)


@pytest.mark.devices(8)
def test_params_born_sharded_from_init():
  config = QwenConfig.tiny()
  mesh = parallel.make_mesh((1, 4, 2))
  params, shardings = parallel.init_sharded(lambda: decoder.init_params(config, jax.random.PRNGKey(0)), mesh,
                                            parallel.DEFAULT_RULES)
  mlp = params["layers"]["mlp"]["gate_proj"]["kernel"]
  assert mlp.shape == (2, 64, 128)
  assert mlp.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  assert mlp.addressable_shards[0].data.shape == (2, 16, 64)
  assert jax.tree.structure(params) == jax.tree.structure(shardings)


def test_rotary_table_lookup_equals_computed_angles():
  """The decode loop's table lookup gives the angles computed from positions, and the table rows
  are cos(position * theta^(-2i / head_dim)), computed here in numpy."""
  config = QwenConfig.tiny()
  positions = jnp.array([[0, 5, 31], [7, 7, 2]])
  table = decoder.rotary_table(config, 32)
  looked_up, computed = decoder.rotary(config, positions, table), decoder.rotary(config, positions)
  assert looked_up.cos.shape == computed.cos.shape == (2, 3, 1, config.head_dim // 2)
  np.testing.assert_allclose(looked_up.cos, computed.cos, atol=1e-6)
  np.testing.assert_allclose(looked_up.sin, computed.sin, atol=1e-6)
  inv_freq = config.rope_theta ** (-np.arange(config.head_dim // 2) * 2.0 / config.head_dim)
  np.testing.assert_allclose(table.cos[5], np.cos(5 * inv_freq), rtol=1e-5)
