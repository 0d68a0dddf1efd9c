"""The sandbox's launcher: runs in a fresh child interpreter, never imported by the parent.

`sandbox.run_once` passes this file's whole text with `python -I -S -B -c`, so it imports only the
standard library and uses no module state; `sandbox.py` describes what it sets up and why.
"""
import os
import signal
import sys


def _launcher_main(argv):
  """Namespace mode: launcher -> init (PID 1 of the new PID namespace) -> program. Fallback:
  launcher -> program. The launcher enforces the wall limit, killing init (so the namespace) or
  the program; whoever waits for the program reports its cpu time and exit on the status fd."""
  import ctypes
  opts = dict(arg.split("=", 1) for arg in argv)
  status_fd, isolated = int(opts["status_fd"]), opts["isolate"] == "1"
  os.set_inheritable(status_fd, False)  # the program's exec closes it
  report = lambda line: os.write(status_fd, (line + "\n").encode())  # noqa: E731
  libc = ctypes.CDLL(None, use_errno=True)
  try:
    if isolated:
      _enter_namespaces(libc, opts)
    else:  # orphans of the program come to the launcher, which reaps them (_reap_session)
      _libc_check(libc.prctl(36, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
    child = os.fork()
  except BaseException as e:  # pylint: disable=broad-except
    report(f"error setup: {e!r}")
    os._exit(121)
  if child == 0:
    try:
      _libc_check(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")  # dies with its parent
      program = os.fork() if isolated else 0
      if program == 0:
        _exec_program(libc, opts)
      _wait_and_report(report, program)  # init
    except BaseException as e:  # pylint: disable=broad-except
      report(f"error exec: {e!r}")
    os._exit(121)
  timed_out = []

  def on_alarm(signum, frame):
    del signum, frame
    timed_out.append(True)
    os.kill(child, signal.SIGKILL)  # unreaped until waitid returns (WNOWAIT): no pid reuse
  signal.signal(signal.SIGALRM, on_alarm)
  signal.setitimer(signal.ITIMER_REAL, float(opts["wall"]))
  while (exited := os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT).si_pid) != child:
    os.waitpid(exited, 0)  # an orphan of the program, inherited as child subreaper (fallback mode)
  signal.setitimer(signal.ITIMER_REAL, 0)
  if timed_out:
    report("timeout")
  if isolated:
    os.waitpid(child, 0)
    os._exit(0)
  _wait_and_report(report, child, exit=False)
  _reap_session()
  os._exit(0)


def _wait_and_report(report, pid, exit=True):
  """Waits for the program (pid), reaping on the way every orphan that comes to this process (init
  of the PID namespace, or the fallback's launcher as child subreaper): left as zombies they would
  count against the program's process limit, so a program whose tests leave children behind would
  fail its later tests."""
  while (reaped := os.wait4(-1, 0))[0] != pid:
    pass
  _, status, usage = reaped
  report(f"cpu {usage.ru_utime + usage.ru_stime:.3f}")
  report(f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}")
  if exit:
    os._exit(0)


def _reap_session(limit_s=1.0):
  """Fallback mode, after the program ended: SIGKILLs what is left of its session (the launcher
  leads it; setsid is refused to the program) and reaps it, zombies included, since as a child
  subreaper the launcher inherits every orphan. Left to PID 1, zombies may linger and count
  against the next run's process limit (the same uid). The pool kills anything left after."""
  import time
  me, deadline = os.getpid(), time.monotonic() + limit_s
  while True:
    members = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
      try:
        with open(f"/proc/{pid}/stat", "rb") as f:
          if int(f.read().rsplit(b")", 1)[1].split()[3]) == me and int(pid) != me:  # state ppid pgrp session
            members.append(int(pid))
      except (OSError, IndexError, ValueError):
        pass
    for pid in members:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    try:
      while os.waitpid(-1, os.WNOHANG)[0]:
        pass
    except ChildProcessError:
      pass
    if not members or time.monotonic() > deadline:
      return
    time.sleep(0.002)


def _libc_check(ret, what):
  import ctypes
  if ret != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _enter_namespaces(libc, opts):
  """New user (if not root), mount, network, PID, IPC and UTS namespaces; a read-only root."""
  ns = 0x20000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x40000000  # NEWNS|UTS|IPC|PID|NET
  uid, gid = os.getuid(), os.getgid()
  _libc_check(libc.unshare(ns | (0x10000000 if uid != 0 else 0)), "unshare")  # | NEWUSER
  if uid != 0:
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
      with open(f"/proc/self/{name}", "w") as f:
        f.write(text)
  rdonly, nosuid, nodev, remount, bind, rec, private = 1, 2, 4, 32, 4096, 16384, 1 << 18

  def mount(src, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _libc_check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")

  def remount_readonly(path):  # keep the flags a user namespace may not drop (noexec, atime)
    st_flags = os.statvfs(path).f_flag
    kept = sum(ms for st, ms in ((8, 8), (1024, 1024), (2048, 2048), (4096, 1 << 21)) if st_flags & st)
    mount(None, path, None, bind | remount | rdonly | nosuid | nodev | kept)

  mount(None, "/", None, rec | private)
  root = opts["root"]
  mount("tmpfs", root, "tmpfs", nosuid | nodev, "size=1m,mode=0755")
  for path in opts["ro"].split(":"):
    target = root + path
    if os.path.islink(path):  # e.g. /lib -> usr/lib: the same link, resolved in the new root
      os.makedirs(os.path.dirname(target), exist_ok=True)
      os.symlink(os.readlink(path), target)
      continue
    if not os.path.exists(path) or os.path.exists(target):
      continue
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.isdir(path):
      os.mkdir(target)
    else:
      open(target, "w").close()
    mount(path, target, None, bind | rec)
    with open("/proc/self/mountinfo") as f:  # the bind and any mounts beneath it
      points = [line.split()[4].replace("\\040", " ") for line in f]
    for point in points:
      if point == target or point.startswith(target + "/"):
        remount_readonly(point)
  os.makedirs(root + "/dev")
  for dev in ("null", "zero", "random", "urandom"):
    open(f"{root}/dev/{dev}", "w").close()
    mount(f"/dev/{dev}", f"{root}/dev/{dev}", None, bind)
  os.mkdir(root + "/work")
  owner = f",uid={opts['uid']},gid={opts['uid']}" if opts["uid"] != "-1" else ""
  mount("tmpfs", root + "/work", "tmpfs", nosuid | nodev, f"size={opts['workdir_bytes']},mode=0755{owner}")
  with open(opts["program"], "rb") as src, open(root + "/work/main.py", "wb") as dst:
    dst.write(src.read())
  os.mkdir(root + "/work/tmp")
  if opts["uid"] != "-1":
    os.chown(root + "/work/tmp", int(opts["uid"]), int(opts["uid"]))
  os.symlink("/work/tmp", root + "/tmp")
  os.chdir(root)
  pivot_root = {"x86_64": 155, "aarch64": 41}[os.uname().machine]
  _libc_check(libc.syscall(pivot_root, b".", b"."), "pivot_root")
  _libc_check(libc.umount2(b".", 2), "umount old root")  # MNT_DETACH
  os.chdir("/")
  mount(None, "/", None, bind | remount | rdonly | nosuid | nodev)


def _exec_program(libc, opts):
  """In the program's process: drop to the sandbox uid, set limits and the filter, exec."""
  import resource
  isolated, uid = opts["isolate"] == "1", int(opts["uid"])
  if uid >= 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if isolated:  # a user namespace of its own: RLIMIT_NPROC then counts this sandbox only
      libc.unshare(0x10000000)
  nproc = int(opts["max_processes"])  # counted per uid in the program's user namespace
  if uid < 0:  # no uid of its own: the launcher and init count (namespaces), or all the user's tasks
    nproc += 2 if isolated else _count_tasks(os.getuid())
  cpu = int(opts["cpu"])
  for res, soft, hard in ((resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_NPROC, nproc, nproc),
                          (resource.RLIMIT_AS, int(opts["memory_bytes"]), None),
                          (resource.RLIMIT_FSIZE, int(opts["max_file_bytes"]), None),
                          (resource.RLIMIT_STACK, int(opts["stack_bytes"]), None),
                          (resource.RLIMIT_NOFILE, 256, None), (resource.RLIMIT_CORE, 0, None)):
    resource.setrlimit(res, (soft, soft if hard is None else hard))
  _libc_check(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")  # dies with its parent
  _libc_check(libc.prctl(38, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
  workdir = "/work" if isolated else opts["workdir"]
  if not isolated:
    _install_landlock(libc, opts["ro"].split(":") + [opts["python"]], workdir)
  _install_seccomp(libc, block_kill_all=not isolated)
  os.chdir(workdir)
  env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir + "/tmp",
         "LANG": "C.UTF-8"}
  # -u: unbuffered stdout and stderr, as on a terminal: what it printed before os._exit is kept
  os.execve(opts["python"], [opts["python"], "-I", "-S", "-B", "-u", "main.py"], env)


def _install_landlock(libc, readonly, workdir):
  """Fallback mode, where the kernel has Landlock (5.13+): the program may read and execute only
  `readonly` (the interpreter, system libraries, SandboxConfig.readonly_paths), read and write only
  `workdir` and /dev/{null,zero,random,urandom}: no /proc (so no other process's memory, environ or
  fds), no /sys, no home, no data. Being in a Landlock domain also stops it ptracing (or opening
  /proc/<pid>/mem of) any process outside, and from ABI 6 on, signalling one or connecting to an
  abstract unix socket outside. Nothing (the fallback's documented exposure) where it is absent."""
  import ctypes
  create, add_rule, restrict = 444, 445, 446  # the same numbers on x86_64 and aarch64
  abi = libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # _CREATE_RULESET_VERSION
  if abi < 1:
    return
  execute, write, read, read_dir, truncate, ioctl_dev = 1, 2, 4, 8, 1 << 14, 1 << 15
  handled = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (truncate if abi >= 3 else 0) | (
      ioctl_dev if abi >= 5 else 0)
  file_only = execute | write | read | truncate | ioctl_dev

  class RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

  class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]
  attr = RulesetAttr(handled, 0, 3 if abi >= 6 else 0)  # SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
  size = 24 if abi >= 6 else 16 if abi >= 4 else 8
  ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
  if ruleset < 0:
    _libc_check(-1, "landlock_create_ruleset")
  rules = [(path, execute | read | read_dir) for path in readonly]
  rules += [(f"/dev/{dev}", read | write | truncate | ioctl_dev) for dev in ("null", "zero", "random", "urandom")]
  rules += [(workdir, handled)]
  for path, allowed in rules:
    try:
      fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
      continue  # an optional path (/lib32, /etc/localtime) this host lacks
    try:
      if os.fstat(fd).st_mode & 0o170000 != 0o040000:  # not a directory: file rights only
        allowed &= file_only
      rule = PathBeneath(allowed & handled, fd)
      _libc_check(libc.syscall(add_rule, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule),
                               ctypes.c_uint32(0)), f"landlock_add_rule {path}")
    finally:
      os.close(fd)
  _libc_check(libc.syscall(restrict, ctypes.c_int(ruleset), ctypes.c_uint32(0)), "landlock_restrict_self")
  os.close(ruleset)


def _count_tasks(uid):
  count = 0
  for pid in os.listdir("/proc"):
    try:
      if pid.isdigit() and os.stat(f"/proc/{pid}").st_uid == uid:
        count += len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
      pass
  return count


def _install_seccomp(libc, block_kill_all):
  """A BPF filter. EPERM: ptrace, process_vm_{readv,writev}, setsid, unshare, setns, clone with
  namespace flags, io_uring, bpf, perf_event_open, userfaultfd, the key syscalls and, if asked,
  kill(-1); EACCES: sockets other than AF_UNIX; ENOSYS: clone3 (glibc falls back to clone, whose
  flags a filter can read). Another syscall ABI kills the process. Numbers: <asm/unistd_64.h>,
  <asm-generic/unistd.h> (aarch64)."""
  import ctypes
  x86 = os.uname().machine == "x86_64"
  arch = 0xC000003E if x86 else 0xC00000B7  # AUDIT_ARCH_X86_64 / AARCH64
  nr = dict(zip(("socket", "clone", "clone3", "kill", "ptrace", "process_vm_readv", "process_vm_writev",
                 "setsid", "unshare", "setns", "io_uring_setup", "bpf", "perf_event_open", "userfaultfd",
                 "keyctl", "add_key", "request_key"),
                (41, 56, 435, 62, 101, 310, 311, 112, 272, 308, 425, 321, 298, 323, 250, 248, 249) if x86 else
                (198, 220, 435, 129, 117, 270, 271, 157, 97, 268, 425, 280, 241, 282, 219, 217, 218)))
  ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
  allow, eperm, eacces, enosys = 0x7FFF0000, 0x50001, 0x5000D, 0x50026
  prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, 0x80000000), (ld, 0, 0, 0)]
  if x86:
    prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]  # the x32 ABI
  for name in list(nr)[4:]:
    prog += [(jeq, 0, 1, nr[name]), (ret, 0, 0, eperm)]
  prog += [(jeq, 0, 1, nr["clone3"]), (ret, 0, 0, enosys)]
  # (syscall, test on the low 32 bits of its first argument, k, verdict if the test holds, if not)
  checks = [("socket", jeq, 1, allow, eacces), ("clone", jset, 0x7E020000, eperm, allow)]  # AF_UNIX; CLONE_NEW*
  checks += [("kill", jeq, 0xFFFFFFFF, eperm, allow)] if block_kill_all else []  # pid -1
  for name, test, k, if_true, if_false in checks:
    prog += [(jeq, 0, 4, nr[name]), (ld, 0, 0, 16), (test, 1, 0, k), (ret, 0, 0, if_false), (ret, 0, 0, if_true)]
  prog += [(ret, 0, 0, allow)]

  class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]

  class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
  insns = (Insn * len(prog))(*[Insn(*i) for i in prog])
  _libc_check(libc.prctl(22, 2, ctypes.byref(Prog(len(prog), insns)), 0, 0), "prctl(SECCOMP)")


if __name__ == "__main__":
  _launcher_main(sys.argv[1:])
