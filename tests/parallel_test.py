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
