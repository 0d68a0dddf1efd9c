"""Meshes from (ici, dcn) sizes, logical rules from config, and copies that never alias."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from oapl_jax import parallel


def test_minus_one_fills_the_remaining_devices():
  mesh = parallel.make_mesh((1, -1, 2))
  assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}
  assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


@pytest.mark.parametrize("ici,match", [((-1, -1, 1), "at most one -1"), ((1, 3, 1), "multiply to 3"),
                                       ((1, -1, 3), "do not divide")])
def test_bad_mesh_sizes_are_explained(ici, match):
  with pytest.raises(ValueError, match=match):
    parallel.make_mesh(ici)


def test_rules_overrides_and_axis_size():
  rules = parallel.rules_from_config({"embed": None, "batch": ["data", "fsdp", "tensor"]})
  assert dict(rules)["embed"] is None and dict(rules)["mlp"] == "tensor"
  mesh = parallel.make_mesh((2, 2, 2))
  assert parallel.axis_size(mesh, rules, "batch") == 8
  assert parallel.axis_size(mesh, parallel.DEFAULT_RULES, "batch") == 4
  assert parallel.axis_size(mesh, parallel.DEFAULT_RULES, "head_dim") == 1


@pytest.mark.devices(8)
def test_reshard_moves_blocks_and_never_aliases():
  mesh = parallel.make_mesh((1, 4, 2))
  x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("fsdp", "tensor")))
  same = parallel.reshard(x, x.sharding)
  other_mesh = parallel.make_mesh((1, 1, 2), devices=jax.devices()[6:])
  moved = parallel.reshard(x, NamedSharding(other_mesh, P(None, "tensor")))
  x.delete()  # what a donated train step does to its input
  np.testing.assert_array_equal(np.asarray(same), np.arange(64.0).reshape(8, 8))
  np.testing.assert_array_equal(np.asarray(moved), np.arange(64.0).reshape(8, 8))
  assert {d.id for d in moved.sharding.device_set} == {6, 7}


def test_placement_gives_the_sampler_the_last_devices_and_reads_dcn():
  cfg = dict(trainer_ici=(1, -1, 2), trainer_dcn=(1, 1, 1), sampler_ici=(1, 1, -1), sampler_dcn=(1, 1, 1),
             sampler_devices=2, rules={"embed": None})
  placement = parallel.placement_from_config(parallel.MeshConfig(**cfg))
  assert dict(placement.trainer.mesh.shape) == {"data": 1, "fsdp": 3, "tensor": 2}
  assert sorted(d.id for d in placement.sampler.mesh.devices.flat) == [6, 7]
  assert not placement.shared and dict(placement.trainer.rules)["embed"] is None
  assert placement.trainer.axis_size("batch") == 3 and placement.sampler.axis_size("kv_heads") == 2
  shared = parallel.placement_from_config(parallel.MeshConfig(**dict(cfg, sampler_devices=0, sampler_ici=(1, -1, 1))))
  assert shared.shared and shared.sampler.mesh.devices.size == 8
  with pytest.raises(ValueError, match="mesh.sampler_devices=8"):
    parallel.placement_from_config(parallel.MeshConfig(**dict(cfg, sampler_devices=8)))
