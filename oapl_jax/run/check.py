"""The cross-section rules of a RunConfig: what no one section can know alone. Every problem at once.

    warnings = check(rc)                # raises sections.ConfigError; returns (and logs) warnings
    with warnings_logged() as seen: ... # every warning logged in the block (a dry run counts what it printed)
    warnings = check(rc, devices=topology_devices)   # a compile check's devices instead of this host's

Per-field rules live on the sections' fields (sections.rule) and each task checks its own section
through its registry entry (tasks/factory.TASKS); here: batch x mesh, model dims x mesh, lengths, the
loss's need for groups, the warm start's need for demonstrations, LoRA's rank x the layers' widths.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import math
import re
from typing import Any, Optional, Sequence

import jax

from oapl_jax import objectives, parallel, sections
from oapl_jax.models import api, factory, lora
from oapl_jax.run import schema
from oapl_jax.run.schema import RunConfig
from oapl_jax.tasks import factory as task_factory

log = logging.getLogger(__name__)
LARGE_LR = 0.1  # AdamW learning rates above this get a warning


def check(rc: RunConfig, devices: Optional[Sequence[Any]] = None, *, preset_when_absent: bool = False) -> list[str]:
  """preset_when_absent: a model checkpoint not on this host is read as its preset (a compile check)."""
  p = sections.Problems()
  p.errors.extend(task_factory.check_task(rc.task))
  if objectives.LOSSES[rc.trainer.loss].needs_groups and rc.loop.group_size < 2:
    p.add("loop.group_size", rc.loop.group_size,
          f"must be >= 2 (loss {rc.trainer.loss!r} compares the G samples of a prompt)")
  if objectives.LOSSES[rc.trainer.loss].on_policy and (rc.loop.sync_every > 1 or rc.loop.sampler_delay_windows):
    p.add("loop.sync_every", rc.loop.sync_every, f"must be 1 with loop.sampler_delay_windows=0 for the on-policy "
          f"loss {rc.trainer.loss!r} (a lagged sampler makes it off-policy: use loss 'grpo' for GRPO with a lag)")
  if rc.warmstart.steps and not getattr(rc.task, "has_demonstrations", True):
    p.add("warmstart.steps", rc.warmstart.steps, "a warm start needs task.demonstrations_path (records with "
          "task.prompt_key and task.completion_key)")
  if rc.loop.demo_fraction:
    if not getattr(rc.task, "has_demonstrations", True):
      p.add("loop.demo_fraction", rc.loop.demo_fraction, "needs task demonstrations (task.demonstrations_path)")
    if rc.sampler.top_p < 1 or rc.sampler.top_k > 0 or rc.sampler.temperature <= 0:
      p.add("loop.demo_fraction", rc.loop.demo_fraction, "needs unfiltered rollouts (sampler.top_p=1, top_k=0, "
            "temperature > 0): a demonstration's token outside the filter would have no sampler log-prob")
    if rc.is_offline:
      p.add("loop.demo_fraction", rc.loop.demo_fraction, "is not supported by the offline mode")
    if rc.loop.demo_use == "sft" and rc.trainer.loss != "oapl":
      p.add("loop.demo_use", rc.loop.demo_use, f"'sft' leaves the demonstrations out of the RL loss, which only "
            f"trainer.loss='oapl' supports (it is {rc.trainer.loss!r}); use 'buffer'")
    if rc.loop.demo_use == "sft" and round(rc.loop.demo_fraction * rc.loop.group_size) >= rc.loop.group_size:
      p.add("loop.demo_fraction", rc.loop.demo_fraction, f"with loop.demo_use='sft' leaves no sampled response "
            f"in a group of {rc.loop.group_size}")
  elif rc.loop.demo_use == "sft":
    p.add("loop.demo_use", rc.loop.demo_use, "needs loop.demo_fraction > 0 (the demonstrations it trains on)")
  if rc.trainer.lora.enabled and rc.is_offline:
    p.add("trainer.lora.rank", rc.trainer.lora.rank, "LoRA is not supported by the offline mode yet (its second "
          "stage rebuilds the trainer state from full params); set it to 0")
  if rc.model.remat_policy != "full" and not rc.model.remat:
    p.warnings.append(f"model.remat_policy={rc.model.remat_policy!r} has no effect with model.remat=False")
  for where, optim in (("trainer", rc.trainer.optim), ("warmstart", rc.warmstart.optim)):
    if optim.lr > LARGE_LR:
      p.warnings.append(f"{where}.optim.lr={optim.lr}: unusually large for AdamW (typical 1e-6 .. 1e-3); "
                        "expect divergence")
  try:
    model = factory.architecture(rc.model, preset_when_absent=preset_when_absent)
  except ValueError as e:
    model = None
    p.errors.append(str(e) if str(e).startswith("model.") else f"model.overrides: {e}")
  if model is not None and rc.trainer.lora.enabled:
    _lora_rank(rc, model, p)
  placement = _placement(rc, list(devices if devices is not None else jax.devices()), p)
  if placement is not None:
    _shards(rc, placement, model, p)
  longest = max(rc.sampler.max_new_tokens, rc.eval.max_new_tokens)
  if model is not None and rc.sampler.max_prefill_length + longest > model.max_position_embeddings:
    p.warnings.append(f"sampler.max_prefill_length={rc.sampler.max_prefill_length} + max_new_tokens={longest} "
                      f"exceeds the model's max_position_embeddings={model.max_position_embeddings}")
  p.raise_if_any()
  for w in p.warnings:
    log.warning("config: %s", w)
  return p.warnings


class _Collect(logging.Handler):
  def __init__(self, into: list[str]):
    super().__init__(logging.WARNING)
    self.into = into

  def emit(self, record: logging.LogRecord) -> None:
    self.into.append(record.getMessage())


@contextlib.contextmanager
def warnings_logged():
  """The messages of every WARNING or worse logged inside the block, from any logger that reaches the root (the
  config's rules here, the task's data checks, its reward's probe): what a dry run prints, so what it counts."""
  seen: list[str] = []
  handler = _Collect(seen)
  logging.getLogger().addHandler(handler)
  try:
    yield seen
  finally:
    logging.getLogger().removeHandler(handler)


def _lora_rank(rc: RunConfig, model, p: sections.Problems) -> None:
  """A rank at or above a target's min(d_in, d_out) adapts nothing a full update would not, at more cost."""
  try:
    oversized = lora.oversized_targets(rc.trainer.lora, api.for_config(model))
  except ValueError as e:
    p.add("trainer.lora.targets", rc.trainer.lora.targets, str(e))
    return
  if oversized:
    p.add("trainer.lora.rank", rc.trainer.lora.rank, "must be below min(d_in, d_out) of every target layer; "
          f"it is not for {', '.join(oversized)}")


def _placement(rc: RunConfig, devices: list, p: sections.Problems) -> Optional[parallel.Placement]:
  total, n, before = len(devices), rc.mesh.sampler_devices, len(p.errors)
  if n >= total:
    p.add("mesh.sampler_devices", n, f"must be in [0, {total - 1}] ({total} devices)")
    return None
  for side, count in (("trainer", total - n if n else total), ("sampler", n or total)):
    ici = getattr(rc.mesh, f"{side}_ici")
    fixed = math.prod(s for s in ici if s != -1)
    if (count % fixed) if -1 in ici else (fixed != count):
      p.add(f"mesh.{side}_ici", ici, f"cannot tile the {side}'s {count} device(s) ({total} devices, "
            f"mesh.sampler_devices={n})")
  if len(p.errors) > before:
    return None
  try:
    return parallel.placement_from_config(rc.mesh, devices)
  except ValueError as e:
    p.add("mesh", sections.MISSING, str(e))
    return None


def _shards(rc: RunConfig, placement: parallel.Placement, model, p: sections.Problems) -> None:
  """Everything split over devices must split evenly (a JAX IndivisibleError otherwise)."""
  batch = placement.trainer.axis_size("batch")
  B, micro, G = rc.loop.batch_prompts, rc.trainer.micro_batches, rc.loop.group_size
  if B % micro or (B // micro * G) % batch:
    p.add("loop.batch_prompts", B, f"must split into trainer.micro_batches={micro} micro-batches whose "
          f"{B // micro * G} sequences (prompts x loop.group_size={G}) divide over the {batch} devices the "
          f"trainer mesh {dict(placement.trainer.mesh.shape)} splits the batch over")
  if rc.warmstart.steps and rc.warmstart.batch_size % batch:
    p.add("warmstart.batch_size", rc.warmstart.batch_size,
          f"must be a multiple of the {batch} devices the trainer splits the batch over")
  cache_batch = placement.sampler.axis_size("cache_batch")
  if rc.sampler.num_slots % cache_batch:
    p.add("sampler.num_slots", rc.sampler.num_slots, f"must be a multiple of the {cache_batch} devices the sampler "
          f"mesh {dict(placement.sampler.mesh.shape)} splits its slots over")
  if model is None:
    return
  dims = dict(embed=("hidden_size", model.hidden_size), mlp=("intermediate_size", model.intermediate_size),
              q_heads=("num_heads", model.num_heads), kv_heads=("num_kv_heads", model.num_kv_heads),
              cache_kv_heads=("num_kv_heads", model.num_kv_heads), vocab=("vocab_size", model.vocab_size),
              head_dim=("head_dim", model.head_dim), layers=("num_layers", model.num_layers))
  for side, layout in (("trainer", placement.trainer), ("sampler", placement.sampler)):
    for axis, (field, size) in dims.items():
      ways = layout.axis_size(axis)
      if size % ways and not (side == "trainer" and axis == "cache_kv_heads"):
        p.add(f"model {field}", size, f"does not divide over the {ways} ways the {side} mesh "
              f"{dict(layout.mesh.shape)} splits {axis!r} (mesh.{side}_ici, mesh.rules)")


def validate(cfg: Any, devices: Optional[Sequence[Any]] = None) -> list[str]:
  """The front door's whole check of a resolved config: the typed sections (schema.from_config), then the
  cross-section rules; returns the warnings, raises sections.ConfigError. With bad fields, the cross-section
  rules still run, on the config with those fields at their defaults, so every problem is listed at once."""
  try:
    rc = schema.from_config(cfg)
  except sections.ConfigError as e:
    raise sections.ConfigError(e.problems + _cross_section_problems(cfg, e.problems, devices)) from None
  return check(rc, devices)


def _cross_section_problems(cfg: Any, field_problems: Sequence[str], devices) -> list[str]:
  """check()'s errors for `cfg` with every field a problem names set back to its default (none where that
  cannot be typed either: a bad task section, say)."""
  values = copy.deepcopy(cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg))
  base = schema.defaults().to_dict()
  named = set()
  for problem in field_problems:
    *parents, last = re.split(r"[=:]", problem, maxsplit=1)[0].strip().split(".")
    named.add(".".join([*parents, last]))
    target, default = values, base
    for part in parents:
      target, default = target.get(part), (default or {}).get(part)
      if not isinstance(target, dict):
        return []
    if isinstance(default, dict) and last in default:
      target[last] = default[last]
    else:
      target.pop(last, None)
  try:
    rc = schema.from_config(values)
    logging.disable(logging.WARNING)  # the warnings of this pass are the next run's to give
    check(rc, devices)
  except sections.ConfigError as e:
    return [q for q in e.problems if re.split(r"[=:]", q, maxsplit=1)[0].strip() not in named]
  except Exception:  # noqa: BLE001 - a config the defaults cannot repair: the field problems stand alone
    return []
  finally:
    logging.disable(logging.NOTSET)
  return []
