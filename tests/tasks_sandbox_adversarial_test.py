"""The sandbox's adversarial set: programs that try to escape, snoop or exhaust, each of which must stay contained
(and, as a code reward's response, earn nothing). `python -m tests.tasks_sandbox_adversarial_test` prints the
report in reports/sandbox_adversarial.md.

Every program first names its process (and so every process it forks) with a fresh marker; after the run no
process with that marker may be left on the host.
"""
import os
import subprocess
import time
import uuid

import pytest

from oapl_jax.tasks import code_reward, sandbox
from tests.sandbox_fixtures import CAN_FALLBACK, FALLBACK, marked, run_contained, survivors

ADVERSARIAL = {
    "fork_bomb": ("import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n",
                  sandbox.Limits(wall_s=2.0), {"timeout"}),
    "infinite_loop": ("while True:\n  pass\n", sandbox.Limits(wall_s=1.0), {"timeout"}),
    "cpu_limit": ("while True:\n  pass\n", sandbox.Limits(wall_s=8.0, cpu_s=1.0), {"timeout"}),
    "sleep_past_limit": ("import time\ntime.sleep(60)\n", sandbox.Limits(wall_s=1.0), {"timeout"}),
    "large_allocation": ("x = bytearray(8 << 30)\n", sandbox.Limits(wall_s=5.0), {"memory"}),
    "growing_allocation": ("chunks = []\nwhile True:\n  chunks.append(bytearray(64 << 20))\n",
                           sandbox.Limits(wall_s=5.0, memory_bytes=512 << 20), {"memory"}),
    "huge_stdout": ("import sys\nwhile True:\n  sys.stdout.write('x' * 65536)\n",
                    sandbox.Limits(wall_s=5.0, stdout_bytes=1 << 20), {"output_limit"}),
    "huge_stderr": ("import sys\nfor i in range(800):\n  sys.stderr.write(str(i % 10) * 65536)\n",
                    sandbox.Limits(wall_s=5.0, stderr_bytes=1 << 16), {"ok"}),
    "huge_file": ("open('big', 'wb').write(b'x' * (64 << 20))\n",  # Python ignores SIGXFSZ: EFBIG
                  sandbox.Limits(wall_s=5.0, max_file_bytes=1 << 20), {"error"}),
    "grandchild_outlives_parent": (
        "import os, time\nif os.fork() == 0:\n  try:\n    os.setsid()\n  except OSError:\n    pass\n"
        "  if os.fork() == 0:\n    time.sleep(60)\n  os._exit(0)\nprint('parent done')\n",
        sandbox.Limits(wall_s=5.0), {"ok"}),
}


