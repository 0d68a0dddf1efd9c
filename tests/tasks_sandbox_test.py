"""Tests for oapl_jax.tasks.sandbox: limits, results, and an adversarial set that must stay contained.

Every adversarial program first names its process (and so every process it forks) with a fresh
marker; after the run no process with that marker may be left on the host.
"""
import os
import pwd
import shutil
import socket
import subprocess
import textwrap
import time
import uuid

import pytest

from oapl_jax.tasks import code_reward, sandbox

REPO_FILE = os.path.abspath(__file__)
SYSTEM_PYTHON = "/usr/bin/python3"
FALLBACK = sandbox.SandboxConfig(python=SYSTEM_PYTHON, use_namespaces=False)


@pytest.fixture(scope="module")
def isolation():
  return sandbox.detect_isolation()


def needs_namespaces(isolation):
  if isolation != "namespaces":
    pytest.skip("the kernel refuses unprivileged namespaces here; fallback tests cover this host")


def marked(body: str) -> tuple[str, str]:
  marker = "sbx" + uuid.uuid4().hex[:12]
  prelude = f"import ctypes\nctypes.CDLL(None).prctl(15, b{marker!r}, 0, 0, 0)  # PR_SET_NAME\n"
  return marker, prelude + textwrap.dedent(body)


