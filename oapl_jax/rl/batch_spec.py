"""The trainer's batch as the step receives it: objectives/batch_fields.FIELDS, shaped and laid over the devices.

    spec = batch_spec.train_batch(B, G, T, layout)          # {name: ShapeDtypeStruct with its sharding}
    batch_dev = batch_spec.put(batch_of_numpy_arrays, spec)  # those dtypes, that placement

For everything that builds a batch without the loop's buffer: the compile check's abstract inputs and the train
benchmarks' random batches. The fields every batch holds (not the optional ones); the sharding is
trainer.batch_sharding, the same prefix the jitted step declares.
"""
from typing import Mapping, Optional

import jax
import numpy as np

from oapl_jax.objectives.batch_fields import FIELDS
from oapl_jax.parallel import Layout
from oapl_jax.rl import trainer


def train_batch(batch_prompts: int, group_size: int, seq_len: int, layout: Optional[Layout] = None,
                num_prompts: Optional[int] = None) -> dict:
  """{name: ShapeDtypeStruct} of one [B, G, T] train batch; with `layout`, each sharded as the step expects it
  (trainer.batch_sharding(layout, num_prompts); num_prompts None: assume the batch axes divide B)."""
  sharding = None if layout is None else trainer.batch_sharding(layout, num_prompts)
  return {name: jax.ShapeDtypeStruct(field.shape(batch_prompts, group_size, seq_len), field.dtype, sharding=sharding)
          for name, field in FIELDS.items() if not field.optional}


def put(batch: Mapping, spec: Mapping) -> dict:
  """`batch` (numpy or JAX arrays, the spec's fields) on the devices, in the spec's dtypes and shardings."""
  if set(batch) != set(spec):
    raise ValueError(f"batch fields {sorted(batch)} are not the trainer's {sorted(spec)}")
  for name, s in spec.items():
    if tuple(batch[name].shape) != tuple(s.shape):
      raise ValueError(f"batch[{name!r}] has shape {tuple(batch[name].shape)}, the spec {tuple(s.shape)}")
  return {name: jax.device_put(np.asarray(batch[name], s.dtype), s.sharding) for name, s in spec.items()}
