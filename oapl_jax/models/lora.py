"""LoRA adapters on a model's projection kernels, as pure functions of params trees.

    settings = LoraSettings(rank=8, alpha=16, targets=("q_proj", "v_proj"))
    adapters = init_adapters(settings, model, params, rng)   # {"layers": {"attn": {"q_proj": {"lora_a", "lora_b"}}}}
    merged = merge(settings, model, params, adapters)         # W + (alpha / rank) * A @ B; the params' own tree
    logp = model.token_logprobs(params, ..., lora=scaled(settings, adapters))   # the same, in-layer (training)

A kernel is [lead..., in..., out...] (lead: the scanned 'layers' axis); its adapter is A [lead..., in..., r]
and B [lead..., r, out...], found from the kernel's logical axis names and the family's
`lora_inputs()` (which names are a projection's input axes). peft's convention: A ~ U(+-1/sqrt(fan_in)),
B = 0, so the merged weights equal the base at step 0; scale = alpha / rank. The trainer holds the base
frozen and optimizes only the adapters, applied inside the layers (x·W + x·A·B: no merged weights or
full-size weight gradient); the sampler's snapshot is the merged tree, so its lag is exact.
"""
import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from oapl_jax import sections

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraSettings:
  """The `trainer.lora` section: rank 0 = full fine-tuning (no adapters)."""
  rank: int = sections.rule(0, low=0)  # the adapters' inner dimension
  alpha: float = sections.rule(16.0, low=0, low_open=True)  # the adapters' update is scaled by alpha / rank
  targets: tuple[str, ...] = sections.rule(("q_proj", "k_proj", "v_proj", "o_proj"), choices=PROJECTIONS,
                                           nonempty=True)  # the projections that get adapters

  def __post_init__(self):
    sections.enforce(self)

  @property
  def enabled(self) -> bool:
    return self.rank > 0

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def _targets(settings: LoraSettings, model) -> dict[tuple, tuple[int, int, tuple]]:
  """{path of a targeted kernel's module: (lead dims, input dims, the kernel's logical axes)}."""
  key = (settings, model.config)
  if key not in _TARGETS:
    _TARGETS[key] = _find_targets(settings, model)
  return _TARGETS[key]


_TARGETS: dict = {}  # (settings, model config) -> _find_targets, which traces the model's init once


def _find_targets(settings: LoraSettings, model) -> dict[tuple, tuple[int, int, tuple]]:
  inputs = model.lora_inputs()
  axes = model.param_logical_axes()
  found = {}
  for path, spec in jax.tree_util.tree_flatten_with_path(axes, is_leaf=lambda x: isinstance(x, P))[0]:
    names = tuple(k.key for k in path)
    if names[-1] != "kernel" or names[-2] not in settings.targets:
      continue
    wanted = inputs[names[-2]]
    for lead in range(len(spec)):
      if tuple(spec[lead:lead + len(wanted)]) == tuple(wanted):
        found[names[:-1]] = (lead, len(wanted), tuple(spec))
        break
    else:
      raise ValueError(f"{'/'.join(names)}: axes {tuple(spec)} do not hold the input axes {wanted}")
  missing = set(settings.targets) - {p[-1] for p in found}
  if missing:
    raise ValueError(f"trainer.lora.targets names {sorted(missing)}, which this model does not have")
  return found


def oversized_targets(settings: LoraSettings, model) -> list[str]:
  """'path (d_in -> d_out)' of every targeted kernel with min(d_in, d_out) <= rank: there an adapter is no smaller
  than the layer it adapts. Raises ValueError when a target is not in the model."""
  shapes = nn.unbox(jax.eval_shape(model.init_params, jax.random.PRNGKey(0)))
  out = []
  for path, (lead, n_in, _) in sorted(_targets(settings, model).items()):
    shape = _at(shapes, path)["kernel"].shape
    d_in, d_out = math.prod(shape[lead:lead + n_in]), math.prod(shape[lead + n_in:])
    if settings.rank >= min(d_in, d_out):
      out.append(f"{'/'.join(path)} ({d_in} -> {d_out})")
  return out


def _nest(flat: dict[tuple, Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    for name in path[:-1]:
      node = node.setdefault(name, {})
    node[path[-1]] = value
  return tree


def _at(tree, path):
  for name in path:
    tree = tree[name]
  return tree


def logical_axes(settings: LoraSettings, model) -> dict:
  """PartitionSpecs of the adapters: A keeps the kernel's lead and input axes, B its lead and output axes;
  the rank axis is replicated."""
  out = {}
  for path, (lead, n_in, spec) in _targets(settings, model).items():
    out[path] = {"lora_a": P(*spec[:lead + n_in], None), "lora_b": P(*spec[:lead], None, *spec[lead + n_in:])}
  return _nest(out)


def init_adapters(settings: LoraSettings, model, params, rng) -> dict:
  """A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (peft's kaiming-uniform with a = sqrt(5)), B = 0; in the kernels'
  dtype. `params` may be abstract (jax.ShapeDtypeStruct) or boxed."""
  params = nn.unbox(params)
  out = {}
  for i, (path, (lead, n_in, _)) in enumerate(sorted(_targets(settings, model).items())):
    kernel = _at(params, path)["kernel"]
    shape = kernel.shape
    fan_in = math.prod(shape[lead:lead + n_in])
    bound = 1.0 / math.sqrt(fan_in)
    a = jax.random.uniform(jax.random.fold_in(rng, i), (*shape[:lead + n_in], settings.rank), jnp.float32,
                           -bound, bound)
    out[path] = {"lora_a": a.astype(kernel.dtype),
                 "lora_b": jnp.zeros((*shape[:lead], settings.rank, *shape[lead + n_in:]), kernel.dtype)}
  return _nest(out)


def delta(settings: LoraSettings, a, b, lead: int, n_in: int):
  """scale * A @ B in float32, shaped like the kernel [lead..., in..., out...]."""
  lead_shape, in_shape, out_shape = a.shape[:lead], a.shape[lead:lead + n_in], b.shape[lead + 1:]
  a2 = a.astype(jnp.float32).reshape(*lead_shape, math.prod(in_shape), settings.rank)
  b2 = b.astype(jnp.float32).reshape(*lead_shape, settings.rank, math.prod(out_shape))
  return (settings.scale * jnp.matmul(a2, b2)).reshape(*lead_shape, *in_shape, *out_shape)


def scaled(settings: LoraSettings, adapters) -> dict:
  """The adapters with B multiplied by alpha / rank: what the model applies in-layer (CausalLM.token_logprobs'
  `lora`), so x·A·B there equals x·(merged W - W)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x * settings.scale if path[-1].key == "lora_b" else x, adapters)


def merge(settings: LoraSettings, model, params, adapters) -> Any:
  """params with every targeted kernel replaced by W + scale * A @ B (added in float32, kept in W's dtype)."""
  merged = jax.tree.map(lambda x: x, params)  # a fresh container tree; leaves shared until replaced
  for path, (lead, n_in, _) in _targets(settings, model).items():
    module, adapter = _at(merged, path), _at(adapters, path)
    kernel = module["kernel"]
    module["kernel"] = (kernel.astype(jnp.float32)
                        + delta(settings, adapter["lora_a"], adapter["lora_b"], lead, n_in)).astype(kernel.dtype)
  return merged
