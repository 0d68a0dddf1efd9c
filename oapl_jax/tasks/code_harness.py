"""The code reward's harness: what runs inside the sandbox as its main.py (its source passed as text), stdlib only.

It reads a marshalled job {code, fn_name, inputs, output_bytes, timeout_s, stop_on_failure} from stdin, compiles the
code once and forks a fresh process per test; each test's record "i status seconds length\n" + payload goes to
stdout for the grader (tasks/code_reward.py) to compare outside the sandbox.
"""
import inspect

def _harness_main():
  import builtins
  import marshal
  import sys
  job = marshal.loads(sys.stdin.buffer.read())
  builtins.exit = builtins.quit = sys.exit  # what `site` would add (the sandbox runs python -S)
  prelude = {}
  exec("from typing import *\nfrom collections import *\nfrom heapq import *\nfrom bisect import *\n"
       "from itertools import *\nfrom functools import *\nfrom math import *\nfrom builtins import *\n"
       "import bisect, collections, functools, heapq, itertools, json, math, random, re, string, sys\n",
       prelude)
  try:
    code = compile(job["code"], "solution.py", "exec")
  except BaseException as e:  # pylint: disable=broad-except  (SyntaxError, ValueError: null bytes)
    message = repr(e).encode()
    _harness_write(f"0 error 0 {len(message)}\n".encode() + message)
    return
  for i, test_input in enumerate(job["inputs"]):
    status, seconds, payload = _harness_test(code, job, test_input, prelude, builtins)
    _harness_write(f"{i} {status} {seconds:.4f} {len(payload)}\n".encode() + payload)
    if status != "ok" and job["stop_on_failure"]:
      break


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
  import traceback
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
    traceback.print_exc()
    status = 1
  sys.stdout.flush()
  sys.stderr.flush()
  return status


HARNESS_SOURCE = "import os\n" + "\n".join(inspect.getsource(f) for f in (
    _harness_main, _harness_write, _harness_test, _harness_child)) + "\n_harness_main()\n"
