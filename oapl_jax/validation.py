"""Validation before compute: the whole resolved config, then every problem set, before a model is built.

    warnings = validate_config(cfg)           # raises ConfigError listing every problem, each naming its field
    task, counts = validate_task(cfg, task)   # empty sets, oversized prompts, duplicates, demonstrations
    problems, counts = validate_problems(problems, where="task.train_path /d/train.jsonl", max_prompt_tokens=1024)
    # (those two live in tasks/problem_checks.py; this module is the one entry point)

Messages read "loop.sync_every=-1: must be >= 1". Warnings are returned (and logged), never raised:
lengths past the model's max_position_embeddings (RoPE extrapolates; quality may not), an unusually
large learning rate, eval prompts that also appear in the training set. The optional `validation`
config section picks what happens to oversized prompts ("error" | "skip") and duplicates ("keep" | "drop").
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import numbers
import os
from typing import Any, Sequence

import jax

from oapl_jax import objectives, parallel
from oapl_jax.models import config as model_config
from oapl_jax.models.attention import IMPLEMENTATIONS
from oapl_jax.models import hf
from oapl_jax.rl import trainer
from oapl_jax.rl.monitors import MonitorConfig
from oapl_jax.rl.optim import OptimConfig
from oapl_jax.rl.warmstart import WarmStartConfig
from oapl_jax.tasks import arithmetic, factory, rewards
from oapl_jax.tasks.problem_checks import VALIDATION_DEFAULTS, validate_problems, validate_task
from oapl_jax.tasks.sources import DataError

log = logging.getLogger(__name__)
_MISSING = object()
LARGE_LR = 0.1  # AdamW learning rates above this get a warning
# Integer fields and their least value (config_base.py documents each).
_INTEGERS = {"seed": 0, "warmstart.steps": 0, "sampler.num_slots": 1, "sampler.max_prefill_length": 1,
             **{f"loop.{k}": 1 for k in ("sync_every", "steps_per_rollout", "num_syncs", "eval_every_syncs",
                                         "batch_prompts", "prompts_per_rollout")},
             "loop.stop_after_syncs": 0, "eval.num_prompts": 1, "eval.samples": 1, "checkpoint.every_syncs": 1,
             "checkpoint.max_to_keep": 1}
__all__ = ["ConfigError", "DataError", "validate_config", "validate_problems", "validate_task", "VALIDATION_DEFAULTS"]


class ConfigError(ValueError):
  """Every problem found in a config, one per line, each naming its field."""

  def __init__(self, problems: Sequence[str]):
    self.problems = list(dict.fromkeys(problems))  # a field read twice is reported once
    super().__init__(f"{len(self.problems)} problem(s) in the config:\n  " + "\n  ".join(self.problems))


def _finite_real(v: Any) -> bool:
  try:
    return not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(v)
  except OverflowError:  # an integer too large for a float
    return False


def _fields(kind) -> set[str]:
  return {f.name for f in dataclasses.fields(kind)}


def _bounds(low, high, low_open=False, high_open=False) -> str:
  if high is None:
    return f"{'>' if low_open else '>='} {low}"
  return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def _within(v, low, high, low_open=False, high_open=False) -> bool:
  above = low is None or (v > low if low_open else v >= low)
  return above and (high is None or (v < high if high_open else v <= high))


class _Report:
  """Reads fields by dotted path and collects 'field=value: why' problems; a check returns the value
  when it passes, else None."""

  def __init__(self, cfg):
    self.cfg, self.errors, self.warnings = cfg, [], []

  def fail(self, path: str, value: Any, why: str) -> None:
    shown = repr(tuple(value) if isinstance(value, list) else value)[:80]  # a list from the command line as a tuple
    self.errors.append(f"{path}={shown}: {why}" if value is not _MISSING else f"{path}: {why}")

  def value(self, path: str) -> Any:
    node = self.cfg
    for part in path.split("."):
      try:
        node = node[part]
      except (KeyError, TypeError, IndexError, AttributeError):
        self.fail(path, _MISSING, "missing from the config")
        return _MISSING
    return node

  def check(self, path: str, ok, why) -> Any:
    """`why` may be a function of the value, for messages that depend on what is wrong."""
    v = self.value(path)
    if v is not _MISSING and not ok(v):
      self.fail(path, v, why(v) if callable(why) else why)
    return None if v is _MISSING or not ok(v) else v

  def integer(self, path, low=None, high=None) -> int | None:
    bounds = "" if low is None else f" {_bounds(low, high)}"
    is_int = lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)  # noqa: E731
    v = self.check(path, lambda v: is_int(v) and _within(v, low, high),
                   lambda v: f"must be {bounds.strip()}" if is_int(v) else f"must be an integer{bounds}")
    return None if v is None else int(v)

  def real(self, path, low, high=None, low_open=False, high_open=False) -> float | None:
    bounds = _bounds(low, high, low_open, high_open)
    v = self.check(path, lambda v: _finite_real(v) and _within(v, low, high, low_open, high_open),
                   lambda v: f"must be {bounds}" if _finite_real(v) else f"must be a finite number {bounds}")
    return None if v is None else float(v)

  def choice(self, path, choices) -> Any:
    return self.check(path, lambda v: isinstance(v, (str, bool, type(None))) and v in choices,
                      f"must be one of {sorted(choices, key=str)}")

  def text(self, path) -> str | None:
    return self.check(path, lambda v: isinstance(v, str), "must be a string")

  def mapping(self, path) -> dict | None:
    v = self.check(path, lambda v: callable(getattr(v, "items", None)), "must be a mapping")
    return None if v is None else dict(v.items())

  def only_keys(self, path, known) -> dict | None:
    """The section at `path`, with any key the typed config built from it would reject reported."""
    section = self.mapping(path)
    for key in sorted(set(section or {}) - set(known), key=str):
      self.fail(f"{path}.{key}", _MISSING, f"unknown setting; known: {sorted(known)}")
    return section


# ------------------------------------------------------------------------------------------------ sections
def _check_optim(r: _Report, prefix: str, auto_total_steps: bool) -> float | None:
  if r.only_keys(prefix, _fields(OptimConfig)) is None:
    return None
  lr = r.real(f"{prefix}.lr", 0, low_open=True)
  if lr is not None and lr > LARGE_LR:
    r.warnings.append(f"{prefix}.lr={lr}: unusually large for AdamW (typical 1e-6 .. 1e-3); expect divergence")
  r.real(f"{prefix}.b1", 0, 1, high_open=True)
  r.real(f"{prefix}.b2", 0, 1, high_open=True)
  r.real(f"{prefix}.eps", 0, low_open=True)
  r.real(f"{prefix}.weight_decay", 0)
  r.real(f"{prefix}.max_grad_norm", 0)
  r.real(f"{prefix}.warmup_ratio", 0, 1, high_open=True)
  r.real(f"{prefix}.min_ratio", 0, 1)
  total = r.integer(f"{prefix}.total_steps", 0)
  if r.choice(f"{prefix}.schedule", ("constant", "cosine")) == "cosine" and total == 0 and not auto_total_steps:
    r.fail(f"{prefix}.schedule", "cosine", f"needs {prefix}.total_steps >= 1 (it is 0)")
  return lr


def _check_loss(r: _Report) -> objectives.LossSpec | None:
  r.only_keys("trainer", _fields(trainer.TrainConfig) - {"temperature"})  # the sampler's temperature is used
  loss = r.choice("trainer.loss", tuple(objectives.LOSSES))
  r.integer("trainer.micro_batches", 1)
  if loss is None:
    return None
  spec = objectives.LOSSES[loss]
  every = r.mapping("trainer.loss_settings")  # {loss name: its settings}; the chosen one is [trainer.loss]
  if every is None:
    return spec
  for name in sorted(set(every) - set(objectives.LOSSES), key=str):
    r.fail(f"trainer.loss_settings.{name}", _MISSING, f"not a loss; known: {sorted(objectives.LOSSES)}")
  path = f"trainer.loss_settings.{loss}"
  values = r.mapping(path) if every.get(loss) is not None else {}
  errors = len(r.errors)
  for key, value in (values or {}).items():  # one at a time, so every bad field is reported
    try:
      objectives.settings_from_config(loss, {key: value})
    except (ValueError, TypeError) as e:
      r.fail(f"{path}.{key}", value, str(e))
  if len(r.errors) == errors and values is not None:
    try:  # relations between the fields, if a loss has any
      objectives.settings_from_config(loss, values)
    except (ValueError, TypeError) as e:
      r.fail(path, _MISSING, str(e))
  return spec


def _check_sampling(r: _Report, prefix: str, greedy_ok: bool) -> int | None:
  r.real(f"{prefix}.temperature", 0, low_open=not greedy_ok)
  if not greedy_ok and r.value(f"{prefix}.temperature") == 0:
    r.errors[-1] += " (the trainer's log-probs use logits / temperature)"
  r.real(f"{prefix}.top_p", 0, 1, low_open=True)
  for key in ("top_k", "steps_per_sync"):
    if key in (r.mapping(prefix) or {}):
      r.integer(f"{prefix}.{key}", 0 if key == "top_k" else 1)
  return r.integer(f"{prefix}.max_new_tokens", 1)


def _check_monitors(r: _Report) -> None:
  """The optional `monitors` section (rl/monitors.MonitorConfig; an absent key keeps its default)."""
  reals = dict(loss_explosion_factor=(1, None, True), entropy_floor=(0,), max_reward_failure_fraction=(0, 1))
  for key in set(r.only_keys("monitors", _fields(MonitorConfig)) or {}) & _fields(MonitorConfig):
    r.real(f"monitors.{key}", *reals[key]) if key in reals else r.integer(f"monitors.{key}", 1)


def _check_model(r: _Report) -> model_config.QwenConfig | None:
  """Checks the model section; returns the architecture when it can be known without loading weights."""
  dtypes, errors = sorted(model_config._DTYPES), len(r.errors)  # pylint: disable=protected-access
  for path in ("model.param_dtype", "model.dtype", "sampler.dtype"):
    r.choice(path, dtypes)
  r.choice("model.remat", (True, False))
  if r.value("model.attention") is not _MISSING:
    r.choice("model.attention", IMPLEMENTATIONS)
  checkpoint = r.text("model.checkpoint")
  if checkpoint:
    path = os.path.expanduser(checkpoint)
    if not os.path.isdir(path):
      r.fail("model.checkpoint", checkpoint, "not a directory")
      return None
    try:
      with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        return hf.config_from_hf(json.load(f), os.path.join(path, "config.json"))
    except (OSError, ValueError, TypeError, AttributeError) as e:
      r.fail("model.checkpoint", checkpoint, f"unreadable config.json ({type(e).__name__}: {e})")
      return None
  name, overrides = r.choice("model.preset", tuple(model_config.PRESETS)), r.mapping("model.overrides")
  if name is None or overrides is None:
    return None
  base = model_config.PRESETS[name]()
  for key in overrides:
    kind = type(getattr(base, key, None)) if isinstance(key, str) else None
    if kind is bool:
      r.choice(f"model.overrides.{key}", (True, False))
    elif kind is int:
      r.integer(f"model.overrides.{key}", 1)
    elif kind is float:
      r.real(f"model.overrides.{key}", 0, low_open=True)
    elif kind is not str:
      r.fail(f"model.overrides.{key}", _MISSING, f"not a model setting; known: {sorted(_fields(type(base)))}")
  if len(r.errors) > errors:
    return None
  try:
    return model_config.preset(name, **overrides, param_dtype=r.value("model.param_dtype"),
                               dtype=r.value("model.dtype"), remat=bool(r.value("model.remat")))
  except (ValueError, TypeError) as e:
    r.fail("model.overrides", _MISSING, str(e))
    return None


def _check_task(r: _Report) -> None:
  name = r.text("task.name")
  if name is None:
    return
  if ":" in name:
    package = name.partition(":")[0].split(".")[0]
    if not package.isidentifier() or importlib.util.find_spec(package) is None:
      r.fail("task.name", name, f"package {package!r} cannot be imported")
  elif name not in factory.TASKS:
    r.fail("task.name", name, f"must be one of {sorted(factory.TASKS)} or 'package.module:function'")
  elif name == "arithmetic":
    for key in ("num_digits", "num_train", "num_held_out"):
      r.integer(f"task.{key}", 1)
    r.real("task.teacher_slip_rate", 0, 1)
    ops = r.value("task.operations")
    if ops is not _MISSING and not (isinstance(ops, (tuple, list)) and ops
                                    and all(isinstance(o, str) and o in arithmetic.OPERATIONS for o in ops)):
      r.fail("task.operations", ops, f"must be a non-empty tuple of {sorted(arithmetic.OPERATIONS)}")
  elif name == "chat":
    tokenizer_dir = r.text("task.tokenizer_dir")
    if tokenizer_dir is not None and not os.path.isdir(os.path.expanduser(tokenizer_dir)):
      r.fail("task.tokenizer_dir", tokenizer_dir, "not a directory (point it at the model's HF checkpoint)")
    _check_sources(r)
    r.choice("task.reward", tuple(rewards.REWARDS))
    r.integer("task.reward_workers", 1)
    r.real("task.reward_timeout_s", 0, low_open=True)
    r.integer("task.max_train", 0)
  elif name == "records":
    _check_records_task(r)
  elif name == "code_synthetic":
    r.integer("task.num_digits", 1, 3)
    for key in ("num_train", "num_held_out", "teacher_copies", "reward_workers"):
      r.integer(f"task.{key}", 1)
    r.real("task.held_out_fraction", 0, 1, low_open=True, high_open=True)
    r.real("task.teacher_slip_rate", 0, 1)
    r.real("task.reward_timeout_s", 0, low_open=True)


def _check_sources(r: _Report, extra: Sequence[str] = ()) -> None:
  sources = {"task.train_path": r.text("task.train_path")}
  sources.update({f"task.eval_paths.{k}": v for k, v in (r.mapping("task.eval_paths") or {}).items()})
  sources.update({f"task.{field}": r.value(f"task.{field}") for field in extra})
  for field, spec in sources.items():
    if not isinstance(spec, str):
      r.fail(field, spec, "must be a path or 'tfds:NAME/SPLIT'")
    elif not spec.startswith("tfds:") and not os.path.isfile(os.path.expanduser(spec)):
      r.fail(field, spec, "no such file")


def _check_records_task(r: _Report) -> None:
  demos = r.value("task.demonstrations_path")
  _check_sources(r, ["demonstrations_path"] if demos else [])
  tokenizer = r.text("task.tokenizer")
  if tokenizer is not None and tokenizer != "chars" and not os.path.isdir(os.path.expanduser(tokenizer)):
    r.fail("task.tokenizer", tokenizer, "must be 'chars' or an HF checkpoint directory")
  reward = r.text("task.reward")
  if reward is not None and ":" in reward:
    try:
      rewards.import_score(reward)
    except ValueError as e:
      r.fail("task.reward", reward, str(e))
  elif reward is not None and reward not in rewards.REWARDS:
    r.fail("task.reward", reward, f"must be one of {sorted(rewards.REWARDS)} or 'package.module:function'")
  for key in ("prompt_key", "completion_key"):
    r.text(f"task.{key}")
  r.integer("task.max_train", 0)
  r.real("task.unfinished_reward", -1e9)
  steps = r.value("warmstart.steps")
  if isinstance(steps, int) and steps > 0 and not demos:
    r.fail("warmstart.steps", steps, "a warm start needs task.demonstrations_path (records with "
           "task.prompt_key and task.completion_key)")


def _check_mesh(r: _Report) -> parallel.Placement | None:
  total = jax.device_count()
  ok = True
  for side in ("trainer", "sampler"):
    for kind in ("ici", "dcn"):
      path = f"mesh.{side}_{kind}"
      sizes = r.value(path)
      if sizes is _MISSING:
        ok = False
      elif (not isinstance(sizes, (tuple, list)) or len(sizes) != 3
            or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or (s < 1 and s != -1) for s in sizes)
            or list(sizes).count(-1) > 1):
        r.fail(path, sizes, f"must be 3 sizes for {parallel.MESH_AXES}, each >= 1 or one -1 (fill)")
        ok = False
  n = r.integer("mesh.sampler_devices", 0, total - 1)
  for name, axes in (r.mapping("mesh.rules") or {}).items():
    listed = (axes,) if isinstance(axes, str) or axes is None else tuple(axes) if isinstance(axes, (list, tuple)) \
        else ()
    if not listed or any(a is not None and a not in parallel.MESH_AXES for a in listed):
      r.fail(f"mesh.rules.{name}", axes, f"must be None, one of {parallel.MESH_AXES} or a list of them")
      ok = False
  if not ok or n is None:
    return None
  side_devices = {"trainer": total - n if n else total, "sampler": n or total}
  for side, count in side_devices.items():
    ici = [int(s) for s in r.value(f"mesh.{side}_ici")]
    fixed = math.prod(s for s in ici if s != -1)
    if (count % fixed) if -1 in ici else (fixed != count):
      r.fail(f"mesh.{side}_ici", ici, f"cannot tile the {side}'s {count} device(s) (jax.device_count()={total}, "
             f"mesh.sampler_devices={n})")
  if len(r.errors) and any(e.startswith("mesh.") for e in r.errors):
    return None
  try:
    return parallel.placement_from_config(r.value("mesh"))
  except ValueError as e:
    r.fail("mesh", _MISSING, str(e))
    return None


def _check_shards(r: _Report, placement: parallel.Placement, model: model_config.QwenConfig | None) -> None:
  """Everything that is split over devices must split evenly (a JAX IndivisibleError otherwise)."""
  batch = placement.trainer.axis_size("batch")
  B, micro, G = (r.value(p) for p in ("loop.batch_prompts", "trainer.micro_batches", "loop.group_size"))
  if all(isinstance(v, int) and v >= 1 for v in (B, micro, G)) and (B % micro or (B // micro * G) % batch):
    r.fail("loop.batch_prompts", B, f"must split into trainer.micro_batches={micro} micro-batches whose "
           f"{B // micro * G} sequences (prompts x loop.group_size={G}) divide over the {batch} devices the "
           f"trainer mesh {dict(placement.trainer.mesh.shape)} splits the batch over")
  steps, warm_batch = r.value("warmstart.steps"), r.value("warmstart.batch_size")
  if isinstance(steps, int) and steps > 0 and isinstance(warm_batch, int) and warm_batch >= 1 and warm_batch % batch:
    r.fail("warmstart.batch_size", warm_batch,
           f"must be a multiple of the {batch} devices the trainer splits the batch over")
  slots, cache_batch = r.value("sampler.num_slots"), placement.sampler.axis_size("cache_batch")
  if isinstance(slots, int) and slots >= 1 and slots % cache_batch:
    r.fail("sampler.num_slots", slots, f"must be a multiple of the {cache_batch} devices the sampler mesh "
           f"{dict(placement.sampler.mesh.shape)} splits its slots over")
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
        r.fail(f"model {field}", size, f"does not divide over the {ways} ways the {side} mesh "
               f"{dict(layout.mesh.shape)} splits {axis!r} (mesh.{side}_ici, mesh.rules)")


def validate_config(cfg) -> list[str]:
  """Checks a resolved experiment config (ConfigDict or nested dicts) before anything is built.

  Returns warnings (also logged); raises ConfigError listing every problem at once."""
  r = _Report(cfg)
  n = {path: r.integer(path, low) for path, low in _INTEGERS.items()}
  model = _check_model(r)
  _check_task(r)
  spec = _check_loss(r)
  _check_optim(r, "trainer.optim", auto_total_steps=False)
  r.only_keys("warmstart", _fields(WarmStartConfig))
  if n["warmstart.steps"]:
    r.integer("warmstart.batch_size", 1)
  _check_optim(r, "warmstart.optim", auto_total_steps=True)
  sampler_new = _check_sampling(r, "sampler", greedy_ok=False)
  eval_new = _check_sampling(r, "eval", greedy_ok=True)
  r.choice("sampler.grow_cache", (True, False))
  B, P = n["loop.batch_prompts"], n["loop.prompts_per_rollout"]
  G = r.integer("loop.group_size", 2 if spec is not None and spec.needs_groups else 1)
  if G is None and spec is not None and spec.needs_groups and r.value("loop.group_size") == 1:
    r.errors[-1] += f" (loss {r.value('trainer.loss')!r} compares the G samples of a prompt)"
  if B is not None and P is not None and B > P:
    r.fail("loop.batch_prompts", B, f"exceeds loop.prompts_per_rollout={P}: a step would need groups from "
           "chunks not yet visible")
  samples, ks = n["eval.samples"], r.value("eval.ks")
  if ks is not _MISSING and (not isinstance(ks, (tuple, list)) or not ks or any(
      isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1 for x in ks)):
    r.fail("eval.ks", ks, "must be a non-empty tuple of integers >= 1")
  elif ks is not _MISSING and samples is not None and max(ks) > samples:
    r.fail("eval.ks", ks, f"pass@k needs k <= eval.samples={samples}")
  if "monitors" in cfg:
    _check_monitors(r)
  if "validation" in cfg:
    r.choice("validation.on_oversized", ("error", "skip"))
    r.choice("validation.on_duplicates", ("keep", "drop"))
  placement = _check_mesh(r)
  if placement is not None:
    _check_shards(r, placement, model)
  longest = max(n for n in (sampler_new, eval_new, 0) if n is not None)
  prefill = n["sampler.max_prefill_length"]
  if model is not None and prefill is not None and prefill + longest > model.max_position_embeddings:
    r.warnings.append(f"sampler.max_prefill_length={prefill} + max_new_tokens={longest} exceeds the model's "
                      f"max_position_embeddings={model.max_position_embeddings}")
  if r.errors:
    raise ConfigError(r.errors)
  for w in r.warnings:
    log.warning("config: %s", w)
  return r.warnings
