"""benchmarks/memory_breakdown reads XLA's dump of a program compiled for a TPU topology (libtpu, no TPU): a layer
scan's stacked inputs are its largest HBM buffer, and in pinned host memory once a remat policy offloads them."""
import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from benchmarks import memory_breakdown as mb
from oapl_jax.run import compile_check as cc

pytest.importorskip("libtpu", reason="libtpu is not installed: no TPU topologies")
MIB = 1024 ** 2


def _dump(tmp_path, policy):
  """grad of an 8-layer scan of tanh(x @ w) in bf16, x [4096, 1024] per device: stacked inputs 8 x 8 MiB."""
  mesh = Mesh(cc.topology_devices(cc.parse_topology("v5p-8")), ("x",))

  def loss(x, w):
    def layer(c, w_l):
      c = checkpoint_name(c, "layer_input")
      return jnp.tanh(c @ w_l), None
    return jax.lax.scan(jax.checkpoint(layer, policy=policy), x, w)[0].astype(jnp.float32).sum()

  x = jax.ShapeDtypeStruct((4 * 4096, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("x")))
  w = jax.ShapeDtypeStruct((8, 1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
  jax.jit(jax.grad(loss)).lower(x, w).compile(compiler_options={"xla_dump_to": str(tmp_path)})
  (prefix,) = mb.dumped_modules(str(tmp_path))
  return prefix


def test_the_stacked_layer_inputs_are_the_largest_buffer(tmp_path):
  prefix = _dump(tmp_path, None)
  size, _, _, shapes = mb.read_usage_report(prefix)[0][0]  # HBM, the largest buffer
  assert size == 64 * MIB and "bf16[8,4096,1024]" in shapes
  assert 5 not in mb.read_usage_report(prefix)  # nothing in pinned host
  text = mb.format_breakdown("grad", prefix, 95 * 1024 ** 3, top=3)
  assert "HBM: temp" in text and "bf16[8,4096,1024]" in text and "argument" in text


def test_offloaded_layer_inputs_sit_in_pinned_host(tmp_path):
  policy = jax.checkpoint_policies.save_and_offload_only_these_names(
      names_which_can_be_saved=[], names_which_can_be_offloaded=["layer_input"], offload_src="device",
      offload_dst="pinned_host")
  prefix = _dump(tmp_path, policy)
  host = [a for a in mb.read_allocations(prefix) if a.color == 5]
  assert sum(a.size for a in host) == 64 * MIB
  assert all(size < 64 * MIB for size, *_ in mb.read_usage_report(prefix)[0])
  assert "pinned host: temp 0.06 GiB" in mb.format_breakdown("grad", prefix, 95 * 1024 ** 3, top=3)
