"""The code reward's harness: what runs inside the sandbox as its main.py (its source passed as text), stdlib only.

Its stdin holds a job (code_reward._batch_job): an 8-byte little-endian length, a marshalled header {output_bytes,
timeout_s, stop_on_failure, programs: [(offset, length, budget)]}, then each program's marshalled {code, fn_name,
inputs} at its offset. It runs program `k` (argv[1], 0 by default): compiles the code once and forks a fresh process
per test; each test's record "i status seconds length\n" + payload goes to stdout for the grader (tasks/code_reward.py)
to compare outside the sandbox, at most `budget` bytes of them (a record over it is replaced by an empty
output_limit record and the program stops there). It reads (pread) only this program's entry, never the others'.

Several programs (a batch) run one after another, each in a fresh interpreter: once program k is done the harness kills
every process left but init and itself (kill(-1), until none is left), empties /work (but for a fresh main.py and an
empty tmp/), writes "next\n" and execs itself for program k + 1. So nothing of a program (processes, files, its code,
inputs or outputs in memory) is left for the next. Where it cannot make sure (fallback mode refuses kill(-1); a file it
cannot remove) it exits after program k without "next": code_reward runs the programs left again.
"""
import inspect


def _harness_main():
  import builtins
  import marshal
  import sys
  import math, resource, select, signal, time  # noqa: E401,F401  (each test's, imported once)
  k = int(sys.argv[1]) if len(sys.argv) > 1 else 0
  size = int.from_bytes(_harness_pread(8, 0), "little")
  job = marshal.loads(_harness_pread(size, 8))
  programs = job.pop("programs")
  offset, length, budget = programs[k]
  job.update(marshal.loads(_harness_pread(length, 8 + size + offset)))  # code, fn_name, inputs
  with open("main.py", "rb") as f:  # this harness, for the next program (read before any test runs)
    source = f.read()
  builtins.exit = builtins.quit = sys.exit  # what `site` would add (the sandbox runs python -S)
  prelude = {}
  exec("from typing import *\nfrom collections import *\nfrom heapq import *\nfrom bisect import *\n"
       "from itertools import *\nfrom functools import *\nfrom math import *\nfrom builtins import *\n"
       "import bisect, collections, functools, heapq, itertools, json, math, random, re, string, sys\n",
       prelude)
  _harness_program(job, budget, prelude, builtins)
  if k + 1 < len(programs) and _harness_clean(source):
    _harness_write(b"next\n")
    os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", "-u", "main.py", str(k + 1)])
  os._exit(0)  # nothing buffered (records go out with os.write); no teardown of the prelude's modules


def _harness_program(job, budget, prelude, builtins):
  try:
    code = compile(job["code"], "solution.py", "exec")
  except BaseException as e:  # pylint: disable=broad-except  (SyntaxError, ValueError: null bytes)
    message = repr(e).encode()
    _harness_write(f"0 error 0 {len(message)}\n".encode() + message)
    return
  for i, test_input in enumerate(job["inputs"]):
    status, seconds, payload = _harness_test(code, job, test_input, prelude, builtins)
    record = f"{i} {status} {seconds:.4f} {len(payload)}\n".encode() + payload
    if len(record) > budget:
      _harness_write(f"{i} output_limit {seconds:.4f} 0\n".encode())
      return
    budget -= len(record)
    _harness_write(record)
    if status != "ok" and job["stop_on_failure"]:
      return


def _harness_pread(size, offset):
  data = bytearray()
  while len(data) < size:
    chunk = os.pread(0, size - len(data), offset + len(data))
    if not chunk:
      raise EOFError(f"job ends at {offset + len(data)}, {size - len(data)} bytes short")
    data += chunk
  return bytes(data)


def _harness_clean(source):
  """Before the next program: kills every process but init and this one, until none is left (init reaps them),
  and empties /work but for `source` as main.py and an empty tmp/. False if it could not make sure."""
  import signal
  import time
  deadline = time.monotonic() + 2.0
  while True:
    try:
      os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
      break
    except PermissionError:  # fallback mode's filter refuses kill(-1)
      return False
    if time.monotonic() > deadline:
      return False
    time.sleep(0.001)
  try:
    for name in os.listdir("."):
      _harness_remove(name)
    with open("main.py", "wb") as f:
      f.write(source)
    os.mkdir("tmp")
    return sorted(os.listdir(".")) == ["main.py", "tmp"] and not os.listdir("tmp")
  except Exception:  # pylint: disable=broad-except  (OSError; RecursionError: nested too deep)
    return False


