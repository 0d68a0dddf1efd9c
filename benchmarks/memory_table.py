"""Per-chip memory of the Qwen3-4B OAPL train step (configs/math.py) on a TPU slice, against T.

    python -m benchmarks.memory_table                  # v5p-64, T = 2K..32K, 32 prompts x 8, 1 micro-batch
    python -m benchmarks.memory_table --prompts 64 --micro_batches 4 --seq_lens 18431
    python -m benchmarks.memory_table --paper_micro_batches 32,2   # + configs/math.py's own layout

Every row is `compile_check.check` of the train step alone (same factories, shardings, remat and dtypes
as the run), compiled ahead of time for the topology with libtpu. The default layout holds the
prompts x samples per step fixed while T grows ("one prompt x 8 samples per chip": 32 prompts on
v5p-64's 32 chips, no micro-batching), so tokens per chip grow with T and memory linear in T
keeps temp(32K) / temp(2K) near 16. A row XLA cannot fit fails to compile; it shows the total the
compiler asked for (">=") and no breakdown. Needs libtpu (see compile_check). A benchmark, not a test.
"""
import argparse
import json
import sys
import time

from configs import math as math_config
from oapl_jax.run import compile_check

GIB = 1024 ** 3


def row(topology: str, prompts: int, group: int, micro_batches: int, seq_len: int, attention: str) -> dict:
  cfg = math_config.get_config()
  cfg.model.overrides = {"attention": attention}
  cfg.loop.update(batch_prompts=prompts, group_size=group, prompts_per_rollout=max(prompts, cfg.loop.prompts_per_rollout))
  cfg.trainer.micro_batches = micro_batches
  start = time.perf_counter()
  report = compile_check.check(cfg, topology, seq_len=seq_len, programs=("train_step",))
  mem = report.programs["train_step"]
  return {"attention": attention, "seq_len": seq_len, "prompts": prompts, "group": group, "micro_batches": micro_batches,
          "tokens_per_chip_per_micro_batch": prompts * group * seq_len / micro_batches / report.trainer_devices,
          "argument_gib": mem.argument / GIB, "temp_gib": mem.temp / GIB, "total_gib": mem.total / GIB,
          "hbm_fraction": mem.total / report.hbm_bytes, "fits": report.fits()["train_step"],
          "compiler_error": mem.error, "compile_seconds": time.perf_counter() - start}


def format_rows(rows: list, topology: str) -> str:
  lines = [f"Qwen3-4B OAPL train step on {topology} (bf16 compute, f32 master + AdamW, remat, "
           f"{rows[0]['attention']} attention), per chip:",
           "      T  prompts x G  micro  tokens/chip/mb   args GiB   temp GiB  total GiB   % HBM  fits  compile s"]
  for r in rows:
    known = not r["compiler_error"]
    args = f"{r['argument_gib']:10.2f}" if known else f"{'':>10}"
    temp = f"{r['temp_gib']:10.2f}" if known else f"{'':>10}"
    total = f"{r['total_gib']:10.2f}" if known else f">={r['total_gib']:8.1f}"
    lines.append(f"{r['seq_len']:7d}  {r['prompts']:>7} x {r['group']:<2} {r['micro_batches']:6d}  "
                 f"{r['tokens_per_chip_per_micro_batch']:14.0f} {args} {temp} {total} {100 * r['hbm_fraction']:6.0f}%  "
                 f"{'yes' if r['fits'] else 'NO':>4}  {r['compile_seconds']:9.0f}")
  return "\n".join(lines)


def growth(rows: list) -> str:
  """temp (or, where a row did not compile, total) at the longest T over the shortest, same layout."""
  first, last = rows[0], rows[-1]
  key = "temp_gib" if not (first["compiler_error"] or last["compiler_error"]) else "total_gib"
  return (f"{key.split('_')[0]}(T={last['seq_len']}) / {key.split('_')[0]}(T={first['seq_len']}) = "
          f"{last[key] / first[key]:.1f}  (T grew {last['seq_len'] / first['seq_len']:.0f}x)")


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--topology", default="v5p-64")
  ap.add_argument("--seq_lens", default="2048,4096,8192,16384,32768")
  ap.add_argument("--prompts", type=int, default=32, help="prompts per optimizer step")
  ap.add_argument("--group", type=int, default=8, help="samples per prompt")
  ap.add_argument("--micro_batches", type=int, default=1)
  ap.add_argument("--paper_micro_batches", default="",
                  help="also configs/math.py's own layout (64 x 8, T=18431) at these micro_batches (as written: 32)")
  ap.add_argument("--attention", default="reference", help="models/attention.py kernel (model.overrides)")
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  rows = []
  for T in (int(t) for t in args.seq_lens.split(",") if t):
    rows.append(row(args.topology, args.prompts, args.group, args.micro_batches, T, args.attention))
    print(format_rows(rows[-1:], args.topology).splitlines()[-1], file=sys.stderr, flush=True)
  print(format_rows(rows, args.topology))
  if len(rows) > 1:
    print(growth(rows))
  if args.paper_micro_batches:
    T = compile_check.seq_len_of(math_config.get_config())
    paper = [row(args.topology, 64, 8, int(mb), T, args.attention) for mb in args.paper_micro_batches.split(",")]
    print("\nconfigs/math.py's layout:\n" + format_rows(paper, args.topology))
    rows += paper
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=2)


if __name__ == "__main__":
  import jax
  jax.config.update("jax_platforms", "cpu")  # compile-only TPU devices come from libtpu
  main()
