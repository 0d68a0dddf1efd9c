"""Peak memory and step time of the OAPL train step at a real model width (issue 24).

    python -m benchmarks.logprob_memory_bench                       # Qwen3-0.6B width, 4 layers, 16 x 4 x 256
    python -m benchmarks.logprob_memory_bench --chunk_tokens 2048 --steps 3

Random weights of the Qwen3-0.6B architecture (hidden 1024, 16 heads, 8 kv heads, head_dim 128, intermediate
3072, vocab 151,936) cut to --layers layers, on one device, one micro-batch. Prints the compiled step's
temporary bytes (XLA's memory_analysis), the compile time, each step's time and loss, and the process's
peak resident memory (getrusage maxrss). The vocabulary projection dominates at this width: [tokens, V]
float32 is 0.6 MB per token. A benchmark, not a test.
"""
import argparse
import resource
import time

import jax
import numpy as np

from benchmarks import train_bench
from oapl_jax import parallel
from oapl_jax.models import api, decoder
from oapl_jax.models.execution import EXECUTION_FIELDS
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.rl import trainer

GIB = 1024 ** 3


def peak_rss_gib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux: KiB


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--prompts", type=int, default=16)
  ap.add_argument("--group", type=int, default=4)
  ap.add_argument("--seq_len", type=int, default=256)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--steps", type=int, default=2)
  ap.add_argument("--chunk_tokens", type=int, default=0, help="logprob_chunk_tokens (0: the config's default)")
  args = ap.parse_args()

  config = QwenConfig.qwen3_0p6b().replace(num_layers=args.layers)
  if args.chunk_tokens:
    config = config.replace(logprob_chunk_tokens=args.chunk_tokens)
  chunk = {f: getattr(config, f) for f in EXECUTION_FIELDS if f.startswith("logprob_chunk")}
  mesh = parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  layout, model = parallel.Layout(mesh), api.for_config(config)
  params, _ = parallel.init_sharded(lambda: decoder.init_params(config, jax.random.PRNGKey(0)), mesh, layout.rules)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  train_cfg = trainer.TrainConfig()
  state = trainer.create_train_state(train_cfg, model, params, layout)
  del params
  B, G, T = args.prompts, args.group, args.seq_len
  print(f"{jax.devices()[0].platform}: {n_params / 1e6:.0f}M params, {config.num_layers} layers, B x G x T = "
        f"{B} x {G} x {T} ({B * G * T} tokens), {chunk}", flush=True)

  batch = train_bench.make_batch(B, G, T, config.vocab_size, seed=0)
  rng = jax.random.PRNGKey(0)
  start = time.perf_counter()
  step = trainer.make_train_step(train_cfg, model, layout).lower(state, batch, rng).compile()
  temp = step.memory_analysis().temp_size_in_bytes
  print(f"compiled in {time.perf_counter() - start:.0f} s: temp {temp / GIB:.2f} GiB; "
        f"peak RSS so far {peak_rss_gib():.2f} GiB", flush=True)
  times = []
  for i in range(args.steps):
    start = time.perf_counter()
    state, metrics = step(state, train_bench.make_batch(B, G, T, config.vocab_size, seed=i), rng)
    loss = float(jax.device_get(metrics["loss"]))
    times.append(time.perf_counter() - start)
    print(f"step {i}: {times[-1]:.1f} s, loss {loss:.6f}, peak RSS {peak_rss_gib():.2f} GiB", flush=True)
    # XLA:CPU frees a step's temporaries just after its outputs are ready; without a pause the next step
    # can allocate its own first, and the process briefly holds two (a spurious OOM under a memory cap).
    time.sleep(2.0)
  print(f"median step {np.median(times):.1f} s ({B * G * T / np.median(times):.0f} tokens/s); "
        f"peak RSS {peak_rss_gib():.2f} GiB")


if __name__ == "__main__":
  main()
