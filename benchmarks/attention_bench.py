"""Attention memory and time against sequence length: reference (full scores) vs blockwise.

    python -m benchmarks.attention_bench                       # T = 512..4096, B=1, H=4, K=2, D=64
    python -m benchmarks.attention_bench --lengths 1024,8192 --block 256 --rounds 5

For each T both kernels are jitted as forward + backward (gradients of <out, cotangent> w.r.t. q, k
and v, causal, index positions, no padding). Printed per T: XLA's compiled temporary bytes, the
median wall time per call over `--rounds` alternating rounds (fair on a shared machine), the ratios
reference / blockwise, and the largest gradient difference between the two as a check that both
compute one thing. The reference is skipped above --max_reference_len. A benchmark, not a test.
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from oapl_jax.models.attention import attend


def train_fn(implementation, block):
  """Jitted (q, k, v, cotangent) -> (dq, dk, dv) of <attend(q, k, v), cotangent>."""

  def grads(q, k, v, cotangent):
    B, T = q.shape[:2]
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    fn = lambda q, k, v: attend(q, k, v, q_positions_BxT=pos, kv_positions_BxS=pos,
                                implementation=implementation, block_q=block, block_kv=block)
    _, vjp = jax.vjp(fn, q, k, v)
    return vjp(cotangent)

  return jax.jit(grads)


def measure(args):
  rng = np.random.default_rng(0)
  rows = []
  for T in args.lengths:
    shapes = [(args.batch, T, args.heads, args.head_dim), (args.batch, T, args.kv_heads, args.head_dim),
              (args.batch, T, args.kv_heads, args.head_dim), (args.batch, T, args.heads, args.head_dim)]
    inputs = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in shapes]
    kernels = ["blockwise"] + (["reference"] if T <= args.max_reference_len else [])
    compiled, temp, times, grads = {}, {}, {}, {}
    for name in kernels:
      compiled[name] = train_fn(name, args.block).lower(*inputs).compile()
      temp[name] = compiled[name].memory_analysis().temp_size_in_bytes
      grads[name] = jax.block_until_ready(compiled[name](*inputs))  # warm-up
      times[name] = []
    for _ in range(args.rounds):
      for name in kernels:
        start = time.perf_counter()
        jax.block_until_ready(compiled[name](*inputs))
        times[name].append(time.perf_counter() - start)
    diff = (max(float(jnp.abs(a - b).max()) for a, b in zip(grads["blockwise"], grads["reference"]))
            if "reference" in grads else float("nan"))
    rows.append((T, temp.get("reference"), temp["blockwise"], np.median(times.get("reference", [np.nan])),
                 np.median(times["blockwise"]), diff))
    print_row(*rows[-1])
  return rows


def print_row(T, ref_temp, blk_temp, ref_s, blk_s, diff):
  mib = lambda b: float("nan") if b is None else b / 2**20
  ref_temp_mib = mib(ref_temp)
  print(f"{T:>6} | {ref_temp_mib:>12.1f} {mib(blk_temp):>12.1f} {ref_temp_mib / mib(blk_temp):>8.1f}x | "
        f"{ref_s * 1e3:>10.1f} {blk_s * 1e3:>10.1f} {ref_s / blk_s:>8.2f}x | {diff:.1e}", flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--lengths", default="512,1024,2048,4096", type=lambda s: [int(x) for x in s.split(",")])
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--kv_heads", type=int, default=2)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--block", type=int, default=512)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--max_reference_len", type=int, default=8192)
  args = parser.parse_args()
  print(f"{jax.devices()[0].platform}, float32, forward+backward, B={args.batch} H={args.heads} K={args.kv_heads} "
        f"D={args.head_dim}, blockwise block_q=block_kv={args.block}, median of {args.rounds} rounds")
  print(f"{'T':>6} | {'temp MiB ref':>12} {'blockwise':>12} {'ratio':>9} | {'ms/call ref':>10} {'blockwise':>10} "
        f"{'ratio':>9} | max |dgrad|")
  measure(args)


if __name__ == "__main__":
  main()
