"""Memory-saving executions compute the same function: every remat policy and MLP chunking give the loss and
gradients of the plain model (no remat, unchunked), on one device and sharded over 8; bad settings are errors."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oapl_jax import parallel, sections
from oapl_jax.models import decoder, decoder_cached, execution as model_execution
from oapl_jax.models.execution import REMAT_POLICIES, Execution
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.models.factory import ModelSpec

# Odd T (13) and 3 MLP pieces: the last piece is padded, and the padding must not leak into any output.
EXECUTIONS = [dict(remat=True, remat_policy=p) for p in REMAT_POLICIES] + [
    dict(mlp_chunks=3), dict(mlp_chunks=20), dict(remat=True, remat_policy="offload_layer_input", mlp_chunks=4)]


def _problem():
  config = QwenConfig.tiny(dtype="float32", attention="reference")
  params = nn.unbox(decoder.init_params(config, jax.random.PRNGKey(0)))
  tokens_BxT = jax.random.randint(jax.random.PRNGKey(1), (8, 13), 0, config.vocab_size)
  weights_BxT = jax.random.normal(jax.random.PRNGKey(2), tokens_BxT.shape)
  return config, params, tokens_BxT, weights_BxT


def _loss(params, config, tokens_BxT, weights_BxT):
  """A least-squares fit of per-token log-probs to random targets: every position and layer reaches it."""
  logp_BxT = decoder.token_logprobs(params, config, tokens_BxT, jnp.roll(tokens_BxT, -1, axis=1))
  return jnp.mean((logp_BxT - weights_BxT) ** 2)


_VALUE_AND_GRAD = jax.jit(jax.value_and_grad(_loss), static_argnums=1)  # one compile per config (the reference's once)


def _value_and_grad(config, params, tokens_BxT, weights_BxT):
  return _VALUE_AND_GRAD(params, config, tokens_BxT, weights_BxT)


def _assert_same(got, want):
  (loss, grads), (ref_loss, ref_grads) = got, want
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(ref_grads))
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.parametrize("execution", EXECUTIONS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_execution_gives_the_plain_models_loss_and_gradients(execution):
  config, params, tokens, weights = _problem()
  variant = config.replace(**execution)
  # The same parameters: a checkpoint trained one way loads the other.
  assert jax.tree.map(jnp.shape, nn.unbox(decoder.init_params(variant, jax.random.PRNGKey(0)))) == \
      jax.tree.map(jnp.shape, params)
  assert variant.architecture == config.architecture
  _assert_same(_value_and_grad(variant, params, tokens, weights), _value_and_grad(config, params, tokens, weights))


@pytest.mark.devices(8)
def test_sharded_offload_with_pieces_gives_the_plain_models_gradients():
  config, params, tokens, weights = _problem()
  mesh = parallel.make_mesh((1, 4, 2))
  variant = config.replace(remat=True, remat_policy="offload_layer_input", mlp_chunks=2)
  value_and_grad = jax.jit(jax.value_and_grad(_loss), static_argnums=1)  # traced here, with the constraints
  with parallel.sharding_context(mesh, parallel.DEFAULT_RULES):  # activation constraints active, as in training
    _assert_same(value_and_grad(params, variant, tokens, weights), value_and_grad(params, config, tokens, weights))


def test_pieces_keep_the_cached_forward():
  """The sampler's forward (prefill, then one decode step) with MLP pieces equals the unchunked one."""
  config, params, tokens, _ = _problem()
  per_layer = decoder_cached.unstack_layers(params)
  outs = []
  for c in (config, config.replace(mlp_chunks=4)):
    cache = decoder_cached.init_cache(c, 8, 16)
    positions = jnp.broadcast_to(jnp.arange(13), tokens.shape)
    hidden, cache = decoder_cached.forward_with_cache(per_layer, c, tokens, positions, cache)
    step, _ = decoder_cached.forward_with_cache(per_layer, c, tokens[:, :1], jnp.full((8, 1), 13), cache)
    outs.append((hidden, step))
  for a, b in zip(*outs):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("field, value, message", [
    ("remat_policy", "offload", "remat_policy"), ("remat_policy", "", "remat_policy"), ("mlp_chunks", 0, "mlp_chunks")])
def test_bad_execution_values_are_clear_errors(field, value, message):
  with pytest.raises(ValueError, match=message):
    Execution(**{field: value})
  with pytest.raises(sections.ConfigError, match=f"model.{field}"):
    sections.build(ModelSpec, {field: value}, "model")
  with pytest.raises(ValueError, match="remat_policy"):
    model_execution.remat_policy("offload")
