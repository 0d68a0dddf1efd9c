"""Meshes, logical-axis rules, where the trainer and the sampler run, parameters born sharded, and
device-side resharding.

A mesh is described by per-axis sizes (ici within a slice, dcn across slices); one -1 per
list absorbs whatever devices are left. Models name their axes logically ('embed', 'mlp',
'activation_batch', ...); the rules below map those names onto mesh axes, and configs may
override them.
"""
import contextlib
import contextvars
import dataclasses
import functools
import os
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from oapl_jax import sections

MESH_AXES = ("data", "fsdp", "tensor")

# Logical name -> mesh axis (or tuple of axes, or None = replicated).
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
    ("cache_batch", ("data", "fsdp")),
    ("cache_length", None),
    ("cache_kv_heads", "tensor"),
)


def _fill(sizes: Sequence[int], total: int, what: str) -> list[int]:
  sizes = list(sizes)
  if sizes.count(-1) > 1:
    raise ValueError(f"{what}: at most one -1 allowed, got {sizes}")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if total % known:
      raise ValueError(f"{what}: {total} devices do not divide by the fixed sizes {sizes}")
    sizes[sizes.index(-1)] = total // known
  if int(np.prod(sizes)) != total:
    raise ValueError(f"{what}: sizes {sizes} multiply to {int(np.prod(sizes))}, but there are {total} devices")
  return sizes


def make_mesh(ici: Sequence[int] = (1, -1, 1), dcn: Sequence[int] = (1, 1, 1),
              axis_names: Sequence[str] = MESH_AXES, devices: Optional[Sequence[Any]] = None) -> Mesh:
  """Mesh over `devices` (default: all). ici sizes within a slice, dcn sizes across slices."""
  devices = list(devices if devices is not None else jax.devices())
  num_slices = len({getattr(d, "slice_index", 0) for d in devices})
  dcn = _fill(dcn, num_slices, "dcn parallelism")
  ici = _fill(ici, len(devices) // num_slices, "ici parallelism")
  if num_slices > 1:
    from jax.experimental import mesh_utils
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices)
  else:
    grid = np.asarray(devices).reshape(ici)
  return Mesh(grid, tuple(axis_names))


def rules_from_config(overrides: Optional[Mapping[str, Any]] = None) -> tuple[tuple[str, Any], ...]:
  """DEFAULT_RULES with per-name overrides (e.g. {'embed': None} to turn FSDP off)."""
  rules = dict(DEFAULT_RULES)
  for name, axes in (overrides or {}).items():
    rules[name] = tuple(axes) if isinstance(axes, list) else axes
  return tuple(rules.items())


def logical_to_sharding(logical_specs, mesh: Mesh, rules) -> Any:
  """Pytree of logical PartitionSpecs -> pytree of NamedShardings on `mesh`."""
  mesh_specs = nn.logical_to_mesh(logical_specs, rules)
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), mesh_specs,
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


# (mesh, rules) for activation constraints while tracing; per thread, so the sampler thread and
# the trainer thread each trace with their own mesh.
_ACTIVATION_SHARDING = contextvars.ContextVar("activation_sharding", default=None)


@contextlib.contextmanager
def sharding_context(mesh: Mesh, rules):
  """Trace model code under `mesh` + `rules`: activation constraints (`constrain`) take effect."""
  token = _ACTIVATION_SHARDING.set((mesh, tuple(rules)))
  try:
    with mesh, nn.logical_axis_rules(rules):
      yield
  finally:
    _ACTIVATION_SHARDING.reset(token)


def current_context() -> Optional[tuple[Mesh, tuple]]:
  """(mesh, rules) of the active `sharding_context`, or None."""
  return _ACTIVATION_SHARDING.get()


def spec_where_divisible(shape: Sequence[int], logical_names: Sequence[Optional[str]], mesh: Mesh, rules) -> PartitionSpec:
  """The mesh PartitionSpec of `logical_names`, with the axes of any dimension they do not divide dropped."""
  names = [n if n is None or shape[i] % axis_size(mesh, rules, n) == 0 else None for i, n in enumerate(logical_names)]
  return nn.logical_to_mesh_axes(names, rules)


def current_platform() -> Optional[str]:
  """The platform ('cpu', 'gpu', 'tpu') of the mesh being traced for in `sharding_context`, or None."""
  ctx = _ACTIVATION_SHARDING.get()
  return None if ctx is None else ctx[0].devices.flat[0].platform


def constrain(x, logical_names: Sequence[Optional[str]]):
  """Sharding constraint from logical axis names; a no-op outside `sharding_context`."""
  ctx = _ACTIVATION_SHARDING.get()
  if ctx is None:
    return x
  mesh, rules = ctx
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, nn.logical_to_mesh_axes(logical_names, rules)))


