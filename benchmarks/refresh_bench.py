"""Snapshot refresh between disjoint device sets: time and bytes per refresh, against the params.

    python -m benchmarks.refresh_bench                  # 8 fake CPU devices: trainer 0-3, sampler 4-7
    python -m benchmarks.refresh_bench --rounds 10 --models tiny

The trainer's params live FSDP-sharded on devices 0-3; `Sampler.refresh` moves them to the sampler
mesh on devices 4-7 (cast to the sampler dtype, device-to-device reshard, decode layout). For each
model and sampler layout it prints the median refresh time, the bytes that land on the sampler's
devices (the sum of its shards), and the physical floor: one copy of the sampler's share of the
weights, i.e. each sampler device receives its shard once, in the sampler's dtype. A sampler
layout that replicates a weight (with tensor parallelism, what only fsdp splits, e.g. the norms, is
held twice) has a larger floor than the parameter bytes.
A benchmark, not a test.
"""
import argparse
import os
import time

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from oapl_jax import fake_devices  # noqa: E402  (imports nothing of JAX)
fake_devices.make_room_for_collectives()

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from oapl_jax import parallel  # noqa: E402
from oapl_jax.models import api  # noqa: E402
from oapl_jax.models.families import preset  # noqa: E402
from oapl_jax.sampler import core  # noqa: E402

MODELS = {  # name -> preset overrides
    "tiny": dict(vocab_size=32, hidden_size=128, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=32, max_position_embeddings=64),  # configs/arithmetic.py's model
    "100m": dict(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12,
                 num_kv_heads=4, head_dim=64, max_position_embeddings=512),
}
SAMPLER_LAYOUTS = {"fsdp": (1, 4, 1), "fsdp+tp": (1, 2, 2)}  # sampler_ici over (data, fsdp, tensor); tp 2: tiny's 2 kv heads


def shard_bytes(tree) -> int:
  """Bytes held by the devices of `tree`'s arrays (replicas counted on every device that holds one)."""
  return sum(shard.data.nbytes for x in jax.tree.leaves(tree) for shard in x.addressable_shards)


def floor_bytes(model, layout: parallel.Layout, dtype) -> int:
  """One copy of the sampler's share: per sampler device, the bytes of its shard of every weight."""
  abstract = jax.eval_shape(lambda: nn.unbox(model.init_params(jax.random.PRNGKey(0))))
  total = 0
  for shape_dtype, sharding in zip(jax.tree.leaves(abstract), jax.tree.leaves(layout.sharding(model.param_logical_axes()))):
    shard_shape = sharding.shard_shape(shape_dtype.shape)
    total += int(np.prod(shard_shape)) * np.dtype(dtype).itemsize * len(sharding.device_set)
  return total


def bench(name: str, sampler_ici, dtype: str, rounds: int) -> dict:
  devices = jax.devices()
  trainer = parallel.Layout(parallel.make_mesh((1, 4, 1), devices=devices[:4]))
  sampler_layout = parallel.Layout(parallel.make_mesh(sampler_ici, devices=devices[4:8]))
  config = preset("tiny", **MODELS[name], param_dtype="float32", dtype="float32")
  model = api.for_config(config)
  params, _ = parallel.init_sharded(lambda: model.init_params(jax.random.PRNGKey(0)), trainer.mesh, trainer.rules)
  sampler_model = model.with_execution(param_dtype=dtype, dtype=dtype, remat=False)
  sampler = core.Sampler(sampler_model, layout=sampler_layout, num_slots=8, max_prefill_length=8, max_new_tokens=8)
  sampler.refresh(params)  # compile the cast and the decode layout
  seconds = []
  for _ in range(rounds):
    sampler.refresh(params)
    seconds.append(sampler.last_refresh_seconds)
  on_sampler = {d for x in jax.tree.leaves(sampler.params) for d in x.sharding.device_set}
  assert on_sampler == set(devices[4:8]), "the snapshot left the sampler's devices"
  return dict(model=name, params=sum(x.size for x in jax.tree.leaves(params)), sampler=f"{sampler_ici} {dtype}",
              param_bytes=sum(x.nbytes for x in jax.tree.leaves(params)), moved=shard_bytes(sampler.params),
              floor=floor_bytes(sampler_model, sampler_layout, dtype), ms=1e3 * float(np.median(seconds)))


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--models", default="tiny,100m")
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args()
  print(f"{jax.device_count()} {jax.devices()[0].platform} devices; trainer FSDP on 0-3 (float32), sampler on 4-7")
  header = f"{'model':6} {'params':>11} {'sampler (ici, dtype)':>24} {'param MB':>9} {'moved MB':>9} {'floor MB':>9} " \
           f"{'moved/floor':>11} {'ms':>8} {'GB/s':>6}"
  print(header)
  for name in args.models.split(","):
    for layout_name, ici in SAMPLER_LAYOUTS.items():
      for dtype in ("float32", "bfloat16"):
        r = bench(name, ici, dtype, args.rounds)
        print(f"{r['model']:6} {r['params']:>11,} {layout_name + ' ' + r['sampler']:>24} {r['param_bytes'] / 1e6:>9.2f} "
              f"{r['moved'] / 1e6:>9.2f} {r['floor'] / 1e6:>9.2f} {r['moved'] / r['floor']:>11.2f} {r['ms']:>8.2f} "
              f"{r['moved'] / r['ms'] / 1e6:>6.2f}", flush=True)


if __name__ == "__main__":
  main()