def survivors(marker: str) -> list[int]:
  """Live processes named `marker` (zombies are dead: killed, waiting for init to reap them)."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/stat") as f:
        name, state = f.read().split("(", 1)[1].rsplit(")", 1)
      if name == marker and state.split()[0] != "Z":
        found.append(int(pid))
    except (OSError, ValueError):
      pass
  return found


def run_contained(body, limits=sandbox.Limits(wall_s=1.0), config=sandbox.SandboxConfig(), stdin=b""):
  """Runs a marked program; asserts the launcher ended it by its wall limit (the pool's backstop,
  3 s later, was not needed) and that it left no process behind."""
  marker, source = marked(body)
  result = sandbox.run(source, stdin, limits, config)
  assert not result.backstop, result
  time.sleep(0.05)
  assert survivors(marker) == [], result
  return result


def test_runs_a_program_with_stdin_in_a_clean_private_directory(isolation):
  source = ("import os, sys\ndata = sys.stdin.read()\nprint(data[::-1])\n"
            "print(os.getcwd() == os.environ['HOME'], os.environ['TMPDIR'].startswith(os.getcwd()))\n"
            "print(sorted(os.environ))\nsys.stderr.write('note')\n")
  result = sandbox.run(source, b"abc\n")
  assert result.reason == "ok" and result.exit_code == 0 and result.signal is None
  lines = result.stdout.decode().splitlines()
  assert lines[:2] == ["", "cba"]
  assert "True True" in lines
  assert lines[-1] == "['HOME', 'LANG', 'PATH', 'TMPDIR']"
  assert result.stderr == b"note"
  if isolation == "namespaces":
    assert sandbox.run("import os; print(os.getcwd())").stdout == b"/work\n"


@pytest.mark.parametrize("source, reason, exit_code", [
    ("raise SystemExit(3)", "error", 3),
    ("def f(:\n  pass", "error", 1),
    ("1 / 0", "error", 1),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "killed", None),
])
def test_failures_are_classified(source, reason, exit_code):
  result = sandbox.run(source)
  assert (result.reason, result.exit_code) == (reason, exit_code), result


def test_limits_validate():
  with pytest.raises(ValueError):
    sandbox.Limits(wall_s=0)
  with pytest.raises(ValueError):
    sandbox.Limits(memory_bytes=-1)
  with pytest.raises(ValueError):
    sandbox.SandboxPool(0)


def test_syscall_filter_refuses_namespaces_and_ptrace_but_not_threads_or_subprocesses():
  body = """
  import ctypes, os, socket, subprocess, threading
  libc = ctypes.CDLL(None, use_errno=True)
  def errno(ret):
    return ctypes.get_errno() if ret == -1 else 0
  t = threading.Thread(target=print, args=("thread",))
  t.start()
  t.join()
  print(subprocess.run(["/bin/echo", "subprocess"], capture_output=True, text=True).stdout.strip())
  print("unix", len(socket.socketpair()))
  print("unshare", errno(libc.unshare(0x10000000 | 0x40000000)))  # CLONE_NEWUSER | CLONE_NEWNET
  print("setsid", errno(libc.setsid()))
  print("ptrace", errno(libc.ptrace(16, os.getppid(), 0, 0)))  # PTRACE_ATTACH
  """
  result = run_contained(body, sandbox.Limits(wall_s=5.0))
  assert result.stdout.decode().split("\n")[:-1] == [
      "thread", "subprocess", "unix 2", "unshare 1", "setsid 1", "ptrace 1"], result  # 1: EPERM


def test_process_limit_caps_forks(isolation):
  body = """
  import os, time
  n = 0
  try:
    while n < 100:
      if os.fork() == 0:
        time.sleep(30)
      n += 1
  except OSError:
    pass
  print(n)
  """
  result = run_contained(body, sandbox.Limits(wall_s=5.0, max_processes=6))
  assert result.reason == "ok", result
  forked = int(result.stdout)  # the program itself is one of its 6 processes
  assert forked == 5 if isolation == "namespaces" else 0 < forked <= 5


# ---- The adversarial set: (body, limits, expected reason, extra check on the result). ----

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
CAN_FALLBACK = os.geteuid() == 0 and os.path.exists(SYSTEM_PYTHON)  # see needs_root_and_system_python


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
    for _ in range(100):  # a moment for the reaper, never more
      try:
        return os.fork()
      except BlockingIOError:
        time.sleep(0.005)
    raise SystemExit("fork refused: orphans left as zombies")
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
  result = run_contained(body, sandbox.Limits(wall_s=10.0, max_processes=4), MODES[mode])
  assert (result.reason, result.stdout) == ("ok", b"forked 24\n"), result


def test_output_printed_before_os_exit_is_kept():
  """The program runs unbuffered, as from a terminal: os._exit (no flush) keeps what it printed."""
  result = sandbox.run("import os, sys\nprint('line')\nsys.stdout.write('partial')\nsys.stderr.write('err')\n"
                       "os._exit(0)\n")
  assert (result.reason, result.stdout, result.stderr) == ("ok", b"line\npartial", b"err"), result


def test_network_is_unreachable(isolation):
  tcp = socket.create_server(("127.0.0.1", 0))
  abstract = socket.socket(socket.AF_UNIX)  # abstract unix sockets are per network namespace
  name = f"\0oapl-sbx-{uuid.uuid4().hex}"
  abstract.bind(name)
  tcp.listen()
  abstract.listen()
  port = tcp.getsockname()[1]
  body = f"""
  import socket
  attempts = {{
      "tcp_local": lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2),
      "tcp_remote": lambda: socket.create_connection(("8.8.8.8", 53), timeout=2),
      "udp": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)),
      "ipv6": lambda: socket.socket(socket.AF_INET6),
      "netlink": lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW),
      "abstract_unix": lambda: socket.socket(socket.AF_UNIX).connect({name!r}),
  }}
  for what, attempt in attempts.items():
    try:
      attempt()
      print(what, "CONNECTED")
    except OSError as e:
      print(what, type(e).__name__)
  """
  result = run_contained(body, sandbox.Limits(wall_s=5.0))
  assert result.reason == "ok", result
  lines = result.stdout.decode().splitlines()
  assert lines[:5] == [f"{what} PermissionError" for what in  # the seccomp filter, in both modes
                       ("tcp_local", "tcp_remote", "udp", "ipv6", "netlink")], lines
  tcp.settimeout(0.2)
  with pytest.raises(socket.timeout):
    tcp.accept()
  if isolation == "namespaces":  # only a network namespace hides the host's abstract unix sockets
    assert lines[5] == "abstract_unix ConnectionRefusedError", lines
    abstract.settimeout(0.2)
    with pytest.raises(socket.timeout):
      abstract.accept()
  tcp.close()
  abstract.close()


def test_no_writes_outside_the_sandbox(tmp_path, isolation):
  needs_namespaces(isolation)  # fallback: the uid's permissions only (root fallback: tested below)
  tag = uuid.uuid4().hex
  targets = [os.path.expanduser(f"~/pwned-{tag}"), f"/root/pwned-{tag}", f"/tmp/pwned-{tag}",
             f"/dev/shm/pwned-{tag}", os.path.join(os.path.dirname(REPO_FILE), f"pwned-{tag}"),
             f"/usr/pwned-{tag}", f"{tmp_path}/pwned-{tag}", REPO_FILE]
  body = f"""
  import os
  for path in {targets!r} + [os.path.expanduser("~/inside")]:
    try:
      with open(path, "a") as f:
        f.write("pwned")
      print("wrote", path)
    except OSError as e:
      print("refused", path, type(e).__name__)
  """
  before = open(REPO_FILE).read()
  result = run_contained(body, sandbox.Limits(wall_s=5.0))
  assert result.reason == "ok", result
  for path in targets[:-1]:
    assert not os.path.exists(path), path
  assert open(REPO_FILE).read() == before
  assert any(line.startswith(b"wrote ") and line.endswith(b"/inside")
             for line in result.stdout.splitlines()), result.stdout  # its own HOME is writable


def test_no_reads_outside_the_sandbox(isolation):
  needs_namespaces(isolation)
  secrets = ["/etc/shadow", "/etc/passwd", REPO_FILE, "/root/.bashrc", "/proc/1/environ",
             "/sys/class/net", "/home", "/work/main/README.md"]
  body = f"""
  import os
  for path in {secrets!r}:
    try:
      print("GOT", path, len(os.listdir(path) if os.path.isdir(path) else open(path).read()))
    except OSError as e:
      print("hidden", path, type(e).__name__)
  """
  result = run_contained(body, sandbox.Limits(wall_s=5.0))
  assert result.reason == "ok", result
  assert b"GOT" not in result.stdout, result.stdout
  assert result.stdout.count(b"hidden") == len(secrets)


def test_killing_the_parent_and_everything_else_is_contained(isolation):
  if isolation != "namespaces" and os.geteuid() != 0:
    pytest.skip("unprivileged fallback: a program may signal its user's processes (documented)")
  body = f"""
  import os, signal
  for pid in (os.getppid(), 1, {os.getpid()}, -1, 0):
    try:
      os.kill(pid, signal.SIGKILL)
      print("sent", pid)
    except OSError as e:
      print("refused", pid, type(e).__name__)
  """
  result = run_contained(body, sandbox.Limits(wall_s=5.0))
  assert result.reason in {"ok", "killed"}, result  # kill(0) may take the program's own group
  assert os.getppid() > 1  # this test process and its parent are alive


def test_pool_runs_batches_in_parallel_and_counts_throughput():
  with sandbox.SandboxPool(num_workers=2, limits=sandbox.Limits(wall_s=5.0)) as pool:
    jobs = [sandbox.Job(f"print({i} * {i})") for i in range(6)]
    jobs.append(sandbox.Job("import sys; print(sys.stdin.read().upper())", b"xyz"))
    results = pool.run_batch(jobs)
    assert [r.stdout for r in results[:6]] == [f"{i * i}\n".encode() for i in range(6)]
    assert results[6].stdout == b"XYZ\n"
    future = pool.submit("import time; time.sleep(0.5); print('late')")
    assert not future.done()  # submit returns at once
    assert future.result().stdout == b"late\n"
    stats = pool.stats()
    assert stats.runs == 8 and stats.busy_s > 0 and stats.runs_per_s == 8 / stats.busy_s


# ---- The fallback (no namespaces) and the unprivileged (user namespace) paths. ----

needs_root_and_system_python = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root (to switch users) and a system python readable by every uid")


@needs_root_and_system_python
def test_fallback_blocks_sockets_and_kill_all_and_cleans_up():
  assert sandbox.detect_isolation(FALLBACK) == "fallback"
  body = """
  import os, socket, time
  for what, attempt in (("inet", lambda: socket.socket()), ("kill_all", lambda: os.kill(-1, 9)),
                        ("root_home", lambda: open("/root/pwned", "w"))):
    try:
      attempt()
      print(what, "ALLOWED")
    except OSError as e:
      print(what, type(e).__name__, flush=True)
  if os.fork() == 0:
    os.setpgid(0, 0)  # a new group, same session: still killed with the run
    time.sleep(60)
  time.sleep(60)
  """
  result = run_contained(body, sandbox.Limits(wall_s=1.0), FALLBACK)
  assert result.reason == "timeout", result
  assert result.stdout.split(b"\n")[:3] == [b"inet PermissionError", b"kill_all PermissionError",
                                            b"root_home PermissionError"]
  assert not os.path.exists("/root/pwned")


@pytest.mark.skipif(os.geteuid() != 0, reason="the root fallback's own interpreter choice")
def test_fallback_as_root_runs_with_the_default_interpreter():
  """As root the fallback runs programs as an unused uid: with no interpreter given, one that uid
  cannot reach (e.g. under /root, mode 0700) gives way to a system python, and programs run."""
  config = sandbox.SandboxConfig(use_namespaces=False)
  assert sandbox.detect_isolation(config) == "fallback"
  result = sandbox.run("import os, sys\nprint(os.getuid() >= 2_000_000_000, sys.version_info >= (3, 10))",
                       config=config)
  assert (result.reason, result.stdout) == ("ok", b"True True\n"), result


@needs_root_and_system_python
def test_fallback_as_root_says_why_an_interpreter_is_out_of_reach(tmp_path):
  locked = tmp_path / "locked"
  locked.mkdir(mode=0o700)
  python = str(locked / "python3")
  shutil.copy(os.path.realpath(SYSTEM_PYTHON), python)
  config = sandbox.SandboxConfig(python=python, python_prefix="/usr", use_namespaces=False)
  with pytest.raises(sandbox.SandboxError, match=r"cannot reach the interpreter .*locked/python3: /\S+ is mode 0700"):
    sandbox.detect_isolation(config)


@needs_root_and_system_python
def test_fallback_hides_the_host_filesystem_and_other_processes():
  """Where the kernel has Landlock, a fallback program reads only the interpreter, system libraries
  and its own directory: no repo, no /proc (no other process's memory or environment)."""
  if sandbox.run("import os; os.listdir('/proc')", config=FALLBACK).ok:
    pytest.skip("no Landlock on this kernel: the fallback shows the host filesystem (documented)")
  body = f"""
  import os
  for path in {[REPO_FILE, "/proc/self/mem", f"/proc/{os.getpid()}/environ", "/proc", "/home", "/etc/passwd"]!r}:
    try:
      print("GOT", path, len(os.listdir(path) if os.path.isdir(path) else open(path, "rb").read()))
    except OSError as e:
      print("hidden", path, type(e).__name__)
  open("mine", "w").write("x")
  print(open("mine").read(), open("/usr/lib/os-release").read() != "")
  """
  result = run_contained(body, sandbox.Limits(wall_s=5.0), FALLBACK)
  assert result.reason == "ok", result
  lines = result.stdout.decode().splitlines()
  assert [line.split()[0] for line in lines[:-1]] == ["hidden"] * 6, lines
  assert lines[-1] == "x True", lines


def test_require_isolation_refuses_the_fallback():
  with pytest.raises(sandbox.SandboxError):
    sandbox.detect_isolation(sandbox.SandboxConfig(use_namespaces=False, require_isolation=True))


def run_as_nobody(use_namespaces: bool) -> tuple[list[str], str]:
  """Runs three programs through the sandbox module from a process of user `nobody` (a user
  without privileges, as on a TPU VM or a GPU node); returns its printed lines and the marker."""
  marker, body = marked("""
  import os, socket, time
  try:
    top = sorted(os.listdir('/'))[:3]
  except OSError as e:  # the fallback under Landlock
    top = type(e).__name__
  print(os.getuid(), top, os.path.exists('/dev/shm'))
  for what, attempt in (("inet", socket.socket), ("kill_all", lambda: os.kill(-1, 9)),
                        ("parent_environ", lambda: open(f"/proc/{os.getppid()}/environ").read())):
    try:
      attempt()
      print(what, "ALLOWED")
    except OSError as e:
      print(what, type(e).__name__)
  if os.fork() == 0:
    os.setpgid(0, 0)
    time.sleep(60)
  """)
  script = textwrap.dedent(f"""
  import importlib.util, sys
  spec = importlib.util.spec_from_file_location("sandbox", {os.path.abspath(sandbox.__file__)!r})
  sb = importlib.util.module_from_spec(spec)
  sys.modules["sandbox"] = sb
  spec.loader.exec_module(sb)
  config = sb.SandboxConfig(python={SYSTEM_PYTHON!r}, use_namespaces={use_namespaces})
  print(sb.detect_isolation(config))
  print(sb.run({body!r}, config=config).stdout.decode().strip())
  print(sb.run("import time; time.sleep(60)", limits=sb.Limits(wall_s=1), config=config).reason)
  """)
  nobody = pwd.getpwnam("nobody").pw_uid
  out = subprocess.run([SYSTEM_PYTHON, "-I", "-c", script], user=nobody, group=nobody, extra_groups=[],
                       capture_output=True, text=True, timeout=60, cwd="/", env={"PATH": "/usr/bin"})
  assert out.returncode == 0, (out.stdout, out.stderr)
  return out.stdout.splitlines(), marker


@needs_root_and_system_python
def test_unprivileged_user_gets_namespaces(isolation):
  needs_namespaces(isolation)
  lines, marker = run_as_nobody(use_namespaces=True)
  nobody = pwd.getpwnam("nobody").pw_uid
  assert lines == ["namespaces", f"{nobody} ['bin', 'dev', 'etc'] False",  # its own uid; no host /dev/shm
                   "inet PermissionError", "kill_all ProcessLookupError", "parent_environ FileNotFoundError",
                   "timeout"], lines
  assert survivors(marker) == []


@needs_root_and_system_python
def test_unprivileged_user_fallback():
  lines, marker = run_as_nobody(use_namespaces=False)
  assert lines[0] == "fallback" and lines[1].endswith(" True"), lines  # the host's filesystem
  # the launcher's environment (and its parent's, the grader's, holding the expected outputs) is
  # the same user's: only Landlock keeps it from the program
  landlock = sandbox.run("import os; os.listdir('/proc')", config=FALLBACK).reason == "error"
  assert lines[2:] == ["inet PermissionError", "kill_all PermissionError",
                       "parent_environ " + ("PermissionError" if landlock else "ALLOWED"), "timeout"], lines
  assert survivors(marker) == []


# ---- The adversarial table (reports/sandbox_adversarial.md): python tests/tasks_sandbox_test.py ----

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
  root = os.path.dirname(os.path.dirname(REPO_FILE))
  head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                        cwd=root).stdout.strip()
  dirty = subprocess.run(["git", "status", "--porcelain", "--", "oapl_jax/tasks", "tests/tasks_sandbox_test.py"],
                         capture_output=True, text=True, cwd=root).stdout.strip()
  return "\n".join([
      "# The sandbox's adversarial set",
      "",
      "Generated by `python tests/tasks_sandbox_test.py > reports/sandbox_adversarial.md` (the same cases",
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