# Programs after the harness's memory, other processes, ptrace, threads and descriptors. Each prints
# (to stdout) a secret it found, or "none", and what it tried (to stderr: "GOT ..." if it worked).
# Run directly they must be contained; as a code reward's response they must earn nothing.
FIND_SECRET = 'import re, sys\nsecret = re.compile(rb"SECRET-[0-9a-f]{32}")\nfound = set()\n'
SCAN_MEM = """
def scan_mem(pid):
  with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
    for line in maps:
      span, perms = line.split()[:2]
      start, end = (int(x, 16) for x in span.split("-"))
      if perms[0] == "r" and end - start <= 1 << 28:
        try:
          mem.seek(start)
          found.update(secret.findall(mem.read(end - start)))
        except (OSError, ValueError, OverflowError):
          pass
"""
ANSWER = 'print(min(found).decode() if found else "none")\n'
SNOOPS = {
    "memory_gc_frames_modules": FIND_SECRET + """
import gc
def look(value):
  if isinstance(value, str):
    value = value.encode("utf-8", "replace")
  if isinstance(value, (bytes, bytearray)):
    found.update(secret.findall(value))
scopes = [vars(m) for m in list(sys.modules.values()) if hasattr(m, "__dict__")]
frame = sys._getframe()
while frame is not None:
  scopes += [frame.f_locals, frame.f_globals]
  frame = frame.f_back
for obj in gc.get_objects():
  if isinstance(obj, dict):
    scopes.append(obj)
  elif isinstance(obj, (list, tuple, set, frozenset)):
    for item in list(obj):
      look(item)
for scope in scopes:
  for key, value in list(scope.items()):
    look(key)
    look(value)
sys.stderr.write(f"scanned {len(scopes)} scopes\\n")
""" + ANSWER,
    "memory_expected_sizes": """
import sys
caps = []  # what the harness once derived from the expected outputs: 2 * len + 4096 per test
frame = sys._getframe()
while frame is not None:
  caps += [v for k, v in frame.f_locals.items() if "cap" in k and isinstance(v, int)]
  frame = frame.f_back
sys.stderr.write(f"caps {caps}\\n")
print("NO" if caps and (caps[0] - 4096) // 2 == 2 else "YES")  # a YES/NO problem, answered blind
""",
    "memory_proc_self_mem": FIND_SECRET + SCAN_MEM + """
try:
  scan_mem("self")
  sys.stderr.write("GOT /proc/self/mem\\n")
except OSError as e:
  sys.stderr.write(f"refused /proc/self/mem {type(e).__name__}\\n")
""" + ANSWER,
    "proc_parent": FIND_SECRET + SCAN_MEM + """
import os
ppid = os.getppid()
for what in ("environ", "cmdline", "status", "maps", "fd", "mem"):
  path = f"/proc/{ppid}/{what}"
  try:
    if what == "fd":
      found.update(secret.findall(" ".join(os.listdir(path)).encode()))
    elif what == "mem":
      scan_mem(ppid)
    else:
      with open(path, "rb") as f:
        found.update(secret.findall(f.read()))
    sys.stderr.write(f"GOT {path}\\n")
  except OSError as e:
    sys.stderr.write(f"refused {path} {type(e).__name__}\\n")
""" + ANSWER,
    "proc_other_processes": FIND_SECRET + """
import os
others = []
try:
  others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
  sys.stderr.write(f"GOT /proc listing: {len(others)} other processes\\n")
except OSError as e:
  sys.stderr.write(f"refused /proc listing {type(e).__name__}\\n")
for pid in others:
  for what in ("environ", "cmdline"):
    try:
      with open(f"/proc/{pid}/{what}", "rb") as f:
        found.update(secret.findall(f.read()))
      sys.stderr.write(f"GOT /proc/{pid}/{what}\\n")
    except OSError:
      pass
""" + ANSWER,
    "ptrace": """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, ret):
  sys.stderr.write(f"refused {name} errno {ctypes.get_errno()}\\n" if ret == -1 else f"GOT {name}\\n")
class IOVec(ctypes.Structure):
  _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
child = os.fork()
if child == 0:
  time.sleep(30)
  os._exit(0)
attempt("ptrace_attach_parent", libc.ptrace(16, os.getppid(), 0, 0))  # PTRACE_ATTACH
attempt("ptrace_seize_parent", libc.ptrace(0x4206, os.getppid(), 0, 0))  # PTRACE_SEIZE
attempt("ptrace_attach_child", libc.ptrace(16, child, 0, 0))
buf = ctypes.create_string_buffer(64)
local, remote = IOVec(ctypes.cast(buf, ctypes.c_void_p), 64), IOVec(ctypes.cast(buf, ctypes.c_void_p), 64)
attempt("process_vm_readv_parent", libc.process_vm_readv(os.getppid(), ctypes.byref(local), 1,
                                                         ctypes.byref(remote), 1, 0))
attempt("ptrace_traceme", libc.ptrace(0, 0, 0, 0))  # PTRACE_TRACEME
os.kill(child, 9)
print("none")
""",
    "thread_bomb": """
import sys, threading, time
n = 0
try:
  while n < 100000:
    threading.Thread(target=time.sleep, args=(60,)).start()  # not daemons: exit waits for them
    n += 1
except RuntimeError as e:
  sys.stderr.write(f"threads stopped at {n}: {e}\\n")
print("none", flush=True)
""",
    "fd_exhaustion": """
import os, sys
fds = []
try:
  while len(fds) < 1000000:
    fds.extend(os.pipe())
except OSError as e:
  sys.stderr.write(f"descriptors stopped at {len(fds)}: errno {e.errno}\\n")
print("none")
""",
    "kill_own_group": "import os, signal\nprint('none')\nos.killpg(0, signal.SIGKILL)\n",
}
ADVERSARIAL.update({
    "memory_gc_frames_modules": (SNOOPS["memory_gc_frames_modules"], sandbox.Limits(wall_s=5.0), {"ok"}),
    "memory_expected_sizes": (SNOOPS["memory_expected_sizes"], sandbox.Limits(wall_s=5.0), {"ok"}),
    "memory_proc_self_mem": (SNOOPS["memory_proc_self_mem"], sandbox.Limits(wall_s=5.0), {"ok"}),
    "proc_parent": (SNOOPS["proc_parent"], sandbox.Limits(wall_s=5.0), {"ok"}),
    "proc_other_processes": (SNOOPS["proc_other_processes"], sandbox.Limits(wall_s=5.0), {"ok"}),
    "ptrace": (SNOOPS["ptrace"], sandbox.Limits(wall_s=5.0), {"ok"}),
    "thread_bomb": (SNOOPS["thread_bomb"], sandbox.Limits(wall_s=1.0), {"timeout"}),
    "fd_exhaustion": (SNOOPS["fd_exhaustion"], sandbox.Limits(wall_s=5.0), {"ok"}),
    "kill_own_group": (SNOOPS["kill_own_group"], sandbox.Limits(wall_s=5.0), {"killed"}),
})
MODES = {"default": sandbox.SandboxConfig(), "fallback": FALLBACK}


