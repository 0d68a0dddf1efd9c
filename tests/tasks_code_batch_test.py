"""Tests for code_reward's batches (code_batch.py): several programs in one sandbox run score as each alone would,
whatever one of them does to the others: files or processes left for the next, killing the harness, sleeping, flooding."""
import random

import numpy as np
import pytest

from oapl_jax.tasks import code_batch, code_harness, code_reward
from tests.sandbox_fixtures import isolation, needs_namespaces  # noqa: F401  (a fixture)
from tests.tasks_code_reward_test import PROGRAMS, fenced

SUM = {"tests": [{"input": f"{a} {b}\n", "output": f"{a + b}\n", "testtype": "stdin"} for a, b in ((1, 2), (5, 9), (7, 0))]}
CORRECT = fenced("a, b = map(int, input().split())\nprint(a + b)")
# Wrong, unless something left behind by another program passes it the right code.
COLLUDER = fenced("import os\nif os.path.exists('tmp/helper.py'):\n  exec(open('tmp/helper.py').read())\n"
                  "else:\n  a, b = map(int, input().split())\n  print(a + b + 1)")
HELPER = "a, b = map(int, input().split()); print(a + b)"
LEAVES_FILE = fenced(f"open('tmp/helper.py', 'w').write({HELPER!r})\nprint(0)")
# The file is whole whenever it exists (written aside, then renamed): a reader never sees it half-written, so the
# control below cannot fail on a torn read.
LEAVES_DAEMON = fenced(f"""
import os, time
def leave():
  os.makedirs('tmp', exist_ok=True)
  open('tmp/.helper', 'w').write({HELPER!r})
  os.replace('tmp/.helper', 'tmp/helper.py')
leave()
if os.fork() == 0:  # its own process group, and it writes the file again every millisecond for 5 s
  os.setpgid(0, 0)
  end = time.monotonic() + 5
  while time.monotonic() < end:
    try:
      leave()
    except OSError:
      pass
    time.sleep(0.001)
  os._exit(0)
print(0)
""")


def batch_rewards(records, responses, **kw):
  reward = code_reward.CodeReward(num_workers=1, timeout_s=1.0, batch_size=len(records), **kw)
  try:
    return reward(records, responses), reward.stats().runs
  finally:
    reward.close()


def test_batched_programs_score_as_alone(isolation):  # noqa: F811
  needs_namespaces(isolation)
  names = sorted(PROGRAMS)
  result, runs = batch_rewards([PROGRAMS[n][0] for n in names], [PROGRAMS[n][1] for n in names])
  assert result.rewards.tolist() == [PROGRAMS[n][2] for n in names]
  assert (result.num_failed, result.num_timeout) == (0, 0)
  assert runs == 1  # one run: killing its own process group kills only its own test


@pytest.mark.parametrize("hostile", [LEAVES_FILE, LEAVES_DAEMON])
def test_a_program_leaves_neither_files_nor_processes_for_the_next(isolation, hostile, monkeypatch):  # noqa: F811
  needs_namespaces(isolation)
  result, runs = batch_rewards([SUM] * 3, [hostile, CORRECT, COLLUDER])
  assert result.rewards.tolist() == [0, 1, 0] and runs == 1
  # Control: a harness that goes on without killing or emptying anything, and the colluder passes.
  monkeypatch.setattr(code_harness, "HARNESS_SOURCE", code_harness.HARNESS_SOURCE.replace(
      "if k + 1 < len(programs) and _harness_clean(source):", "if k + 1 < len(programs):"))
  assert batch_rewards([SUM] * 3, [hostile, CORRECT, COLLUDER])[0].rewards.tolist() == [0, 1, 1]


