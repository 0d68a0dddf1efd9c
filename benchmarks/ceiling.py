"""This machine's measured compute ceiling: the best float32 matmul rate JAX (XLA) and PyTorch reach here.

    python -m benchmarks.ceiling             # prints GFLOP/s per side and shape

The sampler and train benchmarks divide their own achieved rate (analytic FLOPs / second) by this ceiling, so a
ratio against a peer comes with the distance left to the hardware. The ceiling is the best of a few square and
decode-shaped matmuls (f32, the dtype both benchmarks run in), each timed as the median of --repeats calls after
a warm-up. The ceiling, and so every ratio against torch, depends on the host (README's train-bench table: the
same step read 1.16x on one of this project's VMs and 1.79-1.94x on another); `cpu_description()` names the host
on every benchmark's ceiling line. A benchmark, not a test.
"""
import argparse
import os
import platform
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

# (M, K, N): square, a decode step's vocabulary projection (64 rows, Qwen3-0.6B width), an MLP projection.
SHAPES = ((2048, 2048, 2048), (64, 1024, 151936), (1024, 1024, 3072))


def cpu_description(cpuinfo: str | None = None) -> str:
  """'<model name> (family, model), <n> cores, <widest vector ISA>' from /proc/cpuinfo (or the given text);
  where there is none (macOS, Windows), the platform's processor string."""
  if cpuinfo is None:
    try:
      with open("/proc/cpuinfo") as f:
        cpuinfo = f.read()
    except OSError:
      return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
  fields = dict(re.findall(r"^(model name|cpu family|model|flags|Features)\s*:\s*(.*)$", cpuinfo, re.M))
  flags = set((fields.get("flags") or fields.get("Features") or "").split())
  cores = len(re.findall(r"^processor\s*:", cpuinfo, re.M)) or os.cpu_count()
  if "avx512f" in flags:
    isa = "AVX-512" + (" with bf16" if flags & {"avx512_bf16", "amx_bf16"} else "")
  elif "avx2" in flags:
    isa = "AVX2" + (" with FMA" if "fma" in flags else "")
  elif "sve" in flags or "asimd" in flags:
    isa = "SVE" if "sve" in flags else "NEON"
  else:
    isa = "no AVX2"
  name = fields.get("model name", platform.machine())
  if "cpu family" in fields:  # x86: a VM's model name can be a bare "AMD EPYC"; family and model tell hosts apart
    name += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
  return f"{name}, {cores} core{'' if cores == 1 else 's'}, {isa}"


def median_seconds(fn, repeats: int) -> float:
  """The median wall time of `fn()` over `repeats` calls after one warm-up call (fn must wait for its result)."""
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def jax_gflops(m: int, k: int, n: int, repeats: int = 5, dtype=jnp.float32) -> float:
  """XLA's rate on one [m, k] x [k, n] dot; bfloat16 operands accumulate in float32 (as the bf16 sampler's
  models/projection_grad.low_precision_dot does)."""
  a = jax.random.normal(jax.random.PRNGKey(0), (m, k), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (k, n), jnp.float32).astype(dtype)
  dot = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
  return 2 * m * k * n / median_seconds(lambda: dot(a, b).block_until_ready(), repeats) / 1e9


def torch_gflops(m: int, k: int, n: int, repeats: int = 5) -> float:
  import torch  # local: the ceiling of JAX alone needs no torch
  a, b = torch.randn(m, k), torch.randn(k, n)
  with torch.no_grad():
    return 2 * m * k * n / median_seconds(lambda: a @ b, repeats) / 1e9


def measure(repeats: int = 5, with_torch: bool = True, dtype=jnp.float32) -> dict:
  """{'jax': best GFLOP/s, 'torch': best GFLOP/s (if asked; float32 only), 'by_shape': {(m, k, n): (jax, torch)}}."""
  by_shape = {}
  for shape in SHAPES:
    by_shape[shape] = (jax_gflops(*shape, repeats=repeats, dtype=dtype),
                       torch_gflops(*shape, repeats=repeats) if with_torch else float("nan"))
  out = {"jax": max(j for j, _ in by_shape.values()), "by_shape": by_shape}
  if with_torch:
    out["torch"] = max(t for _, t in by_shape.values())
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args()
  result = measure(args.repeats)
  print(f"cpu: {cpu_description()}")
  print(f"{'M x K x N':>22} {'jax GFLOP/s':>12} {'torch GFLOP/s':>14}")
  for (m, k, n), (j, t) in result["by_shape"].items():
    print(f"{f'{m} x {k} x {n}':>22} {j:>12.1f} {t:>14.1f}")
  print(f"ceiling (best f32 matmul): jax {result['jax']:.1f} GFLOP/s, torch {result['torch']:.1f} GFLOP/s")
  return result


if __name__ == "__main__":
  np.set_printoptions(precision=3)
  main()
