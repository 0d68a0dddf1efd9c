"""loop.demo_use='sft' as a loss wrapper: the batch's demonstration slots (demo_slots [B,G], 1 on a demonstration)
trained by their token-mean NLL, `weight` times, beside the wrapped loss on the other slots (a loss that reads
demo_slots, OAPL's, leaves those slots out of its own terms). The control for demonstrations in the buffer.

    loss_fn = demo_sft.with_demo_sft(functools.partial(objectives.compute_loss, "oapl"), weight=0.5)
    loss, metrics = loss_fn(policy_token_logp_BxGxT, batch, settings)   # metrics gain demo_nll
"""
from typing import Any, Callable, Mapping

import jax

from oapl_jax.objectives.sft import sft_loss

# (policy_token_logp_BxGxT, batch, settings) -> (loss, metrics): objectives.compute_loss with its name bound
BoundLoss = Callable[[jax.Array, Mapping[str, jax.Array], Any], tuple[jax.Array, dict[str, jax.Array]]]


def with_demo_sft(loss_fn: BoundLoss, weight: float) -> BoundLoss:
  """`loss_fn` plus `weight` x the token-mean NLL of the demonstration slots' responses (metric demo_nll)."""
  def loss(policy_token_logp_BxGxT, batch, settings):
    rl, metrics = loss_fn(policy_token_logp_BxGxT, batch, settings)
    demo_mask_BxGxT = batch["response_mask"] * batch["demo_slots"][..., None]
    nll, _ = sft_loss(policy_token_logp_BxGxT, demo_mask_BxGxT)
    return rl + weight * nll, {**metrics, "demo_nll": nll}
  return loss
