"""Where each compiled program's memory goes, per chip: its largest buffers and the ops that fill them, from XLA.

  python -m benchmarks.memory_breakdown --config configs/math.py --topology v5p-64 --config.trainer.micro_batches=2
  python -m benchmarks.memory_breakdown --config configs/code.py --topology v5p-64 --programs train_step --top 30

Each program (train_step, prefill, insert, decode) is compiled as the compile check compiles it (the run's own
factories, ahead of time for the topology with libtpu), with XLA's dump on (xla_dump_to a temp dir). Three dumped
files are read: *-buffer-assignment.txt (every allocation: arguments, outputs, temporaries, by memory space: HBM or
pinned host), *-memory-usage-report.txt (the largest buffers of each space's temporaries, the values that take turns
in each) and *-buffer-assignment-values.txt (the op that made each value: its JAX name stack, e.g.
.../layers/mlp/gate_proj/dot_general; transpose(jvp(...)) is the backward pass, rematted_computation a remat's
recompute). The dumped assignment can account for less than memory_analysis's total (the compile check's number):
math.py's 2 micro-batch step at HEAD dumps 52.2 GiB of HBM against 76.7 GiB in memory_analysis, so the largest
buffers say what fills memory, not every byte of the total. A benchmark, not a test.
"""
from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
import sys
import tempfile
from typing import Optional, Sequence

GIB = 1024 ** 3
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+), (.*):$")
_VALUE = re.compile(r"value: <\d+ (\S+?)(\{[\d,]*\})?(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")
_INSTRUCTION = re.compile(r"from instruction: %(\S+) = .*?op_name=\"([^\"]*)\"")
_SPACES = {0: "HBM", 5: "pinned host"}  # XLA:TPU memory spaces (colors); others: on-chip scratch


@dataclasses.dataclass
class Value:
  name: str  # the HLO instruction
  size: int
  offset: int
  shape: str  # without layout


@dataclasses.dataclass
class Allocation:
  size: int
  kind: str  # argument | output | temp | constant
  color: int  # memory space: 0 HBM, 5 pinned host
  values: list


def _strip_layout(shape: str) -> str:
  return re.sub(r"\{[^{}]*\}", "", shape).strip()


def _kind(descr: str) -> str:
  return ("argument" if descr.startswith("parameter") else "output" if "output shape" in descr
          else "constant" if descr.startswith("constant") else "temp")


def read_allocations(prefix: str) -> list:
  """The buffer assignment of one dumped module (`prefix`: its path without the suffixes)."""
  allocations = []
  with open(prefix + ".after_optimizations-buffer-assignment.txt") as f:
    for line in f:
      if (m := _ALLOCATION.match(line)):
        color = re.search(r"\bcolor (\d+)", m.group(2))
        allocations.append(Allocation(int(m.group(1)), _kind(m.group(2)), int(color.group(1)) if color else 0, []))
      elif allocations and (m := _VALUE.search(line)):
        allocations[-1].values.append(Value(m.group(1), int(m.group(3)), int(m.group(4)), _strip_layout(m.group(5))))
  return allocations


def read_ops(prefix: str) -> dict:
  """HLO instruction -> the JAX name stack (op_name) that made it, where XLA kept one."""
  ops, path = {}, prefix + ".after_optimizations-buffer-assignment-values.txt"
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        if "from instruction" in line and (m := _INSTRUCTION.search(line)):
          ops[m.group(1)] = m.group(2).replace("\\'", "'")
  return ops


_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": GIB, "TiB": 1024 * GIB}
_SLOT = re.compile(r"^\s*[\d.]+\w+\(\s*\d+%\);\s*([\d.]+)(\w+);\s*(\d+);\s*(\d+);\s*(.*)$")


def read_usage_report(prefix: str) -> dict:
  """XLA's memory-usage report: memory space color -> its largest buffers [(bytes, offset, values, shapes)]
  (a buffer is one stretch of an allocation; the values listed take turns in it)."""
  out, color, path = {}, None, prefix + ".after_optimizations-memory-usage-report.txt"
  if not os.path.exists(path):
    return out
  with open(path) as f:
    for line in f:
      if (m := re.match(r"^Memory Space: .*\(color=(\d+)\)", line)):
        color = int(m.group(1))
        out[color] = []
      elif line.strip() == "" and color is not None and out[color]:
        color = None  # only each space's first table: the temporaries
      elif color is not None and (m := _SLOT.match(line)):
        size = int(float(m.group(1)) * _UNITS[m.group(2)])
        out[color].append((size, int(m.group(3)), int(m.group(4)), m.group(5).strip()))
  return out


def _short(op: str, width: int) -> str:
  op = re.sub(r"^jit\([^)]*\)/", "", op)
  op = re.sub(r"(/while/body/closed_call)+", "/..", op)
  return op if len(op) <= width else "..." + op[-(width - 3):]


def _gib(n: int) -> str:
  return f"{n / GIB:7.2f}"