def reward_record(case: str) -> dict:
  """The record a case answers as a code reward: a fresh secret, or for the size snoop a YES and a NO test."""
  if case == "memory_expected_sizes":
    return {"tests": [{"input": "1\n", "output": "YES"}, {"input": "2\n", "output": "NO"}]}
  return {"tests": [{"input": "", "output": "SECRET-" + uuid.uuid4().hex}]}


def check_snoop(case: str, result: sandbox.RunResult) -> None:
  """What a case of SNOOPS must show beyond its reason."""
  err = result.stderr.decode(errors="replace")
  if case in ("proc_parent", "proc_other_processes", "ptrace"):
    assert "GOT" not in err and "refused" in err, err
  if case == "thread_bomb":
    assert "threads stopped at" in err and result.stdout == b"none\n", result
  if case == "fd_exhaustion":
    stopped = int(err.split("descriptors stopped at ")[1].split(":")[0])
    assert stopped <= 256 and result.stdout == b"none\n", result
  if case == "kill_own_group":
    assert result.signal == 9 and result.stdout == b"none\n", result  # printed before: unbuffered
  if case == "memory_expected_sizes":
    assert result.stdout == b"YES\n", result


@pytest.mark.parametrize("case, mode", [(c, "default") for c in sorted(ADVERSARIAL)] +
                         [(c, "fallback") for c in sorted(SNOOPS)])
def test_adversarial_program_is_contained(case, mode):
  if mode == "fallback" and not CAN_FALLBACK:
    pytest.skip("needs root (to switch users) and a system python readable by every uid")
  body, limits, reasons = ADVERSARIAL[case]
  start = time.monotonic()
  result = run_contained(body, limits, MODES[mode])
  assert result.reason in reasons, result
  check_snoop(case, result)
  if case == "cpu_limit":
    assert time.monotonic() - start < limits.wall_s  # ended by the CPU limit, not the wall
  if case == "huge_file":
    assert b"OSError: [Errno 27] File too large" in result.stderr
  if case == "huge_stdout":
    assert result.stdout_truncated and len(result.stdout) == limits.stdout_bytes
  if case == "huge_stderr":  # the tail is kept: the last 64 KiB are digit 9 (i = 799)
    assert result.stderr == b"9" * limits.stderr_bytes
  if case == "grandchild_outlives_parent":
    assert result.stdout == b"parent done\n" and result.wall_s < 5.0


@pytest.mark.parametrize("case, mode", [(c, m) for m in MODES for c in sorted(SNOOPS)])
def test_adversarial_program_earns_no_code_reward(case, mode):
  """As a code reward's response (the harness, the program forked from it), nothing it finds or
  does earns a reward: no secret output, no expected size, and it leaves nothing running."""
  if mode == "fallback" and not CAN_FALLBACK:
    pytest.skip("needs root (to switch users) and a system python readable by every uid")
  marker, source = marked(ADVERSARIAL[case][0])
  reward = code_reward.score(reward_record(case), f"```python\n{source}\n```", timeout_s=1.0,
                             config=MODES[mode])
  assert reward == 0.0, case
  time.sleep(0.05)
  assert survivors(marker) == []


