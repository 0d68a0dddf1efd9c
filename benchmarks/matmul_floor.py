"""The least time a step's matmuls take on this machine: each matmul shape the step needs, timed alone in JAX
and in PyTorch, the faster kept, times how often the step runs it, summed.

    python -m benchmarks.matmul_floor --width qwen3_0p6b --layers 4 --decode_rows 64 --train_tokens 2048

A step that runs these float32 matmuls through either library takes at least this long (as far as a matmul in a
program runs no faster than alone: each ratio achieved so far stayed under its bound), and everything else a step
does (attention, softmax, sampling, the optimizer) comes on top. So a peer's step time over our floor, measured
in the same minute (this VM's speed drifts by 1.6x over a session), bounds the ratio we could reach against it.
The sampler and train benchmarks measure it between their timed pairs (--floor). Attention's matmuls are left
out, which only lowers the floor. A benchmark, not a test.
"""
import argparse
import collections
import tempfile
import time

import jax
import jax.numpy as jnp


def _layer_denses(config) -> list[tuple[int, int]]:
  """(in, out) of one decoder layer's projections: q, k, v, o, gate, up, down."""
  E, H, K, D, F = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate_size
  return [(E, H * D), (E, K * D), (E, K * D), (H * D, E), (E, F), (E, F), (F, E)]


def decode_shapes(config, rows: int) -> collections.Counter:
  """(M, K, N) -> count for one decode step of `rows` sequences: every projection, then the vocabulary's."""
  shapes = collections.Counter()
  for i, o in _layer_denses(config):
    shapes[(rows, i, o)] += config.num_layers
  shapes[(rows, config.hidden_size, config.vocab_size)] += 1
  return shapes


def train_shapes(config, tokens: int, vocab_tokens: int) -> collections.Counter:
  """One training step over `tokens` positions, `vocab_tokens` of them scored (the response tokens): each
  projection's forward (x W), input gradient (dy W^T) and weight gradient (x^T dy). No recomputation."""
  shapes = collections.Counter()
  for n, denses in ((tokens, _layer_denses(config) * config.num_layers),
                    (vocab_tokens, [(config.hidden_size, config.vocab_size)])):
    for i, o in denses:
      shapes[(n, i, o)] += 1
      shapes[(n, o, i)] += 1
      shapes[(i, n, o)] += 1
  return shapes


def _best_seconds(run, repeats: int) -> float:
  run()  # warm-up (and compile)
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    best = min(best, time.perf_counter() - start)
  return best


def time_shape(m: int, k: int, n: int, repeats: int = 2) -> dict:
  """Best seconds of one f32 [m, k] x [k, n] matmul: {'jax': s, 'torch': s}."""
  import torch  # local: importing this module needs no torch
  a = jax.random.normal(jax.random.PRNGKey(0), (m, k), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (k, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  out = {"jax": _best_seconds(lambda: dot(a, b).block_until_ready(), repeats)}
  del a, b
  ta, tb = torch.randn(m, k), torch.randn(k, n)
  with torch.no_grad():
    out["torch"] = _best_seconds(lambda: ta @ tb, repeats)
  return out


def time_shapes(shapes, repeats: int = 2) -> dict:
  """{(m, k, n): time_shape(m, k, n)} for every shape."""
  return {shape: time_shape(*shape, repeats=repeats) for shape in shapes}


def floor_from(shapes: collections.Counter, times: dict) -> float:
  """Sum over shapes of count x the faster library's time."""
  return sum(count * min(times[shape].values()) for shape, count in shapes.items())


def floor_seconds(shapes: collections.Counter, repeats: int = 2) -> float:
  return floor_from(shapes, time_shapes(shapes, repeats))


def main(argv=None):
  from benchmarks import random_models  # local: importing this module needs no torch
  from oapl_jax.models import hf
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--width", choices=sorted(random_models.WIDTHS), default="tiny")
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--decode_rows", type=int, default=64)
  ap.add_argument("--train_tokens", type=int, default=2048)
  ap.add_argument("--vocab_tokens", type=int, default=None, help="scored positions (default: all)")
  args = ap.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    random_models.make_checkpoint(tmp, hf_config=random_models.hf_config(args.width, args.layers))
    config, _ = hf.load(tmp)
  for name, shapes in (("decode step", decode_shapes(config, args.decode_rows)),
                       ("train step", train_shapes(config, args.train_tokens,
                                                   args.vocab_tokens or args.train_tokens))):
    print(f"{name}: {'M x K x N':>24} {'count':>5} {'jax ms':>9} {'torch ms':>9}")
    times = time_shapes(shapes)
    for shape, count in shapes.items():
      t = times[shape]
      print(f"{'':>{len(name) + 1}} {' x '.join(map(str, shape)):>24} {count:>5} {1e3 * t['jax']:>9.2f} "
            f"{1e3 * t['torch']:>9.2f}")
    print(f"{name} floor: {1e3 * floor_from(shapes, times):.1f} ms")


if __name__ == "__main__":
  main()
