"""TPU slices by name (v5p-64, 2xv5e-256, v5p:4x4x8): each chip's HBM, peak FLOP/s and legal shapes, and the
compile-only devices libtpu describes for a slice on any host (no TPU needed; the compile check reads them)."""
import dataclasses
import importlib.util
import math
import os
import re

from oapl_jax import tpu_host

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  libtpu_name: str  # the chip's prefix in libtpu's topology strings
  chip_config: str  # "megacore": the chip's two TensorCores are one device
  cores_per_chip: int  # slice names count TensorCores (2 per chip) or chips (1)
  hbm_bytes: int  # what XLA:TPU lets one program use (its out-of-memory message states it)
  peak_bf16_flops: float  # dense, per chip (Google Cloud TPU docs)
  shapes: dict  # chips -> the standard slice shape
  host_bytes_per_s: float = 1.5e10  # host <-> chip, each way: assumed (module docstring), no Google figure found


_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
              512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
CHIPS = {
    "v4": Chip("v4", "v4", "megacore", 2, int(30.75 * GIB), 275e12, _SHAPES_3D),
    "v5p": Chip("v5p", "v5", "megacore", 2, int(95.74 * GIB), 459e12, _SHAPES_3D),
    "v5e": Chip("v5e", "v5e", "default", 1, int(15.75 * GIB), 197e12, _SHAPES_2D),
    "v6e": Chip("v6e", "v6e", "default", 1, int(31.25 * GIB), 918e12, _SHAPES_2D),
}


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str
  chip: Chip
  shape: str  # e.g. "2x4x4": chips per slice along each torus axis
  num_slices: int = 1

  chips_per_slice = property(lambda self: math.prod(int(s) for s in self.shape.split("x")))
  num_chips = property(lambda self: self.chips_per_slice * self.num_slices)


def parse_topology(name: str) -> Topology:
  """'v5p-64', 'v5e-256', 'v5litepod-16', 'v6e-16', '2xv5e-256', 'v5p:4x4x8' -> Topology."""
  m = re.fullmatch(r"(?:([1-9]\d*)x)?([a-z0-9]+?)(?:-(\d+)|:(\d+(?:x\d+)+))", name.strip().lower())
  kind = m and {"v5litepod": "v5e", "v6litepod": "v6e"}.get(m.group(2), m.group(2))
  if not m or kind not in CHIPS:
    raise ValueError(f"unknown TPU topology {name!r}: expected e.g. v5p-64, v5e-256, v6e-16, 2xv5e-256 or "
                     f"v5p:4x4x8 (chips: {sorted(CHIPS)})")
  chip, slices = CHIPS[kind], int(m.group(1) or 1)
  if m.group(4):
    shape = m.group(4)
  else:
    cores = int(m.group(3))
    chips = cores // chip.cores_per_chip
    if cores % chip.cores_per_chip or chips not in chip.shapes:
      sizes = sorted(c * chip.cores_per_chip for c in chip.shapes)
      raise ValueError(f"topology {name!r}: {kind}-N knows N in {sizes}; name other shapes as {kind}:AxBxC")
    shape = chip.shapes[chips]
  return Topology(name, chip, shape, slices)


def accelerator_type(topology: Topology) -> str:
  """The slice's Cloud TPU accelerator type, as a TPU VM's metadata names it: v5p-64, v5litepod-16, v6e-8."""
  prefix = {"v5e": "v5litepod"}.get(topology.chip.name, topology.chip.name)
  return f"{prefix}-{topology.chips_per_slice * topology.chip.cores_per_chip}"


def _quiet_libtpu(topology: Topology) -> None:
  """Off a TPU VM, libtpu looks for the VM's metadata when it loads, then logs an E-level "unexpected worker
  hostname" that reads as fatal and is not: compiling needs no TPU worker. Tell it what it would ask."""
  if tpu_host.has_tpu_device_files():
    return  # a real TPU VM: its own metadata is right
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator_type(topology))


class LibtpuMissing(RuntimeError):
  """The compile check runs where libtpu is not installed (the package without its compile-check extra)."""


def topology_devices(topology: Topology) -> list:
  """Compile-only devices of the slice(s), from libtpu (no TPU needed)."""
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # do not fight other JAX processes for the lock
  _quiet_libtpu(topology)
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  dims = [int(d) for d in topology.shape.split("x")]
  host_bounds = (2, 2, 1) if topology.chips_per_slice >= 4 else tuple((dims + [1, 1])[:3])  # one host, 3 axes
  try:
    desc = topologies.get_topology_desc(f"{topology.chip.libtpu_name}:{topology.shape}", "tpu",
                                        chip_config_name=topology.chip.chip_config,
                                        chips_per_host_bounds=host_bounds, num_slices=topology.num_slices)
  except Exception as e:  # noqa: BLE001 - libtpu missing or refusing the shape: say which
    if not importlib.util.find_spec("libtpu"):
      raise LibtpuMissing(f"the compile check needs libtpu to describe {topology.name} (no TPU is used): install "
                          "the compile-check extra, pip install -e '.[compile-check]' (make install has it)") from e
    raise RuntimeError(f"libtpu could not describe {topology.name} ({topology.chip.libtpu_name}:{topology.shape}, "
                       f"{topology.num_slices} slice(s)): {e}") from e
  return list(desc.devices)
