"""Loss functions over arrays: OAPL (arXiv 2602.19362, Eq. 2-3) and the GRPO baseline.

Pure functions of log-probs and rewards; nothing here knows about models, the
sampler or the training loop. Shapes: B prompts, G samples per prompt, T tokens.
All arithmetic is float32 whatever the input dtype.

Select a loss by name with `compute_loss(name, policy_token_logp_BxGxT, batch, cfg)`;
every entry of `LOSSES` has that signature (less the name).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class LossConfig:
  beta1: float = 1.0  # OAPL: temperature of the V* estimator (Eq. 2).
  beta2: float = 1e-3  # OAPL: KL strength to the sampler (Eq. 3).
  length_normalize: bool = False  # OAPL: mean instead of sum of token log-probs.
  clip_eps: float = 0.2  # GRPO: PPO ratio clip.
  tis_cap: float = 2.0  # GRPO: cap of the sampler->trainer importance weight.


def _check_shape(name: str, x: jax.Array, shape: tuple[int, ...]) -> None:
  if tuple(x.shape) != tuple(shape):
    raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}")


def _check_positive(name: str, value: Any) -> None:
  # Only concrete Python numbers can be checked; traced values pass through.
  if isinstance(value, (int, float)) and not value > 0:
    raise ValueError(f"{name} must be > 0, got {value}")


def v_star(rewards_BxG: jax.Array, beta1: float | jax.Array) -> jax.Array:
  """V̂*(x) = beta1 * log(mean_i exp(r_i / beta1)) per prompt -> [B] float32.

  Written as m + beta1 * log1p(mean_i expm1((r_i - m) / beta1)) with m = max_i r_i:
  the exponent is <= 0 (no overflow at any reward scale; beta1 -> 0 gives m), and
  for huge beta1 the expm1/log1p pair keeps the small terms exact, so the result
  tends to mean_i r_i instead of drowning in rounding. Equal rewards give exactly m.
  """
  if rewards_BxG.ndim != 2:
    raise ValueError(f"rewards_BxG must be [B, G], got shape {rewards_BxG.shape}")
  _check_positive("beta1", beta1)
  r_BxG = rewards_BxG.astype(jnp.float32)
  m_B = jnp.max(r_BxG, axis=-1)
  z_BxG = (r_BxG - m_B[:, None]) / beta1
  return m_B + beta1 * jnp.log1p(jnp.mean(jnp.expm1(z_BxG), axis=-1))


def sequence_logprob(token_logp_BxGxT: jax.Array, mask_BxGxT: jax.Array, *,
                     length_normalize: bool = False) -> jax.Array:
  """Sum (or mean, if length_normalize) of token log-probs on masked tokens -> [B, G]."""
  _check_shape("mask_BxGxT", mask_BxGxT, token_logp_BxGxT.shape)
  mask_BxGxT = mask_BxGxT.astype(bool)
  # `where`, not a product: padded positions may hold -inf or NaN.
  logp_BxGxT = jnp.where(mask_BxGxT, token_logp_BxGxT.astype(jnp.float32), 0.0)
  logp_BxG = jnp.sum(logp_BxGxT, axis=-1)
  if length_normalize:
    n_BxG = jnp.sum(mask_BxGxT, axis=-1).astype(jnp.float32)
    logp_BxG = logp_BxG / jnp.maximum(n_BxG, 1.0)
  return logp_BxG


def oapl_loss(policy_logp_BxG: jax.Array, sampler_logp_BxG: jax.Array,
              rewards_BxG: jax.Array, *, beta1: float | jax.Array,
              beta2: float | jax.Array) -> tuple[jax.Array, Metrics]:
  """OAPL loss (Eq. 3): mean_{x,i} (beta2 * log(pi / pi_vllm) - (r - V̂*))^2."""
  if policy_logp_BxG.ndim != 2:
    raise ValueError(f"policy_logp_BxG must be [B, G], got shape {policy_logp_BxG.shape}")
  _check_shape("sampler_logp_BxG", sampler_logp_BxG, policy_logp_BxG.shape)
  _check_shape("rewards_BxG", rewards_BxG, policy_logp_BxG.shape)
  _check_positive("beta2", beta2)
  r_BxG = rewards_BxG.astype(jnp.float32)
  v_B = jax.lax.stop_gradient(v_star(r_BxG, beta1))
  adv_BxG = r_BxG - v_B[:, None]
  log_ratio_BxG = (policy_logp_BxG.astype(jnp.float32)
                   - jax.lax.stop_gradient(sampler_logp_BxG.astype(jnp.float32)))
  residual_BxG = beta2 * log_ratio_BxG - adv_BxG
  loss = jnp.mean(jnp.square(residual_BxG))
  metrics = {
      "residual_mean": jnp.mean(residual_BxG),
      "residual_std": jnp.std(residual_BxG),
      "advantage_mean": jnp.mean(adv_BxG),
      "advantage_std": jnp.std(adv_BxG),
      "advantage_abs_max": jnp.max(jnp.abs(adv_BxG)),
      "log_ratio_mean": jnp.mean(log_ratio_BxG),
      "log_ratio_abs_mean": jnp.mean(jnp.abs(log_ratio_BxG)),
      "v_star_mean": jnp.mean(v_B),
      "frac_groups_all_equal_reward": jnp.mean(
          jnp.all(r_BxG == r_BxG[:, :1], axis=-1).astype(jnp.float32)),
      "reward_mean": jnp.mean(r_BxG),
  }
  return loss, metrics


def grpo_advantages(rewards_BxG: jax.Array, eps: float = 1e-6) -> jax.Array:
  """(r - mean_G r) / (std_G r + eps), unbiased std (ddof=1) as in verl and TRL."""
  if rewards_BxG.ndim != 2 or rewards_BxG.shape[1] < 2:
    raise ValueError(f"GRPO needs rewards [B, G] with G >= 2, got {rewards_BxG.shape}")
  r_BxG = rewards_BxG.astype(jnp.float32)
  mean_B1 = jnp.mean(r_BxG, axis=-1, keepdims=True)
  std_B1 = jnp.std(r_BxG, axis=-1, keepdims=True, ddof=1)
  return (r_BxG - mean_B1) / (std_B1 + eps)


def grpo_loss(policy_token_logp_BxGxT: jax.Array, old_token_logp_BxGxT: jax.Array | None,
              sampler_token_logp_BxGxT: jax.Array, mask_BxGxT: jax.Array,
              rewards_BxG: jax.Array, *, clip_eps: float,
              tis_cap: float) -> tuple[jax.Array, Metrics]:
  """GRPO with token-level importance sampling (the paper's baseline).

  Per token: -w * min(rho * A, clip(rho, 1 - eps, 1 + eps) * A) with rho = pi / pi_old,
  A the group-normalized advantage and w = min(pi_old / pi_vllm, tis_cap) a
  stop-gradient truncated correction for the sampler/trainer mismatch. Averaged
  over each sequence's tokens, then over sequences that have any token.
  `old_token_logp_BxGxT=None` means pi_old = stop_gradient(pi) (rho == 1).
  """
  shape = policy_token_logp_BxGxT.shape
  if len(shape) != 3:
    raise ValueError(f"policy_token_logp_BxGxT must be [B, G, T], got shape {shape}")
  _check_shape("sampler_token_logp_BxGxT", sampler_token_logp_BxGxT, shape)
  _check_shape("mask_BxGxT", mask_BxGxT, shape)
  _check_shape("rewards_BxG", rewards_BxG, shape[:2])
  mask_BxGxT = mask_BxGxT.astype(bool)
  valid = lambda x: jnp.where(mask_BxGxT, x.astype(jnp.float32), 0.0)  # noqa: E731
  logp_BxGxT = valid(policy_token_logp_BxGxT)
  if old_token_logp_BxGxT is None:
    old_BxGxT = jax.lax.stop_gradient(logp_BxGxT)
  else:
    _check_shape("old_token_logp_BxGxT", old_token_logp_BxGxT, shape)
    old_BxGxT = jax.lax.stop_gradient(valid(old_token_logp_BxGxT))
  sampler_BxGxT = jax.lax.stop_gradient(valid(sampler_token_logp_BxGxT))

  adv_BxG = grpo_advantages(rewards_BxG)
  adv_BxGx1 = adv_BxG[..., None]
  ratio_BxGxT = jnp.exp(logp_BxGxT - old_BxGxT)
  clipped_BxGxT = jnp.clip(ratio_BxGxT, 1.0 - clip_eps, 1.0 + clip_eps)
  surrogate_BxGxT = jnp.minimum(ratio_BxGxT * adv_BxGx1, clipped_BxGxT * adv_BxGx1)
  tis_BxGxT = jnp.minimum(jnp.exp(old_BxGxT - sampler_BxGxT), tis_cap)
  token_loss_BxGxT = jnp.where(mask_BxGxT, -tis_BxGxT * surrogate_BxGxT, 0.0)

  n_BxG = jnp.sum(mask_BxGxT, axis=-1).astype(jnp.float32)
  seq_loss_BxG = jnp.sum(token_loss_BxGxT, axis=-1) / jnp.maximum(n_BxG, 1.0)
  has_tokens_BxG = (n_BxG > 0).astype(jnp.float32)
  loss = jnp.sum(seq_loss_BxG * has_tokens_BxG) / jnp.maximum(jnp.sum(has_tokens_BxG), 1.0)

  n_tokens = jnp.maximum(jnp.sum(n_BxG), 1.0)
  token_mean = lambda x: jnp.sum(jnp.where(mask_BxGxT, x, 0.0)) / n_tokens  # noqa: E731
  is_clipped_BxGxT = (((ratio_BxGxT > 1.0 + clip_eps) & (adv_BxGx1 > 0))
                      | ((ratio_BxGxT < 1.0 - clip_eps) & (adv_BxGx1 < 0)))
  r_BxG = rewards_BxG.astype(jnp.float32)
  metrics = {
      "clip_fraction": token_mean(is_clipped_BxGxT.astype(jnp.float32)),
      "tis_weight_mean": token_mean(tis_BxGxT),
      "tis_capped_fraction": token_mean((tis_BxGxT >= tis_cap).astype(jnp.float32)),
      "advantage_mean": jnp.mean(adv_BxG),
      "advantage_std": jnp.std(adv_BxG),
      "advantage_abs_max": jnp.max(jnp.abs(adv_BxG)),
      "frac_groups_all_equal_reward": jnp.mean(
          jnp.all(r_BxG == r_BxG[:, :1], axis=-1).astype(jnp.float32)),
      "reward_mean": jnp.mean(r_BxG),
  }
  return loss, metrics


# Registry: every entry is (policy_token_logp_BxGxT, batch, cfg) -> (loss, metrics).
LossFn = Callable[[jax.Array, Mapping[str, jax.Array], LossConfig], tuple[jax.Array, Metrics]]


def _oapl_from_batch(policy_token_logp_BxGxT: jax.Array, batch: Mapping[str, jax.Array],
                     cfg: LossConfig) -> tuple[jax.Array, Metrics]:
  mask_BxGxT = batch["response_mask"]
  _check_shape("sampler_token_logp", batch["sampler_token_logp"], policy_token_logp_BxGxT.shape)
  seq = lambda x: sequence_logprob(  # noqa: E731
      x, mask_BxGxT, length_normalize=cfg.length_normalize)
  return oapl_loss(seq(policy_token_logp_BxGxT), seq(batch["sampler_token_logp"]),
                   batch["rewards"], beta1=cfg.beta1, beta2=cfg.beta2)


def _grpo_from_batch(policy_token_logp_BxGxT: jax.Array, batch: Mapping[str, jax.Array],
                     cfg: LossConfig) -> tuple[jax.Array, Metrics]:
  return grpo_loss(policy_token_logp_BxGxT, batch.get("old_policy_token_logp"),
                   batch["sampler_token_logp"], batch["response_mask"], batch["rewards"],
                   clip_eps=cfg.clip_eps, tis_cap=cfg.tis_cap)


def _sft_from_batch(policy_token_logp_BxGxT: jax.Array, batch: Mapping[str, jax.Array],
                    cfg: LossConfig) -> tuple[jax.Array, Metrics]:
  """Supervised warm start: mean negative log-likelihood of the response (demonstration) tokens."""
  del cfg
  mask_BxGxT = batch["response_mask"].astype(jnp.float32)
  n_tokens = jnp.maximum(jnp.sum(mask_BxGxT), 1.0)
  nll = -jnp.sum(jnp.where(mask_BxGxT > 0, policy_token_logp_BxGxT, 0.0)) / n_tokens
  return nll, {"nll": nll}


LOSSES: dict[str, LossFn] = {"oapl": _oapl_from_batch, "grpo": _grpo_from_batch, "sft": _sft_from_batch}


def compute_loss(name: str, policy_token_logp_BxGxT: jax.Array,
                 batch: Mapping[str, jax.Array], cfg: LossConfig) -> tuple[jax.Array, Metrics]:
  """Loss `name` from `LOSSES` on a batch with keys sampler_token_logp [B,G,T],
  response_mask [B,G,T], rewards [B,G] and optionally old_policy_token_logp [B,G,T]."""
  if name not in LOSSES:
    raise ValueError(f"unknown loss {name!r}; known losses: {sorted(LOSSES)}")
  return LOSSES[name](policy_token_logp_BxGxT, batch, cfg)
