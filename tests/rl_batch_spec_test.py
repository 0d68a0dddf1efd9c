"""oapl_jax/rl/batch_spec: the trainer batch's fields and placement, as the compile check and the train benchmarks
build it."""
import jax
import numpy as np
import pytest

from benchmarks import train_bench
from oapl_jax import parallel
from oapl_jax.rl import batch_spec


def test_a_batch_lands_in_the_specs_dtypes_with_its_prompt_axis_over_the_batch_devices():
  layout = parallel.Layout(parallel.make_mesh((1, 8, 1), devices=jax.devices()[:8]))
  batch = train_bench.make_batch(8, 2, 6, 50, seed=0, prompt_len=2, min_response=1)
  batch = {k: v.astype(np.float64) for k, v in batch.items()}  # the spec casts
  spec = batch_spec.train_batch(8, 2, 6, layout, num_prompts=8)
  put = batch_spec.put(batch, spec)
  for name, x in put.items():
    assert (x.shape, x.dtype) == (spec[name].shape, spec[name].dtype)
    assert x.sharding.shard_shape(x.shape)[0] == 1  # 8 prompts over 8 devices
    np.testing.assert_array_equal(np.asarray(x), batch[name].astype(spec[name].dtype))
  assert spec["rewards"].shape == (8, 2) and spec["tokens"].dtype == np.int32
  assert batch_spec.train_batch(6, 2, 6, layout, num_prompts=6)["tokens"].sharding == layout.replicated  # 6 % 8


def test_a_batch_missing_a_field_or_of_another_shape_is_refused():
  spec = batch_spec.train_batch(2, 2, 4)
  batch = train_bench.make_batch(2, 2, 4, 50, prompt_len=2, min_response=1)
  with pytest.raises(ValueError, match="rewards"):
    batch_spec.put({k: v for k, v in batch.items() if k != "rewards"}, spec)
  with pytest.raises(ValueError, match=r"batch\['tokens'\] has shape \(2, 2, 5\)"):
    batch_spec.put({**batch, "tokens": np.zeros((2, 2, 5), np.int32)}, spec)
