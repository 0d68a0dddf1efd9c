"""Tests for oapl_jax.tasks.sandbox and sandbox_pool: limits, results, isolation and its fallbacks, the pool.
The adversarial set is tests/tasks_sandbox_adversarial_test.py.
"""
import os
import pwd
import shutil
import socket
import subprocess
import textwrap
import uuid

import pytest

from oapl_jax.tasks import sandbox, sandbox_pool
from tests.sandbox_fixtures import (FALLBACK, SYSTEM_PYTHON, isolation, marked, needs_namespaces,  # noqa: F401
                                    needs_root_and_system_python, run_contained, survivors)

REPO_FILE = os.path.abspath(__file__)


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
    sandbox_pool.SandboxPool(0)


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
  with sandbox_pool.SandboxPool(num_workers=2, limits=sandbox.Limits(wall_s=5.0)) as pool:
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
