"""Sandbox throughput: program runs per second through SandboxPool, at several worker counts.

    python -m benchmarks.sandbox_bench
    python -m benchmarks.sandbox_bench --workers 1,2,4,8,16 --runs 64

Programs: `trivial` (print one line), `cpu_1s` (spins 1 s of CPU time), `sleep_1s` (sleeps 1 s),
and `harness_10` (the code reward's harness with 10 stdin tests of a trivial solution: one
sandboxed run per program; its rate counts programs, tests/s = 10x). Each row runs one batch
after a warm-up run; runs/s = runs / the batch's wall time (the pool's own counter, which the
trainer logs). A benchmark, not a test.
"""
import argparse
import json
import os
import time

from oapl_jax.tasks import code_reward, sandbox, sandbox_pool

PROGRAMS = {
    "trivial": "print('hello')\n",
    "cpu_1s": "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end:\n  pass\n",
    "sleep_1s": "import time\ntime.sleep(1.0)\n",
}


def harness_job(num_tests: int) -> sandbox.Job:
  record = {"tests": [{"input": f"{i} {i}\n", "output": f"{2 * i}\n", "testtype": "stdin"} for i in range(num_tests)]}
  response = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
  _, job = code_reward._job(record, response, code_reward.Settings())  # pylint: disable=protected-access
  return job


def bench(name: str, job: sandbox.Job, workers: int, runs: int) -> dict:
  with sandbox_pool.SandboxPool(workers, limits=sandbox.Limits(wall_s=30.0)) as pool:
    pool.run_batch([job])  # warm-up (page cache, thread start)
    before = pool.stats()
    start = time.perf_counter()
    results = pool.run_batch([job] * runs)
    wall = time.perf_counter() - start
    after = pool.stats()
  bad = [r.reason for r in results if not r.ok]
  if bad:
    raise RuntimeError(f"{name}: {len(bad)} runs failed: {bad[:3]}")
  rate = (after.runs - before.runs) / (after.busy_s - before.busy_s)
  return dict(program=name, workers=workers, runs=runs, wall_s=round(wall, 2), runs_per_s=round(rate, 2),
              mean_run_s=round(sum(r.wall_s for r in results) / runs, 3))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workers", default="1,2,4,8")
  parser.add_argument("--runs", type=int, default=0, help="runs per row (default: by program)")
  parser.add_argument("--programs", default="trivial,cpu_1s,sleep_1s,harness_10")
  args = parser.parse_args()
  print(f"isolation: {sandbox.detect_isolation()}, cpus: {os.cpu_count()}, load: {os.getloadavg()[0]:.1f}")
  rows = []
  for name in args.programs.split(","):
    job = harness_job(10) if name == "harness_10" else sandbox.Job(PROGRAMS[name])
    for workers in map(int, args.workers.split(",")):
      runs = args.runs or (48 if name in ("trivial", "harness_10") else 3 * workers)
      row = bench(name, job, workers, runs)
      rows.append(row)
      print(json.dumps(row), flush=True)
  print(f"\n| program | workers | runs | wall s | runs/s | mean run s |\n|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['program']} | {r['workers']} | {r['runs']} | {r['wall_s']} | {r['runs_per_s']} | {r['mean_run_s']} |")


if __name__ == "__main__":
  main()