def constrain_where_divisible(x, logical_names: Sequence[Optional[str]]):
  """`constrain`, dropping the names of any dimension its mesh axes do not divide (left replicated)."""
  ctx = _ACTIVATION_SHARDING.get()
  if ctx is None:
    return x
  mesh, rules = ctx
  names = [n if n is None or x.shape[i] % axis_size(mesh, rules, n) == 0 else None
           for i, n in enumerate(logical_names)]
  return constrain(x, names)


def init_sharded(init_fn: Callable[[], Any], mesh: Mesh, rules) -> tuple[Any, Any]:
  """Run `init_fn` (returning boxed params) so every array is created in its final sharding.

  Returns (unboxed params, their shardings); nothing is ever assembled on one device.
  """
  abstract = jax.eval_shape(init_fn)
  shardings = logical_to_sharding(nn.get_partition_spec(abstract), mesh, rules)
  with mesh, nn.logical_axis_rules(rules):
    params = jax.jit(lambda: nn.unbox(init_fn()), out_shardings=shardings)()
  return params, shardings


def axis_size(mesh: Mesh, rules, logical_name: str) -> int:
  """How many ways `mesh` splits an axis with this logical name (1 if replicated)."""
  axes = dict(rules).get(logical_name)
  axes = (axes,) if isinstance(axes, str) else (axes or ())
  return int(np.prod([mesh.shape[a] for a in axes]))


def reshard(tree, shardings, donate: bool = False):
  """Device-to-device copy of `tree` into `shardings` (possibly another mesh); never via host.

  Always a fresh buffer unless `donate`: when source and target shardings coincide, device_put
  would otherwise alias, and a later donation of the source (the train step donates its state)
  would delete the copy too.
  """
  return jax.device_put(tree, shardings, donate=donate, may_alias=None if donate else False)


def transfer(tree, shardings):
  """`reshard` onto another set of devices, also where both meshes span several processes (which
  jax.device_put refuses: it moves data between processes only between equal device sets).

  Then, per process, pair every target device with `k` of this process's source devices (k = source
  devices / target devices on each process), reshard on the source devices into the target's layout
  laid over those pairs (one program, replicated k times), and copy each shard of the first replica
  to its target device: device to device, within the process, never through the host.
  """
  leaves, treedef = jax.tree.flatten(tree)
  targets = treedef.flatten_up_to(shardings)
  if not any(isinstance(x, jax.Array) for x in leaves):  # host arrays (a checkpoint read for serving or eval)
    return jax.device_put(tree, shardings)
  if all(x.is_fully_addressable and s.is_fully_addressable or x.sharding.device_set == s.device_set
         for x, s in zip(leaves, targets)):
    return reshard(tree, shardings)
  source_devices = leaves[0].sharding._device_assignment  # pylint: disable=protected-access
  images, pairs = zip(*(_image_sharding(s, source_devices) for s in targets))
  staged = _staging_program(tuple(images))(leaves)
  out = []
  for x, s, pair in zip(staged, targets, pairs):
    by_device = {shard.device: shard.data for shard in x.addressable_shards}
    local = [jax.device_put(by_device[pair[d]], d) for d in s.addressable_devices_indices_map(x.shape)]
    out.append(jax.make_array_from_single_device_arrays(x.shape, s, local))
  return treedef.unflatten(out)


@functools.lru_cache(maxsize=16)
def _staging_program(images: tuple):
  return jax.jit(lambda leaves: leaves, out_shardings=list(images))


