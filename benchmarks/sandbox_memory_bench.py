"""The grader's memory under hostile programs: peak RSS of this process (the trainer's side of the sandbox pool)
while N responses, each printing hundreds of MiB per test, are graded at once through CodeReward.

    python -m benchmarks.sandbox_memory_bench                      # 64 responses through 64 workers
    python -m benchmarks.sandbox_memory_bench --responses 8 --workers 8 --tests 8 --partial_credit
    python -m benchmarks.sandbox_memory_bench --print_mib 16 --uncapped   # tests that pass the harness's cap

Each test expects "3"; each response writes --print_mib MiB to stdout, 1 MiB a call (the sandbox's file limit
stops it first; the harness sends back up to output_bytes, 32 MiB, of it per test; --uncapped: the grader gets
all of it, as before issue 54). Reported: this process's RSS before
the batch and its peak (ru_maxrss), the wall time, the rewards and the outputs the grader cut. A benchmark,
not a test: the sandboxes themselves (their tmpfs and harness) are not in this process's RSS.
"""
import argparse
import json
import os
import resource
import time

from oapl_jax.tasks import code_reward, sandbox


def rss_mib() -> float:
  with open("/proc/self/status", encoding="ascii") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--responses", type=int, default=64)
  parser.add_argument("--workers", type=int, default=64)
  parser.add_argument("--tests", type=int, default=1, help="tests per record")
  parser.add_argument("--print_mib", type=int, default=300, help="what each response prints per test")
  parser.add_argument("--timeout_s", type=float, default=60.0, help="per test: long, so that on few cores the "
                      "floods finish instead of timing out")
  parser.add_argument("--uncapped", action="store_true", help="hand the grader whole outputs, as before issue 54")
  parser.add_argument("--partial_credit", action="store_true", help="run every test (else: stop at the first failure)")
  args = parser.parse_args()
  if args.uncapped:
    code_reward.GraderHead.__call__ = lambda self, chunk: chunk  # keeps everything, cuts nothing
  record = {"tests": [{"input": f"{i}\n", "output": "3\n", "testtype": "stdin"} for i in range(args.tests)]}
  hostile = (f"```python\nimport sys\nline = b'1 ' * (1 << 19)\nfor _ in range({args.print_mib}):\n"
             "  sys.stdout.buffer.write(line)\n```")
  reward = code_reward.CodeReward(num_workers=args.workers, timeout_s=args.timeout_s,
                                  partial_credit=args.partial_credit)
  try:
    reward([record], ["```python\nprint(3)\n```"])  # warm-up: threads, page cache
    before = rss_mib()
    start = time.perf_counter()
    result = reward([record] * args.responses, [hostile] * args.responses)
    wall = time.perf_counter() - start
  finally:
    reward.close()
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  cut = getattr(reward, "cut", None)
  print(json.dumps(dict(isolation=sandbox.detect_isolation(), cpus=len(os.sched_getaffinity(0)), **vars(args),
                        rss_before_mib=round(before), peak_rss_mib=round(peak), wall_s=round(wall, 1),
                        reward_sum=float(result.rewards.sum()), failed=result.num_failed, timeouts=result.num_timeout,
                        cut=None if cut is None else vars(cut))))


if __name__ == "__main__":
  main()
