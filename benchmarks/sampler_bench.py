"""Sampler throughput: our rollout driver vs `transformers` PyTorch `generate`, same tiny checkpoint.

    python -m benchmarks.sampler_bench                 # batch 1, 16, 64; 128 new tokens
    python -m benchmarks.sampler_bench --batches 64 --new_tokens 256 --repeats 11
    python -m benchmarks.sampler_bench --width qwen3_0p6b --layers 4 --batches 64 --repeats 3   # real width

Both sample at temperature 1 (top-p 1, no top-k), never stop early, and are warmed up first: the
printed tokens/s exclude compilation (JAX's compile + first run is reported separately). The two
runs alternate, each side's median time over --repeats runs gives its tokens/s, and the ratio is
the median of the per-pair ratios (a pair runs back to back, so drifts in machine load, which
move both sides, mostly cancel). Also prints the wall time of a snapshot refresh (trainer f32
params -> sampler mesh, f32 and bf16). Each side's rate is also given as a fraction of this CPU's measured
compute ceiling (benchmarks/ceiling.py, the best f32 matmul rate of either library): decode FLOPs (2 x matmul
weights + attention over the tokens so far, per generated token) per second over the ceiling. With --floor, each
pair is followed by a timing of the matmuls our run cannot skip (benchmarks/matmul_floor.py, faster library per
shape); the median of HF's time over that floor, "reachable <=", bounds the ratio a sampler running those float32
matmuls reaches here.
A benchmark, not a test.
"""
import argparse
import os
import statistics
import tempfile
import time

import jax
import numpy as np
import torch

from benchmarks import ceiling, matmul_floor, random_models
from oapl_jax.run import compile_check
from oapl_jax.models import api, hf
from oapl_jax.sampler import core, rollout
from oapl_jax.sampler.settings import SamplingSettings

TINY, make_checkpoint = random_models.TINY, random_models.make_checkpoint  # benchmarks/random_models.py


def ours_runner(sampler, prompts, new_tokens, steps_per_sync):
  def run(seed):
    settings = SamplingSettings(max_new_tokens=new_tokens, steps_per_sync=steps_per_sync)
    groups = rollout.generate_groups(sampler, sampler.params, prompts, 1, settings, seed=seed)
    assert groups.num_tokens == len(prompts) * new_tokens
    return groups.wall_seconds
  return run


def hf_runner(model, prompts, new_tokens):
  ids = torch.tensor(prompts, device=model.device)
  kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=0)

  def run(seed):
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.no_grad():
      out = model.generate(ids, **kw)
    assert out.shape[1] == ids.shape[1] + new_tokens  # on a GPU, reading the shape waits for the tokens
    return time.perf_counter() - start
  return run


def time_interleaved(ours, theirs, repeats, floor=None):
  """Alternate the two (after one warm-up each) so drifts in machine load hit both alike.
  Returns (our median seconds per run, theirs, the median of their/our time per pair, our
  compile + first run seconds, the median of their time / `floor()` per pair, or None without a floor)."""
  start = time.perf_counter()
  ours(0)
  compile_s = time.perf_counter() - start
  theirs(0)
  times = [(ours(r + 1), theirs(r + 1), floor() if floor else None) for r in range(repeats)]
  return (statistics.median(t for t, _, _ in times), statistics.median(t for _, t, _ in times),
          statistics.median(b / a for a, b, _ in times), compile_s,
          statistics.median(b / f for _, b, f in times) if floor else None)


def time_refresh(model, trainer_params, dtype):
  sampler = core.Sampler(model.with_execution(param_dtype=dtype, dtype=dtype, remat=False), num_slots=1, max_prefill_length=16)
  sampler.refresh(trainer_params)  # compiles the cast
  times = []
  for _ in range(3):
    sampler.refresh(trainer_params)
    times.append(sampler.last_refresh_seconds)
  return min(times)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--prompt_length", type=int, default=8)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--steps_per_sync", type=int, default=16)
  ap.add_argument("--width", choices=["tiny", *sorted(set(random_models.WIDTHS) - {"tiny"})], default="tiny")
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--floor", action="store_true",
                  help="after each pair, time our run's matmul floor (benchmarks/matmul_floor.py): their time over "
                       "it bounds the ratio reachable here")
  args = ap.parse_args(argv)

  hf_cfg = None if args.width == "tiny" else random_models.hf_config(args.width, args.layers)
  with tempfile.TemporaryDirectory() as tmp:
    torch_model = make_checkpoint(tmp, hf_config=hf_cfg)
    config, params = hf.load(tmp)
  model = api.for_config(config)
  peak = ceiling.measure(repeats=3)
  top = max(peak["jax"], peak["torch"])
  # FLOPs per generated token: every matmul weight once (x2), attention over the mean context (QK and PV, x4).
  context = args.prompt_length + (args.new_tokens + 1) / 2
  flops_per_token = 2 * compile_check.train_flops(config, 1, 1)["matmul_weights"] + \
      4 * config.num_layers * config.num_heads * config.head_dim * context
  print(f"devices: {jax.devices()}  torch threads: {torch.get_num_threads()}  cpu count: {os.cpu_count()}")
  print(f"{args.width} Qwen3, {config.num_layers} layers, vocab {config.vocab_size}; prompt {args.prompt_length} "
        f"tokens, {args.new_tokens} new tokens, temperature 1; {flops_per_token / 1e6:.2f} MFLOP per token")
  print(f"cpu: {ceiling.cpu_description()}")
  print(f"compute ceiling (best f32 matmul here): jax {peak['jax']:.1f}, torch {peak['torch']:.1f} GFLOP/s; "
        f"'% ceil' = decode FLOPs per second over the higher")
  print(f"{'batch':>5} {'ours tok/s':>11} {'hf tok/s':>10} {'ratio':>7} {'ours % ceil':>12} {'hf % ceil':>10} "
        f"{'ours compile+1st run s':>23}")
  rng = np.random.RandomState(0)
  for batch in args.batches:
    prompts = rng.randint(0, config.vocab_size, (batch, args.prompt_length)).tolist()
    sampler = core.Sampler(model, num_slots=batch, max_prefill_length=max(16, args.prompt_length),
                           max_new_tokens=args.new_tokens)
    sampler.refresh(params)
    # A run's floor: new_tokens vocabulary projections of `batch` rows (prefill scores the first) and at least
    # as many layer passes; prefill's other positions, attention and sampling only add to it.
    shapes = matmul_floor.decode_shapes(config, batch)
    floor = (lambda: args.new_tokens * matmul_floor.floor_seconds(shapes)) if args.floor else None
    ours_s, theirs_s, speedup, compile_s, bound = time_interleaved(
        ours_runner(sampler, prompts, args.new_tokens, args.steps_per_sync),
        hf_runner(torch_model, prompts, args.new_tokens), args.repeats, floor)
    ours, theirs = batch * args.new_tokens / ours_s, batch * args.new_tokens / theirs_s
    fraction = lambda tokens_per_s: flops_per_token * tokens_per_s / 1e9 / top  # noqa: E731
    print(f"{batch:>5} {ours:>11.0f} {theirs:>10.0f} {speedup:>6.2f}x {fraction(ours):>12.1%} "
          f"{fraction(theirs):>10.1%} {compile_s:>23.2f}" + (f"  reachable <= {bound:.2f}x" if bound else ""))
  for dtype in ("float32", "bfloat16"):
    ms = 1e3 * time_refresh(model, params, dtype)
    print(f"snapshot refresh (f32 trainer params -> {dtype} sampler): {ms:.2f} ms")


if __name__ == "__main__":
  main()
