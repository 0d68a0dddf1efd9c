"""Sandbox throughput: program runs per second through SandboxPool, at several worker counts.

    python -m benchmarks.sandbox_bench
    python -m benchmarks.sandbox_bench --workers 1,2,4,8,16 --runs 64

Programs: `trivial` (print one line), `cpu_1s` (spins 1 s of CPU time), `sleep_1s` (sleeps 1 s),
and `harness_10` (the code reward's harness with 10 stdin tests of a trivial solution: one
sandboxed run per program; its rate counts programs, tests/s = 10x). Each row runs one batch
after a warm-up run; runs/s = runs / the batch's wall time (the pool's own counter, which the
trainer logs). A benchmark, not a test.

    python -m benchmarks.sandbox_bench --reward 64 --workers 2 [--batch 8]

--reward N: instead, N distinct code_synthetic programs (`def f(x): return a*x-b`, 4 function-call tests) graded by
code_reward.CodeReward (one call, after a warm-up call on others); reports programs/s of wall time and checks every
reward is 1. --batch: CodeReward's batch_size (programs per sandbox run).
"""
import argparse
import json
import os
import time

from oapl_jax.tasks import code_reward, code_task, sandbox, sandbox_pool

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


def bench_reward(num: int, workers: int, batch: int | None) -> dict:
  """programs/s of CodeReward on `num` distinct code_synthetic programs (all correct: every reward must be 1)."""
  problems = [(a, "-", b) for a in range(2, 100) for b in range(1, 10)][:2 * num]
  records = [code_task.tests_record(*p) for p in problems]
  responses = [code_task.program(*p) for p in problems]
  kw = {} if batch is None else dict(batch_size=batch)
  reward = code_reward.CodeReward(num_workers=workers, timeout_s=2.0, **kw)
  try:
    reward(records[num:], responses[num:])  # warm-up, on the other programs
    start = time.perf_counter()
    result = reward(records[:num], responses[:num])
    wall = time.perf_counter() - start
  finally:
    reward.close()
  if not (result.rewards == 1).all() or result.num_failed or result.num_timeout:
    raise RuntimeError(f"wrong rewards: {result}")
  return dict(programs=num, workers=workers, batch=batch, wall_s=round(wall, 2), programs_per_s=round(num / wall, 2),
              mean_program_ms=round(1e3 * wall * workers / num, 1))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workers", default="1,2,4,8")
  parser.add_argument("--runs", type=int, default=0, help="runs per row (default: by program)")
  parser.add_argument("--programs", default="trivial,cpu_1s,sleep_1s,harness_10")
  parser.add_argument("--reward", type=int, default=0, help="programs graded by CodeReward (0: the runs above)")
  parser.add_argument("--batch", type=int, default=None, help="CodeReward's batch_size (with --reward)")
  args = parser.parse_args()
  print(f"isolation: {sandbox.detect_isolation()}, cpus: {os.cpu_count()}, load: {os.getloadavg()[0]:.1f}")
  if args.reward:
    for workers in map(int, args.workers.split(",")):
      print(json.dumps(bench_reward(args.reward, workers, args.batch)), flush=True)
    return
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