@pytest.mark.parametrize("mode", MODES)
def test_orphans_are_reaped_so_they_do_not_use_up_the_process_limit(mode):
  """A program whose children leave orphans behind (which end at once) keeps being able to fork:
  init (namespaces) or the launcher (fallback) reaps them, zombies would count against the limit."""
  if mode == "fallback" and not CAN_FALLBACK:
    pytest.skip("needs root (to switch users) and a system python readable by every uid")
  body = """
  import os, time
  def fork():
    deadline = time.monotonic() + 3.0  # time for the reaper, which shares the CPU with the suite's other workers
    while True:
      try:
        return os.fork()
      except BlockingIOError:
        if time.monotonic() > deadline:
          raise SystemExit("fork refused: orphans left as zombies")
        time.sleep(0.005)
  for i in range(12):
    r, w = os.pipe()
    pid = fork()
    if pid == 0:
      if fork() == 0:
        os._exit(0)  # orphaned at once
      os._exit(0)
    os.close(w)
    if os.waitpid(pid, 0)[1]:
      raise SystemExit("the child could not fork")
    os.read(r, 1)  # end of file: the orphan has exited
    os.close(r)
  print("forked", 2 * (i + 1))
  """
  result = run_contained(body, sandbox.Limits(wall_s=30.0, max_processes=4), MODES[mode])
  assert (result.reason, result.stdout) == ("ok", b"forked 24\n"), result


# ---- The adversarial table (reports/sandbox_adversarial.md): python -m tests.tasks_sandbox_adversarial_test ----

def adversarial_table() -> str:
  """Runs every ADVERSARIAL case in each mode this host has, directly (outcome, seconds, whether it
  was contained) and as a code reward's response (reward); returns the report as markdown."""
  import platform
  rows = []
  for mode, config in MODES.items():
    if mode == "fallback" and not CAN_FALLBACK:
      continue
    isolation = sandbox.detect_isolation(config)
    for case in sorted(ADVERSARIAL):
      body, limits, reasons = ADVERSARIAL[case]
      marker, source = marked(body)
      start = time.monotonic()
      result = sandbox.run(source, b"", limits, config)
      seconds = time.monotonic() - start
      time.sleep(0.05)
      problems = [] if result.reason in reasons else [f"reason not in {sorted(reasons)}"]
      problems += ["backstop"] * result.backstop + ["processes left"] * bool(survivors(marker))
      try:
        check_snoop(case, result)
      except (AssertionError, IndexError, ValueError) as e:
        problems.append(f"check failed: {e!r}"[:80])
      err = result.stderr.decode(errors="replace")
      notes = (f"{err.count('GOT')} got, {err.count('refused')} refused" if "refused" in err or "GOT" in err
               else err.strip().splitlines()[-1][:60] if case in SNOOPS and err.strip() else "")
      marker, source = marked(body)
      reward = code_reward.score(reward_record(case), f"```python\n{source}\n```", timeout_s=1.0, config=config)
      time.sleep(0.05)
      problems += ["reward run left processes"] * bool(survivors(marker))
      contained = "; ".join(problems) or "yes"
      rows.append(f"| {case} | {mode} ({isolation}) | {result.reason} | {contained} | {reward:g} | {seconds:.2f} "
                  f"| {limits.wall_s:g} | {notes} |")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                        cwd=root).stdout.strip()
  dirty = subprocess.run(["git", "status", "--porcelain", "--", "oapl_jax/tasks", "tests/tasks_sandbox_adversarial_test.py"],
                         capture_output=True, text=True, cwd=root).stdout.strip()
  return "\n".join([
      "# The sandbox's adversarial set",
      "",
      "Generated by `python -m tests.tasks_sandbox_adversarial_test > reports/sandbox_adversarial.md` (the cases",
      "`test_adversarial_program_is_contained` and `test_adversarial_program_earns_no_code_reward` assert).",
      f"Measured at commit {head}{' with uncommitted sandbox changes' if dirty else ''}, as uid {os.geteuid()}, "
      f"on {platform.system()} {platform.release()} ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}).",
      "",
      "Each case runs twice per mode. Directly in the sandbox: *outcome* is its RunResult.reason, *contained*",
      "says whether the reason was the expected one, the launcher ended it by its wall limit (no backstop),",
      "no process it started was left, and its own check held (the /proc and ptrace cases: every attempt",
      "refused; the size snoop: found nothing), *seconds* is the run's wall time against its *limit*",
      "(seconds include the launcher's interpreter start-up, which the limit does not, and the teardown).",
      "Then as the response of a code reward (the harness forks it per test, timeout_s = 1) to a record",
      "whose expected output is a fresh random secret (`memory_expected_sizes`: a record with a YES and a",
      "NO test): *reward* must be 0. *notes*: what the program reported trying (stderr).",
      "Modes: `default` is SandboxConfig() (namespaces here); `fallback` is no namespaces, as root (programs",
      "run as an unused uid) with the system python, under Landlock where the kernel has it.",
      "",
      "| case | mode | outcome | contained | reward | seconds | limit s | notes |",
      "|---|---|---|---|---|---|---|---|",
      *rows, ""])


if __name__ == "__main__":
  print(adversarial_table())
