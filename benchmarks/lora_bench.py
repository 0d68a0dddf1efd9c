"""LoRA against full fine-tuning at the same shape: trainer state bytes, the compiled step's memory, step time.

    python -m benchmarks.lora_bench                                  # Qwen3-0.6B width, 4 layers, 2 x 4 x 128
    python -m benchmarks.lora_bench --layers 28 --steps 0            # the whole 0.6B: memory only (no steps)

Random weights of the Qwen3-0.6B architecture cut to --layers layers, one CPU device, float32, one micro-batch,
the OAPL loss. For each mode: bytes of the trainer state (what the optimizer trains, its AdamW moments, and the
frozen base), XLA's memory_analysis of the compiled step (arguments, outputs, temporaries), then --steps steps
per mode run alternately (full, lora, full, ...) with the median step time, and the ratio lora / full. LoRA:
rank 8 on q/k/v/o (the config default targets). A benchmark, not a test.
"""
import argparse
import statistics
import time

import jax
import numpy as np

from benchmarks import train_bench
from oapl_jax import objectives, parallel
from oapl_jax.models import api, decoder, lora
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.rl import trainer
from oapl_jax.rl.optim import OptimConfig

GIB = 1024 ** 3


def tree_bytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--prompts", type=int, default=2)
  ap.add_argument("--group", type=int, default=4)
  ap.add_argument("--seq_len", type=int, default=128)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--rank", type=int, default=8)
  ap.add_argument("--steps", type=int, default=3)
  args = ap.parse_args()

  config = QwenConfig.qwen3_0p6b().replace(num_layers=args.layers)
  model = api.for_config(config)
  layout = parallel.Layout(parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1]))
  params, _ = parallel.init_sharded(lambda: decoder.init_params(config, jax.random.PRNGKey(0)), layout.mesh, layout.rules)
  batch = train_bench.make_batch(args.prompts, args.group, args.seq_len, config.vocab_size, seed=0)
  print(f"Qwen3-0.6B width, {args.layers} layers, vocab {config.vocab_size}; batch {args.prompts} x {args.group} x "
        f"{args.seq_len}; LoRA rank {args.rank} on q/k/v/o", flush=True)

  modes = {}
  for name, settings in (("full", lora.LoraSettings()), ("lora", lora.LoraSettings(rank=args.rank))):
    cfg = trainer.TrainConfig(loss_settings=objectives.OAPLSettings(beta1=1.0, beta2=1e-3), lora=settings,
                              optim=OptimConfig(lr=1e-6))
    state = trainer.create_train_state(cfg, model, params, layout)
    step = trainer.make_train_step(cfg, model, layout)
    start = time.perf_counter()
    compiled = step.lower(state, batch, jax.random.PRNGKey(0)).compile()
    mem = compiled.memory_analysis()
    row = {"trained": tree_bytes(state.params), "optimizer": tree_bytes(state.opt_state),
           "frozen": tree_bytes(state.frozen) if state.frozen is not None else 0,
           "args": mem.argument_size_in_bytes, "out": mem.output_size_in_bytes, "temp": mem.temp_size_in_bytes,
           "compile_s": time.perf_counter() - start, "times": []}
    modes[name] = (row, compiled, state)
    print(f"{name:4s}: trained {row['trained'] / GIB:.3f} GiB, AdamW {row['optimizer'] / GIB:.3f} GiB, frozen base "
          f"{row['frozen'] / GIB:.3f} GiB | step: arguments {row['args'] / GIB:.3f}, temporaries {row['temp'] / GIB:.3f} "
          f"GiB | compile {row['compile_s']:.1f} s", flush=True)

  for i in range(args.steps):
    for name in ("full", "lora"):
      row, compiled, state = modes[name]
      start = time.perf_counter()
      state, metrics = compiled(state, batch, jax.random.PRNGKey(0))
      loss = float(metrics["loss"])
      row["times"].append(time.perf_counter() - start)
      modes[name] = (row, compiled, state)
      print(f"  step {i} {name}: {row['times'][-1]:.2f} s (loss {loss:.5f})", flush=True)

  full, low = modes["full"][0], modes["lora"][0]
  state_full = full["trained"] + full["optimizer"] + full["frozen"]
  state_lora = low["trained"] + low["optimizer"] + low["frozen"]
  print(f"trainer state: full {state_full / GIB:.3f} GiB, lora {state_lora / GIB:.3f} GiB (ratio {state_lora / state_full:.3f})")
  print(f"step temporaries: full {full['temp'] / GIB:.3f} GiB, lora {low['temp'] / GIB:.3f} GiB "
        f"(ratio {low['temp'] / max(full['temp'], 1):.3f})")
  if args.steps:
    med = {k: statistics.median(modes[k][0]["times"][1:] or modes[k][0]["times"]) for k in modes}
    print(f"median step (first step of each left out when >1): full {med['full']:.2f} s, lora {med['lora']:.2f} s "
          f"(lora / full {med['lora'] / med['full']:.3f})")


if __name__ == "__main__":
  np.set_printoptions(precision=4)
  main()
