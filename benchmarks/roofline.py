"""A decode step's floors on this host: the memory-bound one (weight and KV-cache bytes read per step over the
measured read bandwidth) and the compute-bound one (FLOPs per step over the best measured matmul rate).

    python -m benchmarks.roofline                 # this host's read bandwidth (GB/s), best f32 and bf16 matmul rates
    python -m benchmarks.roofline --vocab_dot     # + what each library here reaches on the decode's largest dot

`--vocab_dot`: the tied vocabulary projection of Qwen3-0.6B ([B, 1,024] rows against the [151,936, 1,024] table, most
of a decode step at every batch), timed alone in XLA (the sampler's [E, V] order in float32, [V, E] in bfloat16, as
sampler/core runs them) and in torch (F.linear, one thread), each against the same two floors: no library that
falls short of a goal on this one dot can carry a whole decode step past it.

tunix_bench prints, per batch, each side's tokens/s against the larger of the two step times (the bound).
Bytes per step: every matmul weight once (the vocabulary projection's table included; a tied table is read by the
projection, the embedding lookup reads B rows) plus the cache of each row up to the mean context, K and V of every
layer. Norms and the lookup's rows are left out (< 0.1% here). A benchmark helper, not a test.
"""
import time

import jax
import jax.numpy as jnp


def read_gbps(megabytes: int = 1024, repeats: int = 5, width: int = 1024) -> float:
  """Best GB/s reading a float32 array of `megabytes` once, by the faster of two XLA programs: a sum of every
  element, and a [rows, width] table times a vector (a batch-1 decode's own access: a one-row dot per weight), so
  the floor is the best read XLA was seen to make here, whichever kernel made it."""
  x = jnp.ones((megabytes * 2**20 // 4 // width, width), jnp.float32)
  v = jnp.ones((width,), jnp.float32)
  total, matvec = jax.jit(jnp.sum), jax.jit(jnp.matmul)
  best = min(_best_seconds(lambda: total(x), repeats), _best_seconds(lambda: matvec(x, v), repeats))
  return x.nbytes / best / 1e9


def _best_seconds(read, repeats: int) -> float:
  """The least wall time of `read()` over `repeats` calls after a warm-up."""
  jax.block_until_ready(read())
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(read())
    best = min(best, time.perf_counter() - start)
  return best


def decode_bytes(config, batch: int, context: float, weight_bytes: int = 4, cache_bytes: int = 4) -> float:
  """Bytes a decode step reads: matmul weights once, the KV cache of `batch` rows at `context` positions."""
  from oapl_jax.run import compile_check  # pylint: disable=import-outside-toplevel
  weights = compile_check.train_flops(config, 1, 1)["matmul_weights"]
  cache = batch * config.num_layers * 2 * config.num_kv_heads * config.head_dim * context
  return weights * weight_bytes + cache * cache_bytes


def floors(step_bytes: float, step_flops: float, batch: int, gbps: float, gflops: float) -> dict:
  """Tokens/s at each floor and at the bound (the slower of the two), for a step of `batch` new tokens."""
  memory_s, compute_s = step_bytes / (gbps * 1e9), step_flops / (gflops * 1e9)
  return {"memory_tps": batch / memory_s, "compute_tps": batch / compute_s, "bound_tps": batch / max(memory_s, compute_s),
          "bound": "memory" if memory_s >= compute_s else "compute"}


def markdown(rows) -> str:
  """rows: (batch, floors(...), ours tokens/s, Tunix tokens/s)."""
  lines = ["| batch | memory floor (tok/s) | compute floor (tok/s) | bound by | ours | ours % of bound | Tunix | "
           "Tunix % of bound |", "|---:|---:|---:|---|---:|---:|---:|---:|"]
  for batch, f, ours, tunix in rows:
    lines.append(f"| {batch} | {f['memory_tps']:.0f} | {f['compute_tps']:.0f} | {f['bound']} | {ours:.0f} | "
                 f"{ours / f['bound_tps']:.0%} | {tunix:.0f} | {tunix / f['bound_tps']:.0%} |")
  return "\n".join(lines)


VOCAB, WIDTH = 151_936, 1_024  # Qwen3-0.6B's tied table


def vocab_dot_seconds(library: str, dtype: str, rows: int, repeats: int = 5) -> float:
  """Median seconds of one [rows, WIDTH] x table^T projection, in float32 accumulation, by `library`."""
  from benchmarks import ceiling  # pylint: disable=import-outside-toplevel
  if library == "torch":
    import torch  # pylint: disable=import-outside-toplevel
    torch.set_num_threads(1)
    tdt = getattr(torch, dtype)
    table, h = torch.randn(VOCAB, WIDTH).to(tdt), torch.randn(rows, WIDTH).to(tdt)
    with torch.no_grad():
      return ceiling.median_seconds(lambda: torch.nn.functional.linear(h, table), repeats)
  jdt = jnp.dtype(dtype)
  h = jnp.ones((rows, WIDTH), jdt)
  if jdt == jnp.float32:  # the sampler keeps a tied table's [E, V] transpose for the float32 logits on CPU
    table, dims = jnp.ones((WIDTH, VOCAB), jdt), (((1,), (0,)), ((), ()))
  else:
    table, dims = jnp.ones((VOCAB, WIDTH), jdt), (((1,), (1,)), ((), ()))
  dot = jax.jit(lambda x, w: jax.lax.dot_general(x, w, dims, preferred_element_type=jnp.float32))
  return ceiling.median_seconds(lambda: dot(h, table).block_until_ready(), repeats)


def vocab_dot_table(gbps: float, gflops: dict, batches=(1, 16, 64), repeats: int = 5) -> str:
  """Each library's share of the dot's bound (the slower of its memory and compute floors), per dtype and batch."""
  lines = ["| dtype | batch | floor (ms) | bound by | XLA (ms) | XLA % of floor | torch (ms) | torch % of floor |",
           "|---|---:|---:|---|---:|---:|---:|---:|"]
  for dtype, nbytes in (("float32", 4), ("bfloat16", 2)):
    for rows in batches:
      f = floors(VOCAB * WIDTH * nbytes, 2 * rows * VOCAB * WIDTH, rows, gbps, gflops[dtype])
      floor_s = rows / f["bound_tps"]
      xla, torch_s = (vocab_dot_seconds(lib, dtype, rows, repeats) for lib in ("xla", "torch"))
      lines.append(f"| {dtype} | {rows} | {1e3 * floor_s:.1f} | {f['bound']} | {1e3 * xla:.1f} | {floor_s / xla:.0%} | "
                   f"{1e3 * torch_s:.1f} | {floor_s / torch_s:.0%} |")
  return "\n".join(lines)


if __name__ == "__main__":
  import sys

  from benchmarks import ceiling
  gbps = read_gbps()
  rates = {"float32": ceiling.measure(repeats=3, with_torch=False)["jax"],
           "bfloat16": ceiling.measure(repeats=3, with_torch=False, dtype=jnp.bfloat16)["jax"]}
  print(f"cpu: {ceiling.cpu_description()}; read {gbps:.1f} GB/s; XLA's best matmul: f32 {rates['float32']:.1f} "
        f"GFLOP/s, bf16 (f32 accumulation) {rates['bfloat16']:.1f} GFLOP/s", flush=True)
  if "--vocab_dot" in sys.argv[1:]:
    print(vocab_dot_table(gbps, rates))
