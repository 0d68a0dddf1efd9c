"""Loss functions over arrays, selectable by name, each with its own typed settings.

Pure functions of log-probs and rewards; nothing here knows about models, the sampler or the
training loop. Shapes: B prompts, G samples per prompt, T tokens. All arithmetic is float32
whatever the input dtype; padded positions (response_mask 0) may hold anything, NaN included.

    settings = objectives.build_settings("opmd", {"tau": 0.5})      # -> OPMDSettings
    loss, metrics = objectives.compute_loss("opmd", policy_token_logp_BxGxT, batch, settings)

Batch keys, their dtypes, shapes and meanings: batch_fields.FIELDS. `LOSSES[name]` says which keys a loss
reads (`needs`, `optional`) and whether it compares the G samples of a prompt (`needs_groups`: a micro-batch
must then hold whole groups).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import jax

from oapl_jax import sections
from oapl_jax.objectives.asymre import AsymRESettings, asymre_from_batch, asymre_loss
from oapl_jax.objectives.batch_fields import FIELDS
from oapl_jax.objectives.checks import check_token_array
from oapl_jax.objectives.demo_sft import BoundLoss, with_demo_sft
from oapl_jax.objectives.grpo import GRPOSettings, grpo_advantages, grpo_from_batch, grpo_loss
from oapl_jax.objectives.m2po import M2POSettings, m2po_from_batch, m2po_loss, m2po_tau_squared
from oapl_jax.objectives.masking import sequence_logprob, token_mean
from oapl_jax.objectives.oapl import OAPLSettings, oapl_from_batch, oapl_loss, v_star, v_star_of_members
from oapl_jax.objectives.opmd import OPMDSettings, opmd_from_batch, opmd_loss
from oapl_jax.objectives.sft import SFTSettings, sft_from_batch, sft_loss

Metrics = dict[str, jax.Array]
Settings = Any  # one of the *Settings dataclasses
LossFn = Callable[[jax.Array, Mapping[str, jax.Array], Settings], tuple[jax.Array, Metrics]]

_TOKENS_AND_REWARDS = ("response_mask", "sampler_token_logp", "rewards")


@dataclasses.dataclass(frozen=True)
class LossSpec:
  fn: LossFn  # (policy_token_logp_BxGxT, batch, settings) -> (loss, metrics)
  settings_type: type
  needs_groups: bool  # advantages compare the G samples of a prompt
  needs: tuple[str, ...]  # batch keys the loss reads
  optional: tuple[str, ...] = ()  # batch keys it reads when present
  on_policy: bool = False  # its data must come from the current policy: the loop's sync_every must be 1


LOSSES: dict[str, LossSpec] = {
    "oapl": LossSpec(oapl_from_batch, OAPLSettings, True, _TOKENS_AND_REWARDS, ("demo_slots",)),
    "grpo": LossSpec(grpo_from_batch, GRPOSettings, True, _TOKENS_AND_REWARDS, ("old_policy_token_logp",)),
    # Same math as grpo: on-policy GRPO is the loop's schedule (sampler refreshed before every rollout
    # round, one optimizer step per round), named so that configs and reports tell the two apart and
    # a config that lags it (sync_every > 1) is refused.
    "grpo_onpolicy": LossSpec(grpo_from_batch, GRPOSettings, True, _TOKENS_AND_REWARDS,
                              ("old_policy_token_logp",), on_policy=True),
    "asymre": LossSpec(asymre_from_batch, AsymRESettings, True, ("response_mask", "rewards")),
    "opmd": LossSpec(opmd_from_batch, OPMDSettings, True, _TOKENS_AND_REWARDS),
    "m2po": LossSpec(m2po_from_batch, M2POSettings, True, _TOKENS_AND_REWARDS),
    "sft": LossSpec(sft_from_batch, SFTSettings, False, ("response_mask",)),
}


def loss_spec(name: str) -> LossSpec:
  if name not in LOSSES:
    raise ValueError(f"unknown loss {name!r}; known losses: {sorted(LOSSES)}")
  return LOSSES[name]


def build_settings(name: str, values: Optional[Mapping[str, Any]] = None, path: str = "",
                   problems: Optional[sections.Problems] = None) -> Settings:
  """The typed settings of loss `name` from a mapping (None: the defaults); every bad field is reported
  under `path` (sections.build)."""
  kind = loss_spec(name).settings_type
  own = problems is None
  problems = problems if problems is not None else sections.Problems()
  before = len(problems.errors)
  where = path or f"loss {name!r}"
  settings = sections.build(kind, values, where, problems)
  if settings is None and values:
    # __post_init__ stops at its first bad field, and does not run at all after a field rule fails: try each
    # field not yet named alone, so every bad one is reported (its error replaces the generic "where: ..." one)
    reported = problems.errors[before:]
    fields = []
    for key, value in dict(values.items()).items():
      if any(e.startswith((f"{where}.{key}=", f"{where}.{key}:")) for e in reported):
        continue
      try:
        kind(**{key: value})
      except (ValueError, TypeError) as e:
        fields.append(f"{where}.{key}={value!r}: {e}")
    if fields:
      problems.errors[before:] = [e for e in reported if not e.startswith(f"{where}: ")] + fields
  if own:
    problems.raise_if_any()
  return settings


def _typed_settings(name: str, spec: LossSpec, settings: Settings) -> Settings:
  if not isinstance(settings, spec.settings_type):
    raise TypeError(f"loss {name!r} takes {spec.settings_type.__name__}, got {type(settings).__name__}")
  return settings


def compute_loss(name: str, policy_token_logp_BxGxT: jax.Array, batch: Mapping[str, jax.Array],
                 settings: Settings) -> tuple[jax.Array, Metrics]:
  """Loss `name` of `LOSSES` on a batch (see the module docstring) -> (scalar float32 loss, metrics)."""
  spec = loss_spec(name)
  settings = _typed_settings(name, spec, settings)
  missing = [k for k in spec.needs if k not in batch]
  if missing:
    raise ValueError(f"loss {name!r} needs batch keys {missing}; the batch has {sorted(batch)}")
  shape = check_token_array("policy_token_logp_BxGxT", policy_token_logp_BxGxT)
  for key in spec.needs + tuple(k for k in spec.optional if k in batch):
    expected = FIELDS[key].shape(*shape)
    if tuple(batch[key].shape) != expected:
      raise ValueError(f"loss {name!r}: batch[{key!r}] has shape {tuple(batch[key].shape)}, expected {expected}")
  return spec.fn(policy_token_logp_BxGxT, batch, settings)


__all__ = [
    "LOSSES", "LossSpec", "loss_spec", "build_settings", "compute_loss", "BoundLoss", "with_demo_sft",
    "OAPLSettings", "GRPOSettings", "AsymRESettings", "OPMDSettings", "M2POSettings", "SFTSettings",
    "v_star", "v_star_of_members", "oapl_loss", "grpo_advantages", "grpo_loss", "asymre_loss", "opmd_loss",
    "m2po_loss", "m2po_tau_squared", "sft_loss", "sequence_logprob", "token_mean",
]
