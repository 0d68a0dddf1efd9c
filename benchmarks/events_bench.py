"""The two TensorBoard events writers (`report.events`) side by side: a write's time and the import's, one process
each, the same scalars.

    taskset -c 1 python -m benchmarks.events_bench            # 25 scalars a write, 300 writes

A benchmark, not a test: tests/reporting_test.py checks what the writers write.
"""
import argparse
import json
import subprocess
import sys

WORKER = """
import json, statistics, sys, tempfile, time
start = time.perf_counter()
from oapl_jax import event_writers
writer = event_writers.open_writer(tempfile.mkdtemp(), sys.argv[1])
opened = time.perf_counter() - start
scalars = {f"train/metric_{i}": i / 7 for i in range(int(sys.argv[2]))}
times = []
for step in range(int(sys.argv[3])):
  t = time.perf_counter()
  writer.write_scalars(step, scalars)
  times.append(time.perf_counter() - t)
t = time.perf_counter()
writer.close()
print(json.dumps({"open_s": opened, "write_ms": 1e3 * statistics.median(times[20:]),
                  "mean_write_ms": 1e3 * statistics.mean(times), "close_ms": 1e3 * (time.perf_counter() - t),
                  "tensorflow_imported": "tensorflow" in sys.modules}))
"""


def measure(kind: str, scalars: int, writes: int) -> dict:
  done = subprocess.run([sys.executable, "-c", WORKER, kind, str(scalars), str(writes)], capture_output=True,
                        text=True, check=True)
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--scalars", type=int, default=25, help="scalars a write (the loop's train metrics: 27)")
  ap.add_argument("--writes", type=int, default=300)
  args = ap.parse_args(argv)
  rows = {kind: measure(kind, args.scalars, args.writes) for kind in ("clu", "tensorboard")}
  for kind, r in rows.items():
    print(f"{kind:12s} open (imports included) {r['open_s']:.2f} s | a write of {args.scalars} scalars: median "
          f"{r['write_ms']:.3f} ms, mean {r['mean_write_ms']:.3f} ms | close {r['close_ms']:.1f} ms | tensorflow "
          f"imported: {r['tensorflow_imported']}")
  clu, ours = rows["clu"], rows["tensorboard"]
  print(f"clu / tensorboard: {clu['write_ms'] / ours['write_ms']:.0f}x a write (median), "
        f"{clu['mean_write_ms'] / ours['mean_write_ms']:.0f}x (mean), "
        f"{clu['open_s'] - ours['open_s']:.1f} s more to open")


if __name__ == "__main__":
  main()