def format_breakdown(program: str, prefix: str, hbm_bytes: int, top: int, ops_per_buffer: int = 3) -> str:
  """Totals per memory space and kind, the largest temporary buffers with the ops that fill them, and the
  largest arguments."""
  allocations, ops, report = read_allocations(prefix), read_ops(prefix), read_usage_report(prefix)
  totals = collections.Counter()
  for a in allocations:
    totals[(a.color, a.kind)] += a.size
  lines = [f"== {program} ({os.path.basename(prefix).split('.')[1]}): per chip, XLA's buffer assignment"]
  for color, space in _SPACES.items():
    parts = ", ".join(f"{k} {v / GIB:.2f}" for (c, k), v in sorted(totals.items(), key=lambda kv: -kv[1]) if c == color)
    if parts:
      share = sum(v for (c, _), v in totals.items() if c == color) / hbm_bytes
      lines.append(f"  {space}: {parts} GiB" + (f" ({100 * share:.1f}% of HBM)" if color == 0 else ""))
  for color, space in _SPACES.items():
    temp = max((a for a in allocations if a.kind == "temp" and a.color == color), key=lambda a: a.size, default=None)
    if temp is None or not report.get(color):
      continue
    at = collections.defaultdict(list)
    for v in temp.values:
      at[v.offset].append(v)
    lines.append(f"  largest buffers of the {space} temporaries ({temp.size / GIB:.2f} GiB; buffers at different times "
                 "may share bytes): GiB, values, their shapes, the ops that made the largest (JAX name stack)")
    for size, offset, count, shapes in report[color][:top]:
      named = []
      for v in sorted(at.get(offset, []), key=lambda v: -v.size):
        op = _short(ops.get(v.name, "") or v.name, 120)
        if op not in named and len(named) < ops_per_buffer:
          named.append(op)
      lines.append(f"  {size / GIB:7.2f} {count:4d}  {shapes[:100]}" + "".join(f"\n{'':14}{op}" for op in named))
  args = sorted((a for a in allocations if a.kind == "argument" and a.values), key=lambda a: -a.size)
  if args:
    lines.append("  largest arguments: " + "; ".join(
        f"{a.size / GIB:.3f} {a.values[0].shape} {ops.get(a.values[0].name, a.values[0].name)}" for a in args[:3]))
  return "\n".join(lines)


def dumped_modules(dump_dir: str) -> list:
  """Prefixes of the dumped modules that have a buffer assignment, in compile order."""
  suffix = ".after_optimizations-buffer-assignment.txt"
  return sorted(p[: -len(suffix)] for p in glob.glob(os.path.join(dump_dir, "*" + suffix)))


def main(argv: Optional[Sequence[str]] = None) -> int:
  from oapl_jax.run import compile_check as cc  # pylint: disable=import-outside-toplevel
  from oapl_jax.apps import compile_check as app  # pylint: disable=import-outside-toplevel
  from oapl_jax.apps import cli  # pylint: disable=import-outside-toplevel
  p = cli.parser("python -m benchmarks.memory_breakdown", __doc__)
  cli.add_config(p, required=True)
  p.add_argument("--topology", required=True, help="v5p-64, v5e-256, v6e-16, ...")
  p.add_argument("--programs", default=",".join(cc.PROGRAMS), help="comma-separated programs to compile")
  p.add_argument("--seq_len", type=int, default=0, help="trainer sequence length T (0: as the run computes it)")
  p.add_argument("--top", type=int, default=20, help="buffers per memory space")
  p.add_argument("--ops_per_buffer", type=int, default=3, help="ops named per buffer")
  p.add_argument("--dump_dir", default="", help="keep XLA's dump here (default: a temp dir, removed)")
  args, cfg = cli.parse(p, argv)
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_platforms", "cpu")  # compile-only TPU devices come from libtpu
  programs = [x for x in args.programs.split(",") if x]
  with tempfile.TemporaryDirectory(prefix="memory_breakdown_") as tmp:
    dump_dir = args.dump_dir or tmp
    report = cc.check(cfg, args.topology, seq_len=args.seq_len or None, programs=programs,
                      compiler_options={"xla_dump_to": dump_dir, "xla_dump_hlo_as_text": True})
    print(app.format_report(report))
    print("\nmemory_analysis totals above; below, the dumped buffer assignment of each program")
    modules = dumped_modules(dump_dir)
    for name, mem in report.programs.items():
      if mem.error:
        print(f"\n== {name}: did not compile ({mem.error[:200]}): no buffer assignment to read")
        continue
      prefix = next((m for m in modules if os.path.basename(m).split(".")[1].startswith(f"jit_{name}")), None)
      if prefix is None:
        print(f"\n== {name}: XLA dumped no buffer assignment")
        continue
      print("\n" + format_breakdown(name, prefix, report.hbm_bytes, args.top, args.ops_per_buffer))
  return 0


if __name__ == "__main__":
  sys.exit(main())