def test_killing_the_harness_makes_the_rest_run_again(isolation):  # noqa: F811
  needs_namespaces(isolation)
  kill_all = fenced("import os, signal\nos.kill(-1, signal.SIGKILL)\nprint(0)")
  kill_parent = fenced("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint(0)")
  result, runs = batch_rewards([SUM] * 6, [CORRECT, kill_all, CORRECT, COLLUDER, kill_parent, CORRECT])
  assert result.rewards.tolist() == [1, 0, 1, 0, 0, 1]
  assert (result.num_failed, result.num_timeout) == (0, 0)
  assert runs == 5  # the batch; kill_all alone; the 4 after it, again; kill_parent alone; the last one


def test_timeouts_and_floods_cost_only_their_own_reward(isolation):  # noqa: F811
  needs_namespaces(isolation)
  sleeper = fenced("import time\ntime.sleep(100)")
  flood = fenced("print('9' * 60000)")  # 3 tests of 60 kB: over the program's 128 kB budget
  responses = [sleeper, CORRECT, COLLUDER, flood, CORRECT, COLLUDER]
  result, runs = batch_rewards([SUM] * 6, responses, partial_credit=True, output_bytes=1 << 16,
                               total_output_bytes=1 << 17)
  np.testing.assert_allclose(result.rewards, [0, 1, 0, 0, 1, 0])
  assert (result.num_timeout, runs) == (1, 1)


def test_a_program_cannot_find_the_others_code(isolation):  # noqa: F811
  needs_namespaces(isolation)
  snoop = fenced("""
import gc, os
needle = ''.join(reversed('REKRAM'))  # built at run time: not a constant of this code
found = [s for o in gc.get_objects() for s in (o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple))
         else ()) if isinstance(s, (str, bytes)) and s is not needle and needle in str(s)]
found += [n for n in os.listdir('.') if n not in ('main.py', 'tmp', 'input', 'stdout', 'stderr', 'return')]
print('found' if found else 'clean')
""")
  marked = fenced("x = 'MARKER'\nprint('clean')")
  record = {"tests": [{"input": "", "output": "clean", "testtype": "stdin"}]}
  result, _ = batch_rewards([record] * 3, [marked, snoop, marked])
  assert result.rewards.tolist() == [1, 1, 1]
  control = {"tests": [{"input": "MARKER", "output": "clean", "testtype": "stdin"}]}  # its own input: found
  assert batch_rewards([record, control], [marked, snoop])[0].rewards.tolist() == [1, 0]


def _stream(*programs):
  return code_batch.SEPARATOR.join(b"".join(b"%d %s 0.1000 %d\n" % (i, s.encode(), len(p)) + p
                                            for i, (s, p) in enumerate(tests)) for tests in programs)


def test_batch_head_splits_the_programs_records_in_any_chunking():
  programs = [[("ok", b"3\n"), ("ok", b"next\n" * 50)], [("error", b"x" * 300)], [("ok", b"7")]]
  stream = _stream(*programs)
  for _ in range(20):
    heads = [code_reward.GraderHead([100, 100], separated=k < 2) for k in range(3)]
    head, pos, rng = code_batch.BatchHead(heads), 0, random.Random(0)
    while pos < len(stream):
      step = rng.choice([1, 3, 5, 64, 4096])
      assert head(stream[pos:pos + step]) == b""
      pos += step
    assert [bytes(k) for k in head.kept] == [_stream([("ok", b"3\n"), ("ok", b"next\n" * 20)]),
                                            _stream([("error", b"")]), _stream([("ok", b"7")])]
    assert head.finished == 2 and [h.cut.bytes for h in heads] == [150, 300, 0]
  ok = code_reward.sandbox.RunResult("ok", 0, None, b"", b"", 0.1, 0.1)
  assert head.done(ok) == 3 and head.done(code_reward.sandbox.RunResult("killed", None, 9, b"", b"", 0.1, 0.1)) == 2
  broken = code_batch.BatchHead([code_reward.GraderHead([100], separated=True), code_reward.GraderHead([100])])
  broken(_stream([("ok", b"3")]) + b"forged\n" + _stream([("ok", b"3")]))  # not a separator: the rest is unread
  assert broken.finished == 0 and broken.done(ok) == 0 and broken.kept[1] == b""
