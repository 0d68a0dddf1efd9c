"""Tests for oapl_jax.objectives. References are hand values, separate numpy formulas or properties."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from oapl_jax import objectives as obj
from oapl_jax.objectives.batch_fields import FIELDS


def _np_v_star(r_BxG, beta1):
  """float64 reference: beta1 * log(mean(exp(r / beta1))), shifted by the max."""
  r_BxG = np.asarray(r_BxG, np.float64)
  m = r_BxG.max(-1)
  return m + beta1 * np.log(np.mean(np.exp((r_BxG - m[:, None]) / beta1), -1))


def _np_oapl(policy_BxG, sampler_BxG, r_BxG, beta1, beta2):
  adv = np.asarray(r_BxG, np.float64) - _np_v_star(r_BxG, beta1)[:, None]
  residual = beta2 * (np.asarray(policy_BxG, np.float64) - sampler_BxG) - adv
  return np.mean(residual**2), residual


# ----------------------------------------------------------------------------- v_star

def test_v_star_hand_values():
  r = jnp.array([[0.0, 1.0], [0.0, 1.0], [3.0, 3.0]])
  np.testing.assert_allclose(obj.v_star(r[:1], 1.0), [math.log((1 + math.e) / 2)], rtol=1e-6)
  np.testing.assert_allclose(obj.v_star(r[1:2], 2.0), [2 * math.log((1 + math.exp(0.5)) / 2)],
                             rtol=1e-6)
  # All-equal rewards: V* equals that reward exactly, whatever beta1.
  for beta1 in (1e-6, 1.0, 1e6):
    assert float(obj.v_star(r[2:], beta1)[0]) == 3.0


def test_v_star_limits():
  r = jnp.array([[0.0, 1.0, 0.25, -2.0], [5.0, -5.0, 0.5, 0.5]])
  np.testing.assert_allclose(obj.v_star(r, 1e-6), [1.0, 5.0], atol=1e-5)
  np.testing.assert_allclose(obj.v_star(r, 1e6), [-0.1875, 0.25], rtol=1e-5, atol=1e-5)
  # Bounded by mean and max for every beta1 (a property of the log-mean-exp).
  for beta1 in (1e-3, 0.1, 1.0, 10.0, 1e3):
    v = np.asarray(obj.v_star(r, beta1))
    assert np.all(v <= np.asarray(r).max(-1) + 1e-6)
    assert np.all(v >= np.asarray(r).mean(-1) - 1e-6)


def test_v_star_large_rewards_no_overflow():
  r = jnp.array([[1e4, 0.0], [1e4, 1e4], [-1e4, -1e4 + 1.0]])
  v = np.asarray(obj.v_star(r, 1.0))
  assert np.all(np.isfinite(v))
  # 1e4 + log((1 + e^-1e4) / 2) = 1e4 - log 2 ; fp32 spacing at 1e4 is ~1e-3.
  np.testing.assert_allclose(v, [1e4 - math.log(2), 1e4, -1e4 + 1 + math.log((1 + math.exp(-1)) / 2)],
                             atol=2e-3)


def test_v_star_matches_numpy_and_jits():
  r = np.random.RandomState(0).randn(16, 8).astype(np.float32) * 3
  f = jax.jit(obj.v_star)  # beta1 traced
  for beta1 in (1e-3, 0.1, 1.0, 100.0, 1e4, 1e6):
    v = f(jnp.asarray(r), beta1)
    assert v.dtype == jnp.float32 and v.shape == (16,)
    np.testing.assert_allclose(v, _np_v_star(r, beta1), rtol=1e-5, atol=2e-6)


def test_v_star_rejects_bad_input():
  with pytest.raises(ValueError, match="beta1"):
    obj.v_star(jnp.zeros((2, 3)), 0.0)
  with pytest.raises(ValueError, match=r"\[B, G\]"):
    obj.v_star(jnp.zeros((2, 3, 4)), 1.0)


# ----------------------------------------------------------------------------- sequence_logprob

def test_sequence_logprob_masked_sum_and_mean():
  logp = jnp.array([[[-1.0, -2.0, -jnp.inf], [-0.5, jnp.nan, -4.0], [-3.0, -3.0, -3.0]]])
  mask = jnp.array([[[1, 1, 0], [1, 0, 1], [0, 0, 0]]], jnp.float32)
  np.testing.assert_allclose(obj.sequence_logprob(logp, mask), [[-3.0, -4.5, 0.0]])
  np.testing.assert_allclose(obj.sequence_logprob(logp, mask.astype(bool), length_normalize=True),
                             [[-1.5, -2.25, 0.0]])
  with pytest.raises(ValueError, match="mask"):
    obj.sequence_logprob(logp, mask[..., :2])


# ----------------------------------------------------------------------------- oapl_loss

def _random_oapl_inputs(seed, b=3, g=5):
  rng = np.random.RandomState(seed)
  policy = rng.randn(b, g).astype(np.float32) * 5 - 20
  sampler = policy + rng.randn(b, g).astype(np.float32)
  rewards = rng.binomial(1, 0.5, (b, g)).astype(np.float32)
  rewards[0] = 1.0  # one group with all-equal rewards
  return policy, sampler, rewards


def test_oapl_loss_matches_numpy_and_gradient():
  policy, sampler, rewards = _random_oapl_inputs(1)
  beta1, beta2 = 0.7, 0.05
  expected, residual = _np_oapl(policy, sampler, rewards, beta1, beta2)
  loss_fn = jax.jit(lambda p: obj.oapl_loss(p, sampler, rewards, beta1=beta1, beta2=beta2))
  (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(jnp.asarray(policy))
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(grad, 2 * beta2 * residual / residual.size, rtol=1e-4, atol=1e-7)
  adv = rewards - _np_v_star(rewards, beta1)[:, None]
  np.testing.assert_allclose(metrics["residual_mean"], residual.mean(), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(metrics["advantage_abs_max"], np.abs(adv).max(), rtol=1e-5)
  np.testing.assert_allclose(metrics["log_ratio_mean"], np.mean(policy - sampler), rtol=1e-4)
  np.testing.assert_allclose(metrics["frac_groups_all_equal_reward"],
                             np.mean([len(set(row)) == 1 for row in rewards]))
  np.testing.assert_allclose(metrics["reward_mean"], rewards.mean(), rtol=1e-6)


def test_oapl_loss_fixed_point_zero_loss_and_grad():
  policy, sampler, rewards = _random_oapl_inputs(2)
  beta1 = beta2 = 0.5
  adv = rewards - _np_v_star(rewards, beta1)[:, None]
  policy_star = (sampler + adv / beta2).astype(np.float32)  # beta2 * log(pi / pi_s) = A*
  loss_fn = lambda p: obj.oapl_loss(p, sampler, rewards, beta1=beta1, beta2=beta2)[0]  # noqa: E731
  loss, grad = jax.value_and_grad(loss_fn)(jnp.asarray(policy_star))
  assert float(loss) < 1e-6
  np.testing.assert_allclose(grad, 0.0, atol=1e-6)


def test_oapl_loss_shape_errors():
  with pytest.raises(ValueError, match="rewards_BxG"):
    obj.oapl_loss(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros((2, 4)), beta1=1.0, beta2=1.0)
  with pytest.raises(ValueError, match="sampler_logp_BxG"):
    obj.oapl_loss(jnp.zeros((2, 3)), jnp.zeros((3, 2)), jnp.zeros((2, 3)), beta1=1.0, beta2=1.0)


def test_oapl_learns_optimal_policy_on_bandit():
  """K answers, uniform sampler, each group holds every answer once: pi -> softmax(r / beta)."""
  rewards_K = np.array([1.0, 0.5, 0.0, -0.3, 0.8], np.float32)
  k, beta = rewards_K.size, 0.5
  rewards_BxG = jnp.asarray(np.tile(rewards_K, (2, 1)))
  sampler_BxG = jnp.full((2, k), -math.log(k))
  opt = optax.adam(0.05)

  def loss_fn(theta_K):
    logp_BxG = jnp.broadcast_to(jax.nn.log_softmax(theta_K), (2, k))
    return obj.oapl_loss(logp_BxG, sampler_BxG, rewards_BxG, beta1=beta, beta2=beta)[0]

  def step(carry, _):
    theta, opt_state = carry
    grad = jax.grad(loss_fn)(theta)
    updates, opt_state = opt.update(grad, opt_state)
    return (optax.apply_updates(theta, updates), opt_state), None

  theta0 = jnp.zeros(k)
  (theta, _), _ = jax.jit(lambda c: jax.lax.scan(step, c, None, length=600))(
      (theta0, opt.init(theta0)))
  target = np.exp(rewards_K / beta) / np.exp(rewards_K / beta).sum()
  np.testing.assert_allclose(jax.nn.softmax(theta), target, atol=1e-3)
  assert float(loss_fn(theta)) < 1e-6


# ----------------------------------------------------------------------------- registry

def _random_batch(seed, b=2, g=4, t=6, with_old=False):
  rng = np.random.RandomState(seed)
  lengths = rng.randint(1, t + 1, size=(b, g))
  mask = (np.arange(t)[None, None, :] < lengths[..., None]).astype(np.float32)
  batch = {
      "sampler_token_logp": -rng.rand(b, g, t).astype(np.float32) * 3,
      "response_mask": mask,
      "rewards": rng.binomial(1, 0.5, (b, g)).astype(np.float32),
  }
  batch["rewards"][0, :2] = [1.0, 0.0]  # at least one group with spread
  if with_old:
    batch["old_policy_token_logp"] = -rng.rand(b, g, t).astype(np.float32) * 3
  policy = -rng.rand(b, g, t).astype(np.float32) * 3
  return policy, batch


def test_compute_loss_unknown_name():
  policy, batch = _random_batch(0)
  with pytest.raises(ValueError, match=r"known losses: \['asymre', 'grpo', 'grpo_onpolicy', 'm2po', 'oapl', "
                                       r"'opmd', 'sft'\]"):
    obj.compute_loss("ppo", policy, batch, obj.OAPLSettings())


def test_compute_loss_oapl_equals_sequence_formula():
  policy, batch = _random_batch(3)
  cfg = obj.OAPLSettings(beta1=1.0, beta2=0.1)
  loss, _ = jax.jit(obj.compute_loss, static_argnums=(0, 3))("oapl", policy, batch, cfg)
  m = batch["response_mask"]
  seq_policy, seq_sampler = (policy * m).sum(-1), (batch["sampler_token_logp"] * m).sum(-1)
  np.testing.assert_allclose(loss, _np_oapl(seq_policy, seq_sampler, batch["rewards"], 1.0, 0.1)[0],
                             rtol=1e-5)
  ref, _ = obj.oapl_loss(seq_policy, seq_sampler, batch["rewards"], beta1=1.0, beta2=0.1)
  np.testing.assert_allclose(loss, ref, rtol=1e-6)
  # Length-normalized variant: mean token log-prob per sequence.
  n = m.sum(-1)
  loss_ln, _ = obj.compute_loss("oapl", policy, batch, obj.OAPLSettings(1.0, 0.1, True))
  np.testing.assert_allclose(
      loss_ln, _np_oapl(seq_policy / n, seq_sampler / n, batch["rewards"], 1.0, 0.1)[0], rtol=1e-5)


def _np_grpo_adv(r_BxG, eps=1e-6):
  return (r_BxG - r_BxG.mean(-1, keepdims=True)) / (r_BxG.std(-1, ddof=1, keepdims=True) + eps)


def test_grpo_on_policy_value_and_gradient():
  """old == sampler == policy: ratio 1, weight 1, loss = -mean_seq A = 0; grad = -A m / (n S)."""
  policy, batch = _random_batch(5)
  batch["sampler_token_logp"] = policy
  cfg = obj.GRPOSettings()
  f = jax.value_and_grad(lambda p, bt: obj.compute_loss("grpo", p, bt, cfg), has_aux=True)
  (loss, metrics), grad = f(jnp.asarray(policy), batch)  # no old key: stop_gradient(policy)
  adv = _np_grpo_adv(batch["rewards"])
  m = batch["response_mask"]
  n_seq = adv.size  # every sequence has >= 1 token
  np.testing.assert_allclose(loss, -adv.mean(), atol=1e-6)
  np.testing.assert_allclose(loss, 0.0, atol=1e-6)
  np.testing.assert_allclose(grad, -adv[..., None] * m / m.sum(-1, keepdims=True) / n_seq,
                             rtol=1e-5, atol=1e-7)
  assert float(metrics["clip_fraction"]) == 0.0
  np.testing.assert_allclose(metrics["tis_weight_mean"], 1.0, rtol=1e-6)
  # Same with an explicit old == policy.
  (loss_o, _), grad_o = f(jnp.asarray(policy), dict(batch, old_policy_token_logp=policy))
  np.testing.assert_allclose(loss_o, loss, atol=1e-7)
  np.testing.assert_allclose(grad_o, grad, rtol=1e-6)


def test_grpo_truncated_importance_weight():
  """old == policy, sampler off by delta per token: loss = -mean_seq(mean_t min(e^delta, cap) * A)."""
  policy, batch = _random_batch(6)
  delta = np.random.RandomState(7).uniform(-1.0, 1.5, policy.shape).astype(np.float32)
  batch["sampler_token_logp"] = policy - delta
  cfg = obj.GRPOSettings(tis_cap=2.0)
  loss, metrics = obj.compute_loss("grpo", policy, batch, cfg)
  w = np.minimum(np.exp(delta), 2.0)
  m = batch["response_mask"]
  adv = _np_grpo_adv(batch["rewards"])
  expected = np.mean(-adv * (w * m).sum(-1) / m.sum(-1))
  np.testing.assert_allclose(loss, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["tis_weight_mean"], (w * m).sum() / m.sum(), rtol=1e-5)


def test_grpo_clipping():
  """rewards [1, 0]: A = +-a, a = 0.5 / (sqrt(0.5) + 1e-6). Two tokens per sequence, S = 2."""
  a = 0.5 / (math.sqrt(0.5) + 1e-6)
  old = np.zeros((1, 2, 2), np.float32) - 1.0
  batch = {"sampler_token_logp": old, "old_policy_token_logp": old,
           "response_mask": np.ones((1, 2, 2), np.float32), "rewards": np.array([[1.0, 0.0]])}
  cfg = obj.GRPOSettings(clip_eps=0.2)
  f = jax.value_and_grad(lambda p: obj.compute_loss("grpo", p, batch, cfg), has_aux=True)

  # ratio 1.5 everywhere: A > 0 clipped at 1.2 (zero grad), A < 0 takes 1.5 * A (grad flows).
  (loss, metrics), grad = f(jnp.asarray(old + math.log(1.5)))
  np.testing.assert_allclose(loss, (-1.2 * a + 1.5 * a) / 2, rtol=1e-5)
  np.testing.assert_allclose(grad[0, 0], [0.0, 0.0], atol=0)
  np.testing.assert_allclose(grad[0, 1], [1.5 * a / 4, 1.5 * a / 4], rtol=1e-5)
  np.testing.assert_allclose(metrics["clip_fraction"], 0.5)

  # ratio 0.5: A < 0 clipped at 0.8 (zero grad), A > 0 takes 0.5 * A.
  (loss, metrics), grad = f(jnp.asarray(old + math.log(0.5)))
  np.testing.assert_allclose(loss, (-0.5 * a + 0.8 * a) / 2, rtol=1e-5)
  np.testing.assert_allclose(grad[0, 1], [0.0, 0.0], atol=0)
  np.testing.assert_allclose(grad[0, 0], [-0.5 * a / 4, -0.5 * a / 4], rtol=1e-5)
  np.testing.assert_allclose(metrics["clip_fraction"], 0.5)


def test_grpo_shape_errors():
  policy, batch = _random_batch(8)
  with pytest.raises(ValueError, match=r"batch\['rewards'\] has shape \(2, 3\), expected \(2, 4\)"):
    obj.compute_loss("grpo", policy, dict(batch, rewards=batch["rewards"][:, :3]), obj.GRPOSettings())
  with pytest.raises(ValueError, match="rewards_BxG"):
    obj.grpo_loss(policy, None, policy, batch["response_mask"], batch["rewards"][:, :3], clip_eps=0.2, tis_cap=2.0)
  with pytest.raises(ValueError, match="G >= 2"):
    obj.grpo_loss(policy[:, :1], None, policy[:, :1], batch["response_mask"][:, :1],
                  batch["rewards"][:, :1], clip_eps=0.2, tis_cap=2.0)


def test_sft_loss_is_masked_mean_nll():
  logp = np.log(np.array([[[0.5, 0.25, 0.9]]], np.float32))
  mask = np.array([[[1.0, 1.0, 0.0]]], np.float32)
  batch = {"response_mask": mask, "sampler_token_logp": np.zeros_like(logp), "rewards": np.zeros((1, 1), np.float32)}
  loss, _ = obj.compute_loss("sft", logp, batch, obj.SFTSettings())
  np.testing.assert_allclose(float(loss), (np.log(2) + np.log(4)) / 2, rtol=1e-6)


# ----------------------------------------------------------------------------- typed settings, registry

@pytest.mark.parametrize("kind, field, value, message", [
    (obj.OAPLSettings, "beta1", 0.0, "beta1 must be > 0"),
    (obj.OAPLSettings, "beta2", -1e-3, "beta2 must be > 0"),
    (obj.OAPLSettings, "beta2", float("nan"), "beta2 must be a finite number"),
    (obj.OAPLSettings, "length_normalize", 1, "length_normalize must be True or False"),
    (obj.GRPOSettings, "clip_eps", 1.5, r"clip_eps must be in \(0, 1\)"),
    (obj.GRPOSettings, "tis_cap", 0.0, "tis_cap must be > 0"),
    (obj.AsymRESettings, "shift", "low", "shift must be a finite number"),
    (obj.OPMDSettings, "tau", 0.0, "tau must be > 0"),
    (obj.OPMDSettings, "baseline", "max", r"baseline must be one of \['mean', 'logmeanexp'\]"),
    (obj.M2POSettings, "budget", -0.04, "budget must be > 0"),
])
def test_settings_reject_bad_values(kind, field, value, message):
  with pytest.raises(ValueError, match=f"{kind.__name__}.{message}"):
    kind(**{field: value})


def test_settings_from_config():
  assert obj.build_settings("oapl", {"beta1": 0.5, "beta2": 0.5}) == obj.OAPLSettings(0.5, 0.5, False)
  assert obj.build_settings("grpo_onpolicy", None) == obj.GRPOSettings()
  assert obj.build_settings("opmd", {"baseline": "logmeanexp"}).tau == 1.0
  assert obj.build_settings("m2po").budget == 0.04 and obj.AsymRESettings().shift == -0.1
  with pytest.raises(ValueError, match=r"clip_eps: unknown setting; known: \['beta1', 'beta2', 'length_normalize'\]"):
    obj.build_settings("oapl", {"beta1": 1.0, "clip_eps": 0.2})
  with pytest.raises(ValueError, match="unknown loss 'ppo'"):
    obj.build_settings("ppo", {})
  assert {n: s.needs_groups for n, s in obj.LOSSES.items()}["sft"] is False


def test_every_bad_setting_is_named_when_a_field_rule_fails_first():
  """beta2=None fails a field rule, so __post_init__ (where beta1 > 0 is checked) never runs: both are named."""
  from oapl_jax import sections
  with pytest.raises(sections.ConfigError) as raised:
    obj.build_settings("oapl", {"beta1": 0, "beta2": None}, "trainer.loss_settings.oapl")
  assert sorted(p.split("=")[0] for p in raised.value.problems) == ["trainer.loss_settings.oapl.beta1",
                                                                     "trainer.loss_settings.oapl.beta2"]


def test_compute_loss_checks_settings_type_and_batch_keys():
  policy, batch = _random_batch(9)
  with pytest.raises(TypeError, match="loss 'opmd' takes OPMDSettings, got OAPLSettings"):
    obj.compute_loss("opmd", policy, batch, obj.OAPLSettings())
  with pytest.raises(ValueError, match=r"loss 'm2po' needs batch keys \['sampler_token_logp'\]"):
    obj.compute_loss("m2po", policy, {k: v for k, v in batch.items() if k != "sampler_token_logp"},
                     obj.M2POSettings())
  with pytest.raises(ValueError, match=r"must be \[B, G, T\]"):
    obj.compute_loss("asymre", policy[0], batch, obj.AsymRESettings())


def test_every_key_a_loss_reads_is_a_stated_field_and_the_optional_ones_are_the_optional_fields():
  """The shape check reads batch_fields.FIELDS: every key a loss reads is stated there, and what some loss reads
  when present is what the statement calls optional."""
  read = {k for spec in obj.LOSSES.values() for k in spec.needs + spec.optional}
  assert read <= set(FIELDS), sorted(read - set(FIELDS))
  assert {k for spec in obj.LOSSES.values() for k in spec.optional} == {k for k, f in FIELDS.items() if f.optional}
  policy, batch = _random_batch(9)
  demo_slots = np.zeros(policy.shape, np.float32)  # stated per sequence [B, G]: a [B, G, T] one is refused
  with pytest.raises(ValueError, match=r"batch\['demo_slots'\] has shape \(\d+, \d+, \d+\)"):
    obj.compute_loss("oapl", policy, dict(batch, demo_slots=demo_slots), obj.OAPLSettings())


def test_grpo_onpolicy_is_grpo():
  policy, batch = _random_batch(11, with_old=True)
  a = obj.compute_loss("grpo", policy, batch, obj.GRPOSettings())
  b = obj.compute_loss("grpo_onpolicy", policy, batch, obj.GRPOSettings())
  chex.assert_trees_all_equal(a, b)


# ----------------------------------------------------------------------------- every loss

def _nan_padded(policy, batch):
  """Copies with NaN (and -inf in the policy) at every padded token position."""
  off = batch["response_mask"] == 0
  policy = np.where(off, np.nan, policy).astype(np.float32)
  policy[off & (np.arange(policy.shape[-1]) % 2 == 0)] = -np.inf
  batch = {k: (np.where(off, np.nan, v).astype(np.float32) if v.ndim == 3 and k != "response_mask" else v)
           for k, v in batch.items()}
  return policy, batch


@pytest.mark.parametrize("name", sorted(obj.LOSSES))
def test_padding_values_change_neither_loss_nor_gradient(name):
  policy, batch = _random_batch(12, b=3, g=4, t=7, with_old=True)
  batch["sampler_token_logp"] = policy + np.random.RandomState(13).randn(*policy.shape).astype(np.float32)
  batch["old_policy_token_logp"] = policy + 0.3
  settings = obj.build_settings(name, None)
  f = jax.jit(jax.value_and_grad(lambda p, bt: obj.compute_loss(name, p, bt, settings), has_aux=True))
  (loss, metrics), grad = f(jnp.asarray(np.where(batch["response_mask"] > 0, policy, 0.0)), batch)
  (loss_n, metrics_n), grad_n = f(*_nan_padded(policy, batch))
  assert np.isfinite(float(loss)) and loss.dtype == jnp.float32
  np.testing.assert_allclose(loss_n, loss, rtol=1e-6)
  np.testing.assert_allclose(grad_n, grad, rtol=1e-6, atol=1e-9)
  assert np.all(np.asarray(grad_n)[batch["response_mask"] == 0] == 0.0)
  chex.assert_trees_all_close(metrics_n, metrics, rtol=1e-6)
  if name == "m2po":
    assert float(metrics["trust_region_active"]) == 1.0  # the sort path is exercised


@pytest.mark.parametrize("name", sorted(obj.LOSSES))
def test_float32_math_for_bfloat16_inputs(name):
  policy, batch = _random_batch(14, with_old=True)
  bf16 = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
  batch_bf16 = {k: (bf16(v) if k != "response_mask" else v) for k, v in batch.items()}
  settings = obj.build_settings(name, None)
  loss, metrics = obj.compute_loss(name, bf16(policy), batch_bf16, settings)
  loss_32, _ = obj.compute_loss(name, np.asarray(bf16(policy), np.float32),
                                {k: np.asarray(v, np.float32) for k, v in batch_bf16.items()}, settings)
  assert loss.dtype == jnp.float32 and all(v.dtype == jnp.float32 for v in metrics.values())
  np.testing.assert_allclose(loss, loss_32, rtol=1e-6)


def test_oapl_members_only_equals_the_loss_on_the_group_without_the_others():
  """demo_slots (loop.demo_use='sft'): a slot that is no member enters neither V* nor the mean, so the loss is
  the paper's loss on the groups with those slots cut out (here: the last of G = 4)."""
  rng = np.random.default_rng(7)
  pol, samp = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(3, 4)).astype(np.float32)
  rewards = rng.integers(0, 2, size=(3, 4)).astype(np.float32)
  member = np.array([[1, 1, 1, 0]] * 3, np.float32)
  kw = dict(beta1=0.7, beta2=0.3)
  cut, _ = obj.oapl_loss(pol[:, :3], samp[:, :3], rewards[:, :3], **kw)
  masked, _ = obj.oapl_loss(pol, samp, rewards, member_BxG=member, **kw)
  np.testing.assert_allclose(float(masked), float(cut), rtol=1e-6)
  g_cut = jax.grad(lambda p: obj.oapl_loss(p, samp[:, :3], rewards[:, :3], **kw)[0])(pol[:, :3])
  g_masked = jax.grad(lambda p: obj.oapl_loss(p, samp, rewards, member_BxG=member, **kw)[0])(pol)
  np.testing.assert_allclose(np.asarray(g_masked)[:, :3], np.asarray(g_cut), rtol=1e-5)
  assert not np.asarray(g_masked)[:, 3].any()  # the non-member gets no gradient from the regression
  # V* over the members, by hand: beta1 * log(mean exp(r / beta1)) of the first three rewards
  by_hand = 0.7 * np.log(np.mean(np.exp(rewards[:, :3] / 0.7), axis=-1))
  np.testing.assert_allclose(np.asarray(obj.v_star_of_members(rewards, member, 0.7)), by_hand, rtol=1e-6)
  # every sample a member: the paper's V*
  np.testing.assert_allclose(np.asarray(obj.v_star_of_members(rewards, np.ones_like(member), 0.7)),
                             np.asarray(obj.v_star(rewards, 0.7)), rtol=1e-6)