def _image_sharding(target: NamedSharding, source_devices) -> tuple[NamedSharding, dict]:
  """`target`'s layout on the source devices (k per target device, same process), and the map
  target device -> the source device whose shard it copies."""
  by_process: dict[int, list] = {}
  for d in source_devices:
    by_process.setdefault(d.process_index, []).append(d)
  flat = list(target.mesh.devices.flat)
  counts = {p: sum(d.process_index == p for d in flat) for p in by_process}
  ks = {len(by_process[p]) // c if c and len(by_process[p]) % c == 0 else 0 for p, c in counts.items()}
  if len(ks) != 1 or 0 in ks or set(counts) != {d.process_index for d in flat}:
    raise ValueError(f"cannot move arrays between these device sets: every process must hold k source "
                     f"devices per target device (source {[(p, len(v)) for p, v in by_process.items()]}, "
                     f"target {sorted(counts.items())})")
  k = ks.pop()
  seen: dict[int, int] = {}
  image = np.empty((k, len(flat)), dtype=object)
  for i, d in enumerate(flat):
    rank = seen[d.process_index] = seen.get(d.process_index, -1) + 1
    for j in range(k):
      image[j, i] = by_process[d.process_index][j * counts[d.process_index] + rank]
  mesh = Mesh(image.reshape((k,) + target.mesh.devices.shape), ("_copies",) + tuple(target.mesh.axis_names))
  return NamedSharding(mesh, target.spec), {d: image[0, i] for i, d in enumerate(flat)}


def process_rows(sharding: jax.sharding.Sharding, num_rows: int) -> slice:
  """The rows of a [num_rows, ...] array that this process's devices hold under `sharding` (one
  contiguous range: meshes list a process's devices together); all rows where it is replicated."""
  spans = {(s.start or 0, num_rows if s.stop is None else s.stop)
           for s in (index[0] for index in sharding.addressable_devices_indices_map((num_rows,)).values())}
  start, stop = min(a for a, _ in spans), max(b for _, b in spans)
  if sum(b - a for a, b in spans) != stop - start and len(spans) > 1:
    raise ValueError(f"this process's rows under {sharding} are not one range: {sorted(spans)}")
  return slice(start, stop)


def from_process_rows(local_rows, sharding: jax.sharding.Sharding, num_rows: int):
  """A pytree of this process's rows (`process_rows`) -> global arrays of num_rows rows under
  `sharding`; every process passes only its own rows, and nothing assembles the whole batch."""
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x, (num_rows, *x.shape[1:])),
                      local_rows)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


# ------------------------------------------------------------------------------ where things run
# mesh.cpu_compile -> the XLA options of every program a side compiles on CPU (none elsewhere). 'fast_start': the MLIR
# fusion emitters off and LLVM at -O1. The demo's train step then compiles in 3.8 CPU s instead of 7.6 and runs in
# 59 ms instead of 45 (docs/benchmarks.md, "Compiling for a short start"): for tiny models, where compiling is most of
# a run; at Qwen3-0.6B width the classic emitters cost 4-5% a step.
CPU_COMPILE = {"fast_code": {},
               "fast_start": {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}}


@dataclasses.dataclass(frozen=True)
class Layout:
  """One side's devices: a mesh, the logical-axis rules that map model names onto it, and how its programs compile
  (`compiler_options`: pass to every jax.jit of this side)."""

  mesh: Mesh
  rules: tuple = DEFAULT_RULES
  cpu_compile: str = "fast_code"  # a key of CPU_COMPILE

  def __post_init__(self):
    if self.cpu_compile not in CPU_COMPILE:
      raise ValueError(f"cpu_compile={self.cpu_compile!r}: one of {sorted(CPU_COMPILE)}")

  @property
  def compiler_options(self) -> Optional[dict]:
    """XLA options for this side's jax.jit (None: the process's): mesh.cpu_compile's, on CPU only, less any the
    environment's XLA_FLAGS set (a flag given there wins: e.g. the test suite's LLVM -O0)."""
    if self.platform != "cpu":
      return None
    in_env = {flag.lstrip("-").split("=")[0] for flag in os.environ.get("XLA_FLAGS", "").split()}
    return {k: v for k, v in CPU_COMPILE[self.cpu_compile].items() if k not in in_env} or None

  @classmethod
  def single_device(cls, device=None, rules=DEFAULT_RULES) -> "Layout":
    return cls(make_mesh((1, 1, 1), devices=[device or jax.devices()[0]]), tuple(rules))

  def sharding(self, logical_specs) -> Any:
    """A PartitionSpec (or a pytree of them) of logical names -> NamedSharding(s) on this mesh."""
    return logical_to_sharding(logical_specs, self.mesh, self.rules)

  @property
  def replicated(self) -> NamedSharding:
    return replicated(self.mesh)

  @property
  def platform(self) -> str:
    """'cpu', 'gpu' or 'tpu': what kernels (e.g. attention) should target."""
    return self.mesh.devices.flat[0].platform

  def axis_size(self, logical_name: str) -> int:
    return axis_size(self.mesh, self.rules, logical_name)

  def context(self):
    """Trace model code here: activation constraints take effect (see `sharding_context`)."""
    return sharding_context(self.mesh, self.rules)


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where a run's two sides live: the trainer's layout and the sampler's (disjoint, or the same)."""

  trainer: Layout
  sampler: Layout

  @property
  def shared(self) -> bool:
    return set(self.trainer.mesh.devices.flat) == set(self.sampler.mesh.devices.flat)


def _host_order(devices) -> list:
  """Devices grouped by slice, then process, then id."""
  key = lambda d: (getattr(d, "slice_index", 0) or 0, d.process_index, d.id)  # noqa: E731
  return sorted(devices, key=key)