def _harness_remove(path):
  if os.path.isdir(path) and not os.path.islink(path):
    os.chmod(path, 0o700)  # the program may have made it unreadable; it is ours (same uid)
    for name in os.listdir(path):
      _harness_remove(os.path.join(path, name))
    os.rmdir(path)
  else:
    os.unlink(path)


def _harness_write(data):
  """All of data to fd 1 (the sandbox's stdout pipe), unbuffered: no child inherits a buffer."""
  view = memoryview(data)
  while view:
    view = view[os.write(1, view):]


def _harness_test(code, job, test_input, prelude, builtins):
  """Runs one test in a forked child; returns (status, seconds, output or return value bytes).
  status: ok, error, memory, output_limit (over the fixed job["output_bytes"]), killed (a signal
  not from a limit: e.g. the program killed its own group) or timeout (wall or CPU limit)."""
  import math
  import resource
  import select
  import signal
  import time
  call = job["fn_name"] is not None
  with open("input", "wb") as f:
    f.write(b"" if call else test_input.encode())
  fds = [os.open("input", os.O_RDONLY)] + [
      os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for name in ("stdout", "stderr", "return")]
  cpu = math.ceil(job["timeout_s"])
  start = time.monotonic()
  pid = os.fork()
  if pid == 0:
    status = 1
    try:
      os.setpgid(0, 0)
      for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
      hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
      resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, hard), min(cpu + 1, hard)))
      status = _harness_child(code, job, test_input, fds[3], prelude, builtins)
    finally:
      os._exit(status)
  for fd in fds:
    os.close(fd)
  pidfd = os.pidfd_open(pid)
  timed_out = not select.select([pidfd], [], [], job["timeout_s"])[0]
  if timed_out:
    os.kill(pid, signal.SIGKILL)
  _, status, usage = os.wait4(pid, 0)
  seconds = time.monotonic() - start
  os.close(pidfd)
  try:
    os.kill(-1, signal.SIGKILL)  # in the PID namespace: every leftover but init and this harness
  except ProcessLookupError:
    pass
  except PermissionError:  # fallback mode's filter refuses kill(-1): the test's group, then
    try:
      os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  cap = job["output_bytes"]
  with open("return" if call else "stdout", "rb") as f:
    payload = f.read(cap + 1)
  with open("stderr", "rb") as f:
    f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
    memory_error = b"MemoryError" in f.read()
  signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
  out_of_cpu = signum == signal.SIGXCPU or (signum == signal.SIGKILL and usage.ru_utime + usage.ru_stime >= cpu)
  if timed_out or out_of_cpu:
    return "timeout", seconds, b""
  if len(payload) > cap:
    return "output_limit", seconds, payload[:cap]
  if signum is None and os.WEXITSTATUS(status) == 0:
    return "ok", seconds, payload
  if memory_error:
    return "memory", seconds, payload
  return ("error" if signum is None else "killed"), seconds, payload


def _harness_child(code, job, test_input, return_fd, prelude, builtins):
  """In the test's process: a fresh __main__ module, real fds 0-2 (stdout and stderr unbuffered,
  as `python -u` makes them), the program, the call."""
  import io
  import json
  import sys
  import types
  sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
  sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                                 write_through=True)
  sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                                 errors="backslashreplace", write_through=True)
  module = types.ModuleType("__main__")
  module.__dict__.update(prelude)
  module.__dict__.update(__name__="__main__", __file__="solution.py", __builtins__=builtins)
  sys.modules["__main__"], sys.argv = module, ["solution.py"]
  status = 0
  try:
    exec(code, module.__dict__)  # pylint: disable=exec-used
    if job["fn_name"] is not None:
      cls = module.__dict__.get("Solution")
      fn = (getattr(cls(), job["fn_name"]) if cls is not None and hasattr(cls, job["fn_name"])
            else module.__dict__[job["fn_name"]])
      os.write(return_fd, json.dumps(fn(*test_input)).encode())
  except SystemExit as e:
    status = 0 if e.code in (None, 0) else 1
  except BaseException:  # pylint: disable=broad-except
    sys.__excepthook__(*sys.exc_info())  # the interpreter's own traceback printer: no import per test
    status = 1
  sys.stdout.flush()
  sys.stderr.flush()
  return status


HARNESS_SOURCE = "import os\n" + "\n".join(inspect.getsource(f) for f in (
    _harness_main, _harness_program, _harness_pread, _harness_clean, _harness_remove, _harness_write, _harness_test,
    _harness_child)) + "\n_harness_main()\n"
