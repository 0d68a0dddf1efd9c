"""OAPL (arXiv 2602.19362, Eq. 2-3): least-squares regression of beta2 * log(pi / pi_vllm) onto r - V̂*."""
from __future__ import annotations

import dataclasses
from typing import Mapping

import jax
import jax.numpy as jnp

from oapl_jax.objectives import checks
from oapl_jax.objectives.masking import frac_groups_all_equal, sequence_logprob

Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class OAPLSettings:
  beta1: float = 1.0  # temperature of the V* estimator (Eq. 2)
  beta2: float = 1e-3  # KL strength to the sampler (Eq. 3)
  length_normalize: bool = False  # mean instead of sum of token log-probs (off in the paper)

  def __post_init__(self):
    checks.positive_number("OAPLSettings", "beta1", self.beta1)
    checks.positive_number("OAPLSettings", "beta2", self.beta2)
    checks.boolean("OAPLSettings", "length_normalize", self.length_normalize)


def v_star(rewards_BxG: jax.Array, beta1: float | jax.Array) -> jax.Array:
  """V̂*(x) = beta1 * log(mean_i exp(r_i / beta1)) per prompt -> [B] float32.

  Written as m + beta1 * log1p(mean_i expm1((r_i - m) / beta1)) with m = max_i r_i:
  the exponent is <= 0 (no overflow at any reward scale; beta1 -> 0 gives m), and
  for huge beta1 the expm1/log1p pair keeps the small terms exact, so the result
  tends to mean_i r_i instead of drowning in rounding. Equal rewards give exactly m.
  """
  if rewards_BxG.ndim != 2:
    raise ValueError(f"rewards_BxG must be [B, G], got shape {rewards_BxG.shape}")
  checks.check_positive("beta1", beta1)
  r_BxG = rewards_BxG.astype(jnp.float32)
  m_B = jnp.max(r_BxG, axis=-1)
  z_BxG = (r_BxG - m_B[:, None]) / beta1
  return m_B + beta1 * jnp.log1p(jnp.mean(jnp.expm1(z_BxG), axis=-1))


def v_star_of_members(rewards_BxG: jax.Array, member_BxG: jax.Array, beta1: float | jax.Array) -> jax.Array:
  """V̂*(x) over each group's members only (member 1, others 0): beta1 * log(mean_{i member} exp(r_i / beta1)),
  in v_star's overflow-free form -> [B] float32. Every group needs a member."""
  r_BxG = rewards_BxG.astype(jnp.float32)
  member_BxG = member_BxG.astype(bool)
  m_B = jnp.max(jnp.where(member_BxG, r_BxG, -jnp.inf), axis=-1)
  z_BxG = jnp.where(member_BxG, (r_BxG - m_B[:, None]) / beta1, 0.0)
  mean_B = jnp.sum(jnp.where(member_BxG, jnp.expm1(z_BxG), 0.0), axis=-1) / jnp.sum(member_BxG, axis=-1)
  return m_B + beta1 * jnp.log1p(mean_B)


def oapl_loss(policy_logp_BxG: jax.Array, sampler_logp_BxG: jax.Array,
              rewards_BxG: jax.Array, *, beta1: float | jax.Array,
              beta2: float | jax.Array, member_BxG: jax.Array | None = None) -> tuple[jax.Array, Metrics]:
  """OAPL loss (Eq. 3): mean_{x,i} (beta2 * log(pi / pi_vllm) - (r - V̂*))^2 over sequence log-probs.

  `member_BxG` (1/0): only members enter V̂* and the mean (demonstrations trained by SFT instead are not);
  None: every sample, the paper's loss."""
  if policy_logp_BxG.ndim != 2:
    raise ValueError(f"policy_logp_BxG must be [B, G], got shape {policy_logp_BxG.shape}")
  checks.check_shape("sampler_logp_BxG", sampler_logp_BxG, policy_logp_BxG.shape)
  checks.check_shape("rewards_BxG", rewards_BxG, policy_logp_BxG.shape)
  checks.check_positive("beta2", beta2)
  r_BxG = rewards_BxG.astype(jnp.float32)
  if member_BxG is None:
    v_B = jax.lax.stop_gradient(v_star(r_BxG, beta1))
  else:
    checks.check_shape("member_BxG", member_BxG, policy_logp_BxG.shape)
    v_B = jax.lax.stop_gradient(v_star_of_members(r_BxG, member_BxG, beta1))
  adv_BxG = r_BxG - v_B[:, None]
  log_ratio_BxG = (policy_logp_BxG.astype(jnp.float32)
                   - jax.lax.stop_gradient(sampler_logp_BxG.astype(jnp.float32)))
  residual_BxG = beta2 * log_ratio_BxG - adv_BxG
  if member_BxG is None:
    loss = jnp.mean(jnp.square(residual_BxG))
  else:
    weight_BxG = member_BxG.astype(jnp.float32)
    loss = jnp.sum(weight_BxG * jnp.square(residual_BxG)) / jnp.maximum(jnp.sum(weight_BxG), 1.0)
  metrics = {
      "residual_mean": jnp.mean(residual_BxG),
      "residual_std": jnp.std(residual_BxG),
      "advantage_mean": jnp.mean(adv_BxG),
      "advantage_std": jnp.std(adv_BxG),
      "advantage_abs_max": jnp.max(jnp.abs(adv_BxG)),
      "log_ratio_mean": jnp.mean(log_ratio_BxG),
      "log_ratio_abs_mean": jnp.mean(jnp.abs(log_ratio_BxG)),
      "v_star_mean": jnp.mean(v_B),
      "frac_groups_all_equal_reward": frac_groups_all_equal(r_BxG),
      "reward_mean": jnp.mean(r_BxG),
  }
  return loss, metrics


def oapl_from_batch(policy_token_logp_BxGxT: jax.Array, batch: Mapping[str, jax.Array],
                    settings: OAPLSettings) -> tuple[jax.Array, Metrics]:
  mask_BxGxT = batch["response_mask"]
  seq = lambda x: sequence_logprob(x, mask_BxGxT, length_normalize=settings.length_normalize)  # noqa: E731
  demo_BxG = batch.get("demo_slots")  # loop.demo_use='sft': those slots are trained by SFT, not regressed
  return oapl_loss(seq(policy_token_logp_BxGxT), seq(batch["sampler_token_logp"]), batch["rewards"],
                   beta1=settings.beta1, beta2=settings.beta2, member_BxG=None if demo_BxG is None else 1.0 - demo_BxG)
