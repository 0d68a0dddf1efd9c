"""Two run directories' metrics.jsonl compared value by value (stdlib only): what a refactor must leave unchanged.

  python tools/compare_runs.py runs/demo_before runs/demo_after

Wall-clock fields (names ending in seconds, tokens_per_second, steps_per_second, ...) and the buffer's progress
(buffer/..., what the sampler thread had made when a step drew its batch) differ between any two runs and are
left out. Prints the count of compared values and every difference; exit 1 when any value or key differs.
"""
import argparse
import json
import os
import sys

UNTIMELY = ("seconds", "per_second", "buffer/", "refresh_bytes", "compiling")


def values(workdir: str) -> dict[tuple[int, str], float]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return {(row["step"], key): value for row in rows for key, value in row.items()
          if key != "step" and not any(part in key for part in UNTIMELY)}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("before")
  p.add_argument("after")
  args = p.parse_args(argv)
  a, b = values(args.before), values(args.after)
  differ = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
  only = sorted(a.keys() ^ b.keys())
  print(f"{len(a.keys() & b.keys())} values compared, {len(differ)} differ, {len(only)} keys in one run only")
  for step, key in differ[:50]:
    print(f"  step {step} {key}: {a[(step, key)]!r} -> {b[(step, key)]!r}")
  for step, key in only[:50]:
    print(f"  step {step} {key}: only in {'before' if (step, key) in a else 'after'}")
  return 1 if differ or only else 0


if __name__ == "__main__":
  sys.exit(main())
