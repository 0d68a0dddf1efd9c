"""Tests for oapl_jax.tasks.code_reward: code extraction, the datasets' test formats, comparison,
and the reward on correct, wrong, crashing, slow and malicious programs in both formats."""
import base64
import concurrent.futures
import decimal
import json
import os
import pickle
import random
import time
import tracemalloc
import uuid
import weakref
import zlib

import numpy as np
import pytest

from oapl_jax.tasks import code_reward, output_match, sandbox


def fenced(code: str, tag: str = "python") -> str:
  return f"Some reasoning.\n```{tag}\n{code.strip()}\n```\nDone."


# A stdin/stdout problem (DeepCoder lcbv5 / LiveCodeBench form): print the sum of each line's ints.
STDIO = {"tests": json.dumps([
    {"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
    {"input": "10 -4 5\n", "output": "11", "testtype": "stdin"},
    {"input": "7\n", "output": "7\n", "testtype": "stdin"}])}
# A function-call problem (LiveCodeBench functional form): drop every x from nums.
CALL = {"tests": json.dumps([
    {"input": "[1, 2, 3, 2]\n2", "output": "[1, 3]", "testtype": "functional"},
    {"input": "[]\n5", "output": "[]", "testtype": "functional"}]),
    "metadata": json.dumps({"func_name": "drop"})}

PROGRAMS = {  # name -> (record, response, reward)
    "stdio_correct": (STDIO, fenced("import sys\nfor line in sys.stdin:\n  print(sum(map(int, line.split())))"), 1.0),
    "stdio_correct_exit": (STDIO, fenced("print(sum(map(int, input().split())))\nexit()"), 1.0),
    "stdio_wrong": (STDIO, fenced("print(sum(map(int, input().split())) + 1)"), 0.0),
    "stdio_crash": (STDIO, fenced("raise RuntimeError('boom')"), 0.0),
    "stdio_syntax_error": (STDIO, fenced("print(("), 0.0),
    "stdio_last_block_counts": (STDIO, fenced("print(sum(map(int, input().split())))")
                                + fenced("print('draft')"), 0.0),
    "stdio_no_code": (STDIO, "The answer is to add the numbers.", 0.0),
    "call_solution_class": (CALL, fenced(
        "class Solution:\n  def drop(self, nums: List[int], x: int) -> List[int]:\n"
        "    return [n for n in nums if n != x]"), 1.0),
    "call_plain_function_tuple": (CALL, fenced("def drop(nums, x):\n  return tuple(n for n in nums if n != x)"), 1.0),
    "call_wrong": (CALL, fenced("def drop(nums, x):\n  return nums"), 0.0),
    "call_crash": (CALL, fenced("def drop(nums, x):\n  return nums[10]"), 0.0),
    "call_missing_function": (CALL, fenced("def other(nums, x):\n  return []"), 0.0),
    "call_not_json": (CALL, fenced("def drop(nums, x):\n  return {1, 2}"), 0.0),
    "stdio_print_then_os_exit": (STDIO, fenced(  # unbuffered, as from a terminal: the output is kept
        "import os\nprint(sum(map(int, input().split())))\nos._exit(0)"), 1.0),
    "stdio_print_then_kill_own_group": (STDIO, fenced(  # a crash after the right output fails the test
        "import os, signal\nprint(sum(map(int, input().split())))\nos.killpg(0, signal.SIGKILL)"), 0.0),
    "call_deeply_nested": (CALL, fenced(  # valid JSON within the output cap, too deep for json.loads here
        "import sys\nsys.setrecursionlimit(10**5)\ndef drop(nums, x):\n  r = []\n  for _ in range(2000):\n"
        "    r = [r]\n  return r"), 0.0),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_score_hand_written_programs(name):
  record, response, reward = PROGRAMS[name]
  assert code_reward.score(record, response, timeout_s=4.0) == reward


def test_extract_code_takes_the_last_block():
  text = "```python\nfirst\n```\nmid\n```\nsecond\n```\n```cpp\nthird\n```"
  assert code_reward.extract_code(text) == "third\n"
  assert code_reward.extract_code("```py\nx = 1\n```") == "x = 1\n"
  assert code_reward.extract_code("no code") is None
  assert code_reward.extract_code("```python\nunterminated") is None


def test_stdout_matching_rule():
  assert output_match.stdout_matches("3 \n4\n\n", "3\n4")
  assert output_match.stdout_matches("1.50 2\n", "1.5 2.0")  # equal as Decimals
  assert not output_match.stdout_matches("3\n4\n5", "3\n4")
  assert not output_match.stdout_matches("3 4", "3\n4")
  assert not output_match.stdout_matches("1.5000001", "1.5")
  assert not output_match.stdout_matches("yes", "YES")
  assert not output_match.stdout_matches("sNaN", "NaN") and not output_match.stdout_matches("nan", "nan 1")


def test_parses_each_dataset_format():
  # DeepCoder taco / APPS: a dict of lists; call outputs wrapped in a one-element list.
  taco = code_reward.parse_tests({"tests": json.dumps(
      {"inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]], "fn_name": "add"})})
  assert (taco.fn_name, taco.inputs, taco.outputs, taco.unwrap_single) == ("add", ([1, 2], [3, 4]), ([3], [7]), True)
  taco_stdio = code_reward.parse_tests({"tests": {"inputs": ["1\n"], "outputs": ["2\n"]}})
  assert (taco_stdio.fn_name, taco_stdio.inputs) == (None, ("1\n",))
  # DeepCoder primeintellect: "type" and "fn_name" per case.
  prime = code_reward.parse_tests({"tests": json.dumps([
      {"input": "[3]", "output": "9", "type": "function_call", "fn_name": "square"}])})
  assert (prime.fn_name, prime.inputs, prime.outputs) == ("square", ([[3]],), (9,))
  prime_stdio = code_reward.parse_tests({"tests": [{"input": "a", "output": "b", "type": "stdin_stdout"}],
                                         "fn_name": "ignored"})
  assert prime_stdio.fn_name is None
  # LiveCodeBench originals: public JSON, private base64(zlib(pickle(JSON))), metadata func_name.
  private = [{"input": "[5]\n1", "output": "[5]", "testtype": "functional"}]
  packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(private)))).decode()
  lcb = code_reward.parse_tests({"public_test_cases": json.dumps(CALL_CASES), "private_test_cases": packed,
                                 "metadata": '{"func_name": "drop"}'})
  assert lcb.fn_name == "drop" and lcb.inputs == ([[1, 2], 2], [[5], 1]) and lcb.outputs == ([1], [5])
  # max_tests keeps the longest inputs, in their order.
  longest = code_reward.parse_tests({"tests": {"inputs": ["1", "333", "22", "4444"], "outputs": list("abcd")}},
                                    max_tests=2)
  assert longest.inputs == ("333", "4444") and longest.outputs == ("b", "d")


CALL_CASES = [{"input": "[1, 2]\n2", "output": "[1]", "testtype": "functional"}]


def test_rejects_bad_records_and_pickled_code():
  with pytest.raises(ValueError, match="no 'tests'"):
    code_reward.parse_tests({"question": "q"})
  with pytest.raises(ValueError):
    code_reward.parse_tests({"tests": {"inputs": ["1"], "outputs": []}})
  evil = base64.b64encode(zlib.compress(pickle.dumps(os.system))).decode()  # a global: code
  with pytest.raises(pickle.UnpicklingError):
    code_reward.parse_tests({"public_test_cases": evil})


def test_slow_program_times_out_without_running_every_test():
  slow = fenced("import time\ntime.sleep(30)")
  start = time.monotonic()
  assert code_reward.score(STDIO, slow, timeout_s=1.0) == 0.0
  assert time.monotonic() - start < 1.0 + 3.0  # one test's limit (it stops there), not three


def test_cannot_see_expected_outputs():
  secret = f"SECRET-{uuid.uuid4().hex}"
  record = {"tests": [{"input": "", "output": secret, "testtype": "stdin"}]}
  snoop = fenced("""
import gc, os, sys
found = set()
for obj in gc.get_objects():
  for s in (obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()):
    if isinstance(s, str) and s.startswith("SECRET-") and len(s) > 7:
      found.add(s)
for root, _, files in os.walk(os.getcwd()):
  for name in files:
    data = open(os.path.join(root, name), errors="replace").read()
    found.update(w for w in data.split() if w.startswith("SECRET-") and len(w) > 7)
print(*found)
""")
  assert code_reward.score(record, snoop) == 0.0
  control = {"tests": [{"input": secret, "output": secret, "testtype": "stdin"}]}
  assert code_reward.score(control, snoop) == 1.0  # it does find what enters the sandbox


YES = {"tests": [{"input": "1\n", "output": "YES", "testtype": "stdin"}]}
NO = {"tests": [{"input": "1\n", "output": "NO", "testtype": "stdin"}]}


def test_sandbox_job_does_not_depend_on_expected_outputs():
  """Nothing derived from the expected outputs (not even their sizes) enters the sandbox: records
  that differ only there give the very same job (code, inputs, limits)."""
  response = fenced("print(input())")
  big = {"tests": [{"input": "1\n", "output": "Y" * (20 << 20), "testtype": "stdin"}]}
  jobs = [code_reward._job(record, response, code_reward.Settings())[1] for record in (YES, NO, big)]
  assert jobs[0] == jobs[1] == jobs[2]
  calls = [{"tests": json.dumps([{"input": "[1, 2]\n2", "output": out, "testtype": "functional"}]),
            "metadata": json.dumps({"func_name": "drop"})} for out in ("[1]", "[1, 1, 1, 1, 1, 1]")]
  assert code_reward._job(calls[0], response, code_reward.Settings())[1] == code_reward._job(
      calls[1], response, code_reward.Settings())[1]


def test_cannot_learn_expected_output_sizes():
  """A program that looks through the harness's frames, globals and gc for anything sized by the
  answers (the per-test output caps once were: 2 * len(expected) + 4096) and answers a YES/NO
  problem by it: never having seen the answer, it cannot pass both a YES and a NO record."""
  snoop = fenced("""
import gc, sys
sizes = []
frame = sys._getframe()
while frame is not None:
  for scope in (frame.f_locals, frame.f_globals):
    sizes += [v for k, v in scope.items() if "cap" in k and isinstance(v, int)]
  frame = frame.f_back
for obj in gc.get_objects():
  if isinstance(obj, dict):
    for key, value in list(obj.items()):
      if isinstance(key, str) and "cap" in key:
        sizes += value if isinstance(value, list) else [value]
sizes = [(s - 4096) // 2 for s in sizes if isinstance(s, int)]
print("NO" if 2 in sizes and 3 not in sizes else "YES")
""")
  rewards = (code_reward.score(YES, snoop), code_reward.score(NO, snoop))
  assert rewards != (1.0, 1.0), rewards
  assert rewards == (1.0, 0.0)  # it answers blind: always YES


def test_output_over_the_fixed_cap_fails():
  """Each test's output is capped by a fixed output_bytes, whatever the expected output's size."""
  record = {"tests": [{"input": "", "output": "x" * 10, "testtype": "stdin"},
                      {"input": "", "output": "x" * 100, "testtype": "stdin"}]}
  echo = fenced("print('x' * (10 if not __import__('os').path.exists('seen') else 100))\nopen('seen', 'w')")
  assert code_reward.score(record, echo, partial_credit=True) == 1.0
  assert code_reward.score(record, echo, partial_credit=True, output_bytes=64) == 0.5
  with pytest.raises(ValueError):
    code_reward.Settings(output_bytes=0)


def test_killing_its_own_group_is_a_failure_not_a_timeout():
  reward = code_reward.CodeReward(num_workers=1, timeout_s=1.0)
  try:
    responses = [fenced("import os, signal\nos.killpg(0, signal.SIGKILL)"),
                 fenced("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"),
                 fenced("while True:\n  pass")]
    result = reward([STDIO] * 3, responses)
    np.testing.assert_array_equal(result.rewards, [0, 0, 0])
    assert (result.num_failed, result.num_timeout) == (0, 1)  # only the loop ran out of time
  finally:
    reward.close()


def test_children_left_behind_do_not_fail_later_tests():
  """Each test forks a child it never waits for: once the test ends, the sandbox's init reaps it
  (left a zombie, it would count against the process limit and fail the tests after the 6th)."""
  record = {"tests": [{"input": f"{i}\n", "output": f"{i}", "testtype": "stdin"} for i in range(10)]}
  careless = fenced("import os\nif os.fork() == 0:\n  os._exit(0)\nprint(input())")
  assert code_reward.score(record, careless, partial_credit=True) == 1.0


def test_forged_records_and_killing_the_harness_score_zero():
  forge = fenced("import os\nprint('0 ok 0.1 2\\n3')\nfor fd in range(3, 20):\n  try:\n"
                 "    os.write(fd, b'0 ok 0.1 2\\n3\\n1 ok 0.1 3\\n11\\n2 ok 0.1 2\\n7\\n')\n  except OSError:\n    pass")
  kill = fenced("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\n"
                "print(sum(map(int, input().split())))")
  assert code_reward.score(STDIO, forge) == 0.0
  assert code_reward.score(STDIO, kill) == 0.0


def test_a_test_leaves_nothing_behind_for_the_next():
  record = {"tests": [{"input": "", "output": "ok"}] * 2}
  sneaky = fenced("""
import os, time
if not os.path.exists("flag"):
  open("flag", "w").close()
  if os.fork() == 0:
    time.sleep(0.5)
    with open("stdout", "a") as f:
      f.write("ok\\n")
    os._exit(0)
  print("ok")
else:
  time.sleep(1.5)
""")
  assert code_reward.score(record, sneaky, timeout_s=3.0, partial_credit=True) == 0.5


def test_batch_reward_counts_timeouts_and_failures():
  reward = code_reward.CodeReward(num_workers=2, timeout_s=1.0, partial_credit=False)
  try:
    records = [STDIO, STDIO, CALL, CALL, {"question": "no tests"}, json.dumps(STDIO)]
    responses = [PROGRAMS["stdio_correct"][1], fenced("while True:\n  pass"), PROGRAMS["call_solution_class"][1],
                 PROGRAMS["call_wrong"][1], "```\nprint(1)\n```", "no code"]
    result = reward(records, responses)
    assert result.rewards.dtype == np.float32
    np.testing.assert_array_equal(result.rewards, [1, 0, 1, 0, 0, 0])
    assert (result.num_failed, result.num_timeout) == (1, 1)
    assert reward.stats().runs == 4 and reward.stats().runs_per_s > 0
    with pytest.raises(ValueError):
      reward(records, responses[:2])
  finally:
    reward.close()


def test_large_tests_fit_the_sandbox():
  big = "7" * (20 << 20)  # larger than the sandbox's default file and output limits
  record = {"tests": [{"input": big + "\n", "output": big, "testtype": "stdin"}]}
  assert code_reward.score(record, fenced("print(input())")) == 1.0
  assert code_reward.score(record, fenced("print(input()[1:])")) == 0.0


def test_partial_credit_counts_passed_tests():
  half = fenced("n = sum(map(int, input().split()))\nprint(n if n < 10 else -1)")  # passes 1 and 3
  assert code_reward.score(STDIO, half, partial_credit=True) == pytest.approx(2 / 3)
  assert code_reward.score(STDIO, half) == 0.0


def test_taco_call_outputs_may_be_wrapped():
  record = {"tests": json.dumps({"inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]], "fn_name": "add"})}
  assert code_reward.score(record, fenced("def add(a, b):\n  return a + b")) == 1.0
  assert code_reward.score(record, fenced("def add(a, b):\n  return [a + b]")) == 1.0
  assert code_reward.score(record, fenced("def add(a, b):\n  return a - b")) == 0.0


def test_uses_the_configured_sandbox():
  with pytest.raises(sandbox.SandboxError):
    code_reward.score(STDIO, PROGRAMS["stdio_correct"][1],
                      config=sandbox.SandboxConfig(use_namespaces=False, require_isolation=True))


def _livecodebench_rule(got: str, expected: str) -> bool:
  """The unbounded rule the grader had before issue 41.2: the reference its bounded one must agree with."""
  def decimals(line):
    try:
      numbers = [decimal.Decimal(t) for t in line.split()]
    except decimal.InvalidOperation:
      return None
    return numbers if all(n.is_finite() for n in numbers) else None
  got_lines = [line.strip() for line in got.strip().split("\n")]
  want_lines = [line.strip() for line in expected.strip().split("\n")]
  return len(got_lines) == len(want_lines) and all(
      g == w or (decimals(g) is not None and decimals(g) == decimals(w)) for g, w in zip(got_lines, want_lines))


def test_bounded_stdout_matching_agrees_with_the_unbounded_rule_on_plausible_outputs():
  rng = random.Random(0)
  tokens = ["0", "1", "-7", "3.5", "1e3", "yes", "NO", "abc", "2.50", "-0", "nan", "1000"]
  spellings = {"3.5": ["3.50", "3.500000000000000000", "+3.5"], "1e3": ["1000", "1000.0"], "1000": ["1e3", "1.0E3"],
               "-0": ["0", "0.000"], "0": ["-0", "0.0"], "1": ["1.00000000000000000000", "01"], "2.50": ["2.5"]}
  verdicts = set()
  for _ in range(2000):
    want = [[rng.choice(tokens) for _ in range(rng.randint(0, 4))] for _ in range(rng.randint(1, 4))]
    got = [[rng.choice(spellings.get(t, [t])) if rng.random() < 0.5 else t for t in line] for line in want]
    if rng.random() < 0.3:  # a wrong token, a missing or an extra line
      line = rng.choice(got)
      line.append("9") if rng.random() < 0.5 or not line else line.pop()
    elif rng.random() < 0.2:
      got = got[:-1] if rng.random() < 0.5 else got + [["1"]]
    sep = rng.choice([" ", "  ", " \t"])
    got_text = rng.choice(["", "\n", "  "]) + "\n".join(sep.join(l) + rng.choice(["", " "]) for l in got) + \
        rng.choice(["", "\n", "\n\n"])
    want_text = "\n".join(" ".join(l) for l in want) + "\n"
    verdict = _livecodebench_rule(got_text, want_text)
    assert output_match.stdout_matches(got_text, want_text) == verdict, (got_text, want_text)
    assert output_match.stdout_matches(got_text.encode(), want_text) == verdict
    verdicts.add(verdict)
  assert verdicts == {True, False}


HUNDRED_ZEROS = "\n".join(["0"] * 100)


@pytest.mark.parametrize("expected, flood", [("0", b"1 " * (1 << 19)),  # one line of numbers, as the issue's
                                             (HUNDRED_ZEROS, b"0\n" * (1 << 19)),  # many lines
                                             (HUNDRED_ZEROS, b"1 " * 2000 + b"\n0" * 99)])  # one line too long
def test_a_flood_costs_the_grader_a_multiple_of_the_expected_output_not_of_the_flood(expected, flood, monkeypatch):
  """Issue 41.2: one 32 MiB line of numbers cost 12.8 s and 2.1 GB in the grader; now it is failed after
  reading at most a small multiple of the expected output (bytes parsed as numbers, and memory; the floods
  here are 1 MiB or 4 KiB)."""
  suite = code_reward.TestSuite(None, ("",), (expected,))
  result = sandbox.RunResult("ok", 0, None, b"0 ok 0.1 %d\n" % len(flood) + flood, b"", 0.1, 0.1)
  parsed = []
  decimals = output_match._decimals  # pylint: disable=protected-access
  monkeypatch.setattr(output_match, "_decimals", lambda line: parsed.append(len(line)) or decimals(line))
  tracemalloc.start()
  try:
    assert code_reward.grade(suite, result, partial_credit=False) == (0.0, False)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert sum(parsed) <= 100 * len(expected)
  assert peak < 64 << 10


def test_each_program_output_is_dropped_once_graded(monkeypatch):
  """The batch reward grades each run as it ends and keeps no output past it (they were all kept until the
  batch ended: a batch of floods held them all)."""
  reward = code_reward.CodeReward(num_workers=1)
  reward.pool.close()
  refs = []

  class DonePool:  # runs "finished" at once, each with an output the reward alone holds
    def submit(self, source, stdin, limits, keep_stdout=None):
      future = concurrent.futures.Future()
      result = sandbox.RunResult("ok", 0, None, b"0 ok 0.1 2\n3\n", b"", 0.1, 0.1)
      refs.append(weakref.ref(result))
      future.set_result(result)
      return future

  reward.pool = DonePool()
  seen = []
  grade = code_reward.grade
  monkeypatch.setattr(code_reward, "grade", lambda suite, result, partial: seen.append(sum(r() is not None for r in refs))
                      or grade(suite, result, partial))
  records = [{"tests": [{"input": "1 2", "output": "3", "testtype": "stdin"}]}] * 4
  result = reward(records, [fenced("print(3)")] * 4)
  assert result.rewards.tolist() == [1.0] * 4
  assert seen == [4, 3, 2, 1]


# Issue 54.5: the sandbox hands back no more of a test's output than the grader reads.
def _records(*tests: tuple[str, bytes]) -> bytes:
  return b"".join(b"%d %s 0.1000 %d\n" % (i, status.encode(), len(payload)) + payload
                  for i, (status, payload) in enumerate(tests))


def test_grader_head_keeps_what_the_grader_reads_in_any_chunking():
  stream = _records(("ok", b"3\n"), ("ok", b"9" * 5000), ("error", b"Traceback" * 100), ("ok", b""))
  want = _records(("ok", b"3\n"), ("ok", b"9" * 100), ("error", b""), ("ok", b""))
  rng = random.Random(0)
  for _ in range(20):
    head, kept, pos = code_reward.GraderHead([100] * 4), b"", 0
    while pos < len(stream):
      step = rng.choice([1, 2, 7, 64, 65, 4096])
      kept += head(stream[pos:pos + step])
      pos += step
    assert kept == want
    assert (head.cut.tests, head.cut.bytes) == (2, 4900 + 900)
  head = code_reward.GraderHead([100])  # a record the harness did not write: nothing past it is kept
  assert head(_records(("ok", b"3")) + b"forged " * 20) == _records(("ok", b"3"))
  assert head.cut.bytes == 140


def test_the_sandbox_hands_back_a_flood_cut_to_the_graders_budget():
  record = {"tests": [{"input": "", "output": "3", "testtype": "stdin"},
                      {"input": "", "output": "3", "testtype": "stdin"}]}
  suite = code_reward.parse_tests(record)
  [cap, _] = code_reward.output_caps(suite)
  assert cap == output_match.stdout_budget("3") + 64
  flood = fenced("import sys\nsys.stdout.write('3' * (4 << 20))")  # 4 MiB a test, each run exits 0
  settings = code_reward.Settings(partial_credit=True)
  _, job = code_reward._job(record, flood, settings)  # pylint: disable=protected-access
  head = code_reward.GraderHead(code_reward.output_caps(suite))
  result = sandbox.run(job.source, job.stdin, job.limits, keep_stdout=head)
  assert result.ok and len(result.stdout) < 2 * (cap + 64)  # was 8 MiB
  assert (head.cut.tests, head.cut.bytes) == (2, 2 * ((4 << 20) - cap))
  assert code_reward.grade(suite, result, partial_credit=True) == (0.0, False)  # over budget: fails, as uncut
  reward = code_reward.CodeReward(num_workers=2, partial_credit=True)
  try:
    result = reward([record] * 2, [flood, fenced("print(3)")])
  finally:
    reward.close()
  assert result.rewards.tolist() == [0, 1] and (reward.cut.tests, reward.cut.bytes) == (2, 2 * ((4 << 20) - cap))
