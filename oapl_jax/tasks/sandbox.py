"""Runs untrusted Python programs (model-written code) in locked-down child processes.

Standard library and the OS only; works unprivileged. Each run: a launcher interpreter (`python -I -S -B -c
<sandbox_launcher.py>`) sets the sandbox up, forks the program's process and execs `python -I -S -B -u
main.py` in a private working directory, with the run's stdin; -u: stdout and stderr unbuffered, as a user
expects from a terminal, so what a program printed before os._exit or a fatal signal is kept.

Two isolation modes, chosen once per process by a probe (`detect_isolation`):

  "namespaces" (where the kernel allows them; as root, or unprivileged via a user namespace): new network
    namespace (only a down loopback: no network at all), PID namespace (its PID 1 is a small init whose
    death, when the program ends or at the limit, makes the kernel kill every process left, grandchildren
    included; nothing outside is visible or signalable), mount, IPC and UTS namespaces. The filesystem is a
    fresh read-only root holding only read-only binds of /usr (and /bin, /lib*, /sbin), the interpreter's
    prefix, /etc/ld.so.cache, /dev/{null,zero,random,urandom} and `SandboxConfig.readonly_paths`, plus a
    private tmpfs at /work (cwd, HOME, TMPDIR; size-capped). No /proc, /sys, /home, /tmp of the host, no
    repo: writes outside /work are impossible and reads see only those binds. As root the program runs as an
    unused uid (2e9 + worker slot), as a user it keeps the user's uid (mapped in its user namespace); either
    way with no capabilities.
  "fallback" (no namespaces): same limits. As root the program runs as an unused uid (2e9 + worker
    slot), which must be able to run the interpreter: with SandboxConfig.python unset and the running one
    out of its reach (e.g. a pyenv under /root, mode 0700), a system python3 (3.10+) is used and the
    warning says so; with it set, SandboxError says which directory blocks it. Where the kernel has
    Landlock (5.13+), the program may read only what namespace mode binds (the interpreter's prefix,
    /usr, /bin, /lib*, /sbin, /etc/ld.so.cache, /etc/localtime, readonly_paths) and read and write only
    its own directory and /dev/{null,zero,random,urandom}: no /proc (no other process's memory, environ
    or fds), /sys, home, repo or data; and, as a Landlock domain, it cannot ptrace anything outside nor
    (ABI 6+) signal it or reach its abstract unix sockets. Without Landlock it sees the host filesystem
    with its uid's permissions (as root: an unused uid, so only world-writable places such as /tmp are
    writable; as a user: everything the user can read and write, /proc/<pid>/ of the user's processes
    included, where Yama allows), and can signal the user's other processes by pid. A warning says which;
    `require_isolation` refuses the fallback instead.

Always enforced, both modes: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_NPROC (processes + threads; counted per
sandbox in namespace mode), RLIMIT_FSIZE (any one file written), RLIMIT_STACK, RLIMIT_NOFILE, no core files;
a wall-time limit (the launcher kills the program at the limit, the pool everything 3 s later as a
backstop); a clean environment (HOME, TMPDIR, PATH, LANG); no setuid gains (no_new_privs); a seccomp filter
(x86_64, aarch64) that refuses sockets other than AF_UNIX, new namespaces, setsid, ptrace and a few kernel
surfaces (sandbox_launcher's _install_seccomp); the run's own session and process group, SIGKILLed after
every run (in fallback mode by the launcher, a child subreaper, which also reaps them: zombies left to PID 1
would count against the next run's process limit); stdout and stderr read concurrently and bounded
(stdout: the first `stdout_bytes`, then the run is killed; stderr: the last `stderr_bytes`). Not enforced: total memory of several processes (each has its
own RLIMIT_AS: a pool may use up to num_workers * max_processes * memory_bytes), CPU share, disk use in
fallback. Reasons a run ends: ok, error (nonzero exit), timeout (wall or CPU), memory (MemoryError),
output_limit (stdout cap or SIGXFSZ), killed (another signal), sandbox_error.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

REASONS = ("ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error")
_UID_BASE = 2_000_000_000  # unused uids for root-launched runs, one per worker slot
_BACKSTOP_S = 3.0  # the pool kills a run this long after its wall limit if the launcher did not
_REAP_S = 1.0  # fallback mode: how long the pool keeps killing a finished run's processes


class SandboxError(RuntimeError):
  """The sandbox cannot run programs here with the requested isolation."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """Per-run limits. cpu_s defaults to ceil(wall_s)."""
  wall_s: float = 10.0
  cpu_s: float | None = None
  memory_bytes: int = 1 << 30
  max_processes: int = 8
  max_file_bytes: int = 16 << 20
  workdir_bytes: int = 64 << 20
  stack_bytes: int = 64 << 20
  stdout_bytes: int = 8 << 20
  stderr_bytes: int = 64 << 10

  def __post_init__(self):
    if not self.wall_s > 0 or (self.cpu_s is not None and not self.cpu_s > 0):
      raise ValueError(f"time limits must be positive: {self}")
    if min(self.memory_bytes, self.max_processes, self.max_file_bytes, self.workdir_bytes,
           self.stack_bytes, self.stdout_bytes, self.stderr_bytes) <= 0:
      raise ValueError(f"limits must be positive: {self}")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """Where and how programs run. python: the interpreter (default: this one, symlinks resolved);
  python_prefix: its installation root, bound read-only (default: sys.base_prefix for the
  default interpreter, else the parent of its bin/)."""
  python: str | None = None
  python_prefix: str | None = None
  readonly_paths: tuple[str, ...] = ()
  use_namespaces: bool = True
  require_isolation: bool = False
  temp_root: str | None = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None

  def interpreter(self) -> tuple[str, str]:
    if self.python is None:
      return os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)
    python = os.path.realpath(self.python)
    return python, os.path.realpath(self.python_prefix or os.path.dirname(os.path.dirname(python)))


@dataclasses.dataclass(frozen=True)
class RunResult:
  """How one run ended. reason: one of REASONS; exit_code/signal: the program's (None if not);
  backstop: the pool had to kill the run after its wall limit because the launcher had not (a
  containment failure: the reason is still "timeout"); detail: for sandbox_error, what failed."""
  reason: str
  exit_code: int | None
  signal: int | None
  stdout: bytes
  stderr: bytes
  wall_s: float
  cpu_s: float
  stdout_truncated: bool = False
  backstop: bool = False
  detail: str = ""

  @property
  def ok(self) -> bool:
    return self.reason == "ok"


@dataclasses.dataclass(frozen=True)
class Job:
  source: str
  stdin: bytes = b""
  limits: Limits | None = None


# The launcher's whole text, passed to the child interpreter with -c (read, not imported: see its docstring).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launcher.py"), encoding="utf-8") as _f:
  _LAUNCHER_SOURCE = _f.read()


# ---- The parent side: one run and the isolation probe (the pool: sandbox_pool.py). ----

_slots = itertools.count()  # worker slots, unique in this process (root runs use uid base + slot)
_local = threading.local()
_isolation_cache: dict[tuple, str] = {}
_isolation_lock = threading.Lock()
_RESERVED = ("/work", "/tmp", "/dev")  # the sandbox's own directories


def _readonly_paths(config: SandboxConfig) -> list[str]:
  paths = ["/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin", "/etc/ld.so.cache",
           "/etc/localtime", config.interpreter()[1], *config.readonly_paths]
  for p in paths:
    if ":" in p or not os.path.isabs(p) or p == "/" or any(p == r or p.startswith(r + "/") for r in _RESERVED):
      raise ValueError(f"read-only path {p!r}: must be absolute, without ':', outside {_RESERVED}")
  return paths


def run_once(source: str, stdin: bytes, limits: Limits, config: SandboxConfig, isolation: str,
             keep_stdout: Callable[[bytes], bytes] | None = None) -> RunResult:
  """One run in the calling thread (the pool's workers call this). Never raises for what the
  program does; a run the sandbox could not start ends with reason "sandbox_error". keep_stdout:
  what to keep of each chunk of stdout as it arrives (all of it by default); limits.stdout_bytes
  counts what arrived."""
  start = time.monotonic()
  if not hasattr(_local, "slot"):
    _local.slot = next(_slots) % 1_000_000
  uid = _UID_BASE + _local.slot if os.geteuid() == 0 else -1
  host_dir = tempfile.mkdtemp(prefix="oapl_sandbox_", dir=config.temp_root)
  isolated = isolation == "namespaces"
  opts = dict(isolate=int(isolated), python=config.interpreter()[0], uid=uid, wall=limits.wall_s,
              cpu=math.ceil(limits.cpu_s or limits.wall_s), memory_bytes=limits.memory_bytes,
              max_processes=limits.max_processes, max_file_bytes=limits.max_file_bytes,
              stack_bytes=limits.stack_bytes, workdir_bytes=limits.workdir_bytes,
              root=f"{host_dir}/root", workdir=f"{host_dir}/work", ro=":".join(_readonly_paths(config)),
              program=f"{host_dir}/main.py" if isolated else f"{host_dir}/work/main.py")
  status, stdout, stderr, over, backstop = {}, b"", b"", False, False
  try:
    os.makedirs(opts["root"] if isolated else opts["workdir"] + "/tmp")
    with open(opts["program"], "w", encoding="utf-8") as f:
      f.write(source)
    with open(f"{host_dir}/stdin", "wb") as f:
      f.write(stdin)
    if not isolated and uid >= 0:  # the fallback's dropped uid works in place
      os.chmod(host_dir, 0o711)
      for path in (opts["workdir"], opts["workdir"] + "/tmp"):
        os.chown(path, uid, uid)
    status_r, status_w = os.pipe()
    try:
      with open(f"{host_dir}/stdin", "rb") as stdin_file:
        try:
          proc = subprocess.Popen(  # pylint: disable=consider-using-with
              [opts["python"], "-I", "-S", "-B", "-c", _LAUNCHER_SOURCE, f"status_fd={status_w}",
               *(f"{k}={v}" for k, v in opts.items())], stdin=stdin_file, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE, pass_fds=(status_w,), start_new_session=True, env={}, cwd=host_dir)
        finally:
          os.close(status_w)
      try:
        stdout, stderr, status_text, over, backstop = _collect(proc, status_r, limits, start, keep_stdout)
        status = _parse_status(status_text)
      finally:
        _kill_all(proc, isolated)
    finally:
      os.close(status_r)
  except OSError as e:
    status = {"error": f"host: {e!r}"}
  finally:
    shutil.rmtree(host_dir, onerror=_force_remove)
  reason = _classify(status, limits, stderr, over, backstop)
  detail = ""
  if reason == "sandbox_error":
    detail = f"{status['error']} {stderr[-2000:]!r}" if stderr else str(status["error"])
    log.warning("sandbox could not run a program: %s", detail)
  return RunResult(reason=reason, exit_code=status.get("exit"), signal=status.get("signal"),
                   stdout=stdout, stderr=stderr, wall_s=time.monotonic() - start,
                   cpu_s=status.get("cpu", 0.0), stdout_truncated=over, backstop=backstop, detail=detail)


def _force_remove(func, path, _):
  """rmtree's error handler: a fallback program may have made its directories unwritable."""
  try:
    os.chmod(os.path.dirname(path), 0o700)
    func(path)
  except OSError:
    log.warning("sandbox: could not remove %s", path)


def _collect(proc, status_fd, limits, start, keep_stdout):
  """Reads stdout (head, what keep_stdout keeps of it), stderr (tail) and the launcher's status until
  the run ends, its stdout overflows, or the backstop deadline passes. Returns (stdout, stderr,
  status, over, backstop)."""
  out, err, status, received = bytearray(), bytearray(), bytearray(), 0
  bufs = {proc.stdout.fileno(): out, proc.stderr.fileno(): err, status_fd: status}
  deadline = start + limits.wall_s + _BACKSTOP_S
  over = backstop = False
  launcher_done = None
  with selectors.DefaultSelector() as sel:
    for fd in bufs:
      os.set_blocking(fd, False)
      sel.register(fd, selectors.EVENT_READ)
    while sel.get_map() and not over:
      now = time.monotonic()
      if now > deadline:
        backstop = True
        break
      if launcher_done is not None and now > launcher_done + 0.5:
        break  # the launcher is gone and something it left holds the pipes open (fallback mode)
      for key, _ in sel.select(timeout=min(0.1, deadline - now)):
        chunk = os.read(key.fd, 1 << 16)
        if not chunk:
          sel.unregister(key.fd)
          launcher_done = time.monotonic() if key.fd == status_fd else launcher_done
          continue
        buf = bufs[key.fd]
        if buf is out:
          received += len(chunk)
          if received > limits.stdout_bytes:
            chunk, over = chunk[:len(chunk) - (received - limits.stdout_bytes)], True
          out += chunk if keep_stdout is None else keep_stdout(chunk)
          continue
        buf += chunk
        if buf is err and len(err) > limits.stderr_bytes:
          del err[:len(err) - limits.stderr_bytes]
  return bytes(out), bytes(err), status.decode(errors="replace"), over, backstop


def _kill_all(proc, isolated):
  """SIGKILLs the run's process group: the launcher and init (whose death ends the PID namespace
  and everything in it, the kernel waiting for them all), or in fallback mode every process of
  the run's session (setsid is refused, so no descendant leaves it), again until none is alive
  (for up to _REAP_S). Their zombies were reaped by the launcher (a child subreaper that kills and
  reaps its session before it exits: zombies count against the next run's process limit, same
  uid); only those of a launcher the program killed go to PID 1. The launcher is reaped only
  after, so its pid, the group's and the session's id, cannot have been reused by then."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  deadline = time.monotonic() + _REAP_S
  while not isolated and (members := _session_members(proc.pid)):
    for pid in members:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    if time.monotonic() > deadline:
      log.warning("sandbox: %d processes of a finished run survive SIGKILL", len(members))
      break
    time.sleep(0.005)
  proc.stdout.close()
  proc.stderr.close()
  proc.wait()


def _session_members(session: int) -> list[int]:
  """The live pids (not zombies) in `session`, but the session's leader (the launcher)."""
  members = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()  # after "(comm)": state ppid pgrp session
      if int(fields[3]) == session and int(pid) != session and fields[0] != b"Z":
        members.append(int(pid))
    except (OSError, IndexError, ValueError):
      pass
  return members


def _parse_status(text: str) -> dict:
  status = {}
  for line in text.splitlines():
    key, _, value = line.partition(" ")
    if key in ("exit", "signal"):
      status[key] = int(value)
    elif key == "cpu":
      status[key] = float(value)
    elif key in ("timeout", "error"):
      status[key] = value or True
  return status


def _classify(status: dict, limits: Limits, stderr: bytes, over: bool, backstop: bool) -> str:
  sig = status.get("signal")
  if "error" in status:
    return "sandbox_error"
  if over or sig == signal.SIGXFSZ:
    return "output_limit"
  if ("timeout" in status or backstop or sig == signal.SIGXCPU
      or (sig == signal.SIGKILL and status.get("cpu", 0) >= math.ceil(limits.cpu_s or limits.wall_s))):
    return "timeout"
  if status.get("exit") == 0:
    return "ok"
  if b"MemoryError" in stderr:
    return "memory"
  return "error" if "exit" in status else "killed"


def detect_isolation(config: SandboxConfig = SandboxConfig()) -> str:
  """"namespaces" or "fallback", probed once per config; SandboxError if programs cannot run."""
  return resolve_isolation(config)[0]


def resolve_isolation(config: SandboxConfig) -> tuple[str, SandboxConfig]:
  """(isolation, the config runs use): the config itself, or, for the fallback as root with the
  default interpreter out of the unused uid's reach, the same with a system python."""
  key = dataclasses.astuple(config) + (config.interpreter(),)
  with _isolation_lock:
    if key not in _isolation_cache:
      _isolation_cache[key] = _probe(config)
    return _isolation_cache[key]


_PROBE = """import os, socket, sys
try:
  socket.socket()
except PermissionError:
  print('blocked', *sys.version_info[:2])
try:
  os.listdir('/proc')
  print('host filesystem')
except OSError:
  print('confined')
"""
_MIN_PYTHON = (3, 10)  # for a system python the fallback picks itself (the code reward's harness needs 3.9+)
_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


def _probe(config: SandboxConfig) -> tuple[str, SandboxConfig]:
  if os.uname().machine not in ("x86_64", "aarch64"):
    raise SandboxError(f"no seccomp filter for {os.uname().machine}: refusing to run unfiltered")
  failures = [] if config.use_namespaces else ["namespaces: disabled by config"]
  for isolation in ("namespaces",) * config.use_namespaces + ("fallback",) * (not config.require_isolation):
    candidates, note = [config], ""
    if isolation == "fallback" and os.geteuid() == 0 and (blocker := _unreachable(config)):
      note = (f"as root it runs programs as an unused uid ({_UID_BASE} + worker slot), which cannot reach the "
              f"interpreter {config.interpreter()[0]}: {blocker}")
      candidates = [] if config.python is not None else [
          dataclasses.replace(config, python=p, python_prefix=None) for p in _SYSTEM_PYTHONS
          if os.path.exists(p) and os.path.realpath(p) != config.interpreter()[0]]
      candidates = [c for c in candidates if not _unreachable(c)]
      if not candidates:
        failures.append(f"fallback: {note}; give SandboxConfig(python=...) an interpreter every user can read "
                        "and run")
    for candidate in candidates:
      result = run_once(_PROBE, b"", Limits(wall_s=10.0), candidate, isolation)
      lines = result.stdout.decode(errors="replace").splitlines()
      version = tuple(map(int, lines[0].split()[1:])) if result.ok and lines[:1] and lines[0].startswith(
          "blocked ") else ()
      if result.ok and version and (candidate is config or version >= _MIN_PYTHON):
        if isolation == "fallback":
          seen = ("sockets are blocked and Landlock lets programs read only the interpreter and system "
                  "libraries and write only their own directory" if lines[1:] == ["confined"] else
                  "sockets are blocked, but programs see the host filesystem with their uid's permissions "
                  "(no Landlock on this kernel)")
          if candidate is not config:
            seen += f"; {note}, so programs run with {candidate.interpreter()[0]}"
          log.warning("sandbox: FALLBACK mode (%s): %s", "; ".join(failures), seen)
        return isolation, candidate
      why = result.detail or f"{result.reason} {result.stdout[-200:]!r} {result.stderr[-500:]!r}"
      if result.ok and version:
        why = f"{candidate.interpreter()[0]} is Python {'.'.join(map(str, version))}, older than {_MIN_PYTHON}"
      failures.append(f"{isolation}: {why}")
  raise SandboxError("no sandbox with the required isolation: " + "; ".join(failures))


def _unreachable(config: SandboxConfig) -> str:
  """Why a uid of no group (the fallback's, as root) cannot run config's interpreter: a directory
  on the way or the interpreter without the permission bits for others ("" if none is missing)."""
  python, prefix = config.interpreter()
  needs = [(d, stat.S_IXOTH) for d in _ancestors(python) + _ancestors(prefix)]
  needs += [(prefix, stat.S_IXOTH | stat.S_IROTH), (python, stat.S_IXOTH)]
  for path, bits in needs:
    try:
      mode = os.stat(path).st_mode
    except OSError as e:
      return f"{path}: {e.strerror}"
    if mode & bits != bits:
      return f"{path} is mode {stat.S_IMODE(mode):04o} (others need {'r-x' if bits & stat.S_IROTH else '--x'})"
  return ""


def _ancestors(path: str) -> list[str]:
  parts = path.split("/")[1:-1]
  return ["/"] + ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def run(source: str, stdin: bytes = b"", limits: Limits = Limits(), config: SandboxConfig = SandboxConfig(),
        keep_stdout: Callable[[bytes], bytes] | None = None) -> RunResult:
  """Runs one program in the sandbox (in this thread) and returns how it ended."""
  isolation, run_config = resolve_isolation(config)
  return run_once(source, stdin, limits, run_config, isolation, keep_stdout)