def split_devices(devices: Sequence[Any], sampler_devices: int) -> tuple[list, list]:
  """(trainer devices, sampler devices) in host order; sampler_devices = 0: both sides get all.

  One process: the sampler gets the last n devices. Several processes: every process gives the
  sampler the last n / process_count of its own devices (the rest train), so each mesh spans every
  process. Why not whole hosts per side: in multi-controller JAX every process runs the programs of
  the devices it owns, and a transfer between device sets held by different processes needs the
  experimental DCN transport (jax_cross_host_transfer_socket_address) plus a loop split into two
  roles that hand each other placeholder arrays. With both meshes on every process, each process runs
  the same loop (trainer steps and the rollout thread), the refresh is a reshard on the trainer's
  devices plus one local device-to-device copy per shard (`transfer`), and the rollouts reach
  every host as token ids (small), from which each host feeds only its own shard of the batch.
  """
  devices = _host_order(devices)
  n = int(sampler_devices)
  if n < 0 or n >= len(devices) and n:
    raise ValueError(f"config field mesh.sampler_devices={n}: need 0 (share) or 1..{len(devices) - 1}")
  if not n:
    return devices, devices
  by_process: dict[int, list] = {}
  for d in devices:
    by_process.setdefault(d.process_index, []).append(d)
  if len(by_process) == 1:
    return devices[:len(devices) - n], devices[len(devices) - n:]
  local = {len(ds) for ds in by_process.values()}
  per = n // len(by_process)
  if len(local) != 1 or n % len(by_process) or per >= min(local) or (min(local) - per) % per:
    raise ValueError(f"config field mesh.sampler_devices={n}: with {len(by_process)} processes of "
                     f"{sorted(local)} devices each, the sampler takes the same number of devices on every "
                     f"process, and each process's trainer devices must be a multiple of its sampler devices "
                     f"(the refresh copies each sampler shard from a trainer device of the same process)")
  split = min(local) - per
  return ([d for ds in by_process.values() for d in ds[:split]],
          [d for ds in by_process.values() for d in ds[split:]])


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """The `mesh` section: sizes of the (data, fsdp, tensor) axes, ici within a slice and dcn across slices; one
  -1 per list fills what is left."""
  trainer_ici: tuple[int, int, int] = (1, -1, 1)  # the trainer's axes within a slice
  trainer_dcn: tuple[int, int, int] = (-1, 1, 1)  # the trainer's axes across slices
  sampler_ici: tuple[int, int, int] = (1, -1, 1)  # the sampler's axes within a slice
  sampler_dcn: tuple[int, int, int] = (-1, 1, 1)  # the sampler's axes across slices
  sampler_devices: int = sections.rule(0, low=0)  # > 0: the sampler's own devices (split_devices); 0: shared
  # on CPU: 'fast_code' (XLA's defaults) or 'fast_start' (compile about twice as fast, run a little slower: tiny models,
  # where compiling is most of a run; CPU_COMPILE); a flag the environment's XLA_FLAGS sets wins over either
  cpu_compile: str = sections.rule("fast_code", choices=tuple(CPU_COMPILE))
  rules: dict = dataclasses.field(default_factory=dict)  # DEFAULT_RULES overridden by logical name (axis, list, None)

  def __post_init__(self):
    sections.enforce(self)
    problems = []
    for side in ("trainer", "sampler"):
      for kind in ("ici", "dcn"):
        sizes = getattr(self, f"{side}_{kind}")
        if any(s < 1 and s != -1 for s in sizes) or list(sizes).count(-1) > 1:
          problems.append(f"mesh.{side}_{kind}={tuple(sizes)}: must be 3 sizes for {MESH_AXES}, each >= 1 or one "
                          "-1 (fill)")
    for name, axes in self.rules.items():
      listed = (axes,) if isinstance(axes, str) or axes is None else tuple(axes) if isinstance(axes, (list, tuple)) \
          else ()
      if not listed or any(a is not None and a not in MESH_AXES for a in listed):
        problems.append(f"mesh.rules.{name}={axes!r}: must be None, one of {MESH_AXES} or a list of them")
    if problems:
      raise ValueError("; ".join(problems))


def placement_from_config(cfg: MeshConfig, devices: Optional[Sequence[Any]] = None) -> Placement:
  """The `mesh` section -> Placement over `devices` (default: all)."""
  rules = rules_from_config(cfg.rules)
  trainer_devices, sampler_devices = split_devices(devices if devices is not None else jax.devices(),
                                                   cfg.sampler_devices)

  def layout(side, side_devices):
    mesh = make_mesh(getattr(cfg, f"{side}_ici"), getattr(cfg, f"{side}_dcn"), devices=side_devices)
    return Layout(mesh, rules, cfg.cpu_compile)

  return Placement(layout("trainer", trainer_devices), layout("sampler", sampler_devices))
