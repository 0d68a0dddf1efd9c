"""Containment of a reward's worker process (rewards.WorkerReward), as the code sandbox contains a program.

In the worker, `contain` (the pool's initializer) and `run_item` (each item):
- the worker leads its own session and process group and is a child subreaper, so everything a reward starts
  (a verifier shelled out, a daemonised grandchild that called setsid) stays below it;
- every descendant a reward leaves running is killed when its item returns: a reward keeps no process between
  items;
- fds 1 and 2 (the reward's prints and its children's) go to a pipe drained into a bounded buffer: each item
  sends back its first KEEP_LINES lines (KEEP_BYTES at most) and a count of the rest, never the trainer's stdout;
- with memory_mb > 0, RLIMIT_AS is the worker's address space (after its imports and warm-up) plus memory_mb:
  an allocation past it raises MemoryError, and the item fails;
- a watchdog thread: when the trainer is gone (killed), the worker kills its descendants and exits.
In the trainer, `kill_tree(pid)` freezes a worker and all its descendants, then kills them (timeout, close).
"""
from __future__ import annotations

import dataclasses
import os
import resource
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable

import numpy as np

KEEP_LINES, KEEP_BYTES = 20, 4096  # of each item's output, and of the whole run's in the trainer's log
_END_WAIT_S = 2.0  # the most an item waits for its output to drain


def as_reward(value) -> float:
  """A finite real number (bools count as 0/1), or ValueError (strings, None, NaN and inf are failures)."""
  if isinstance(value, (str, bytes)) or value is None:
    raise ValueError(f"a reward must be a number, got {value!r}")
  number = float(value)
  if not np.isfinite(number):
    raise ValueError(f"a reward must be finite, got {number}")
  return number


@dataclasses.dataclass(frozen=True)
class Printed:
  """What a reward wrote to stdout and stderr: the first lines, and the whole size."""
  head: tuple[str, ...] = ()
  lines: int = 0
  bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One item's result: its reward, or error ('Type: message') and the worker's traceback."""
  value: float = 0.0
  error: str = ""
  trace: str = ""
  printed: Printed = Printed()
  left_running: int = 0  # descendants killed when the item returned
  out_of_memory: bool = False


# ---- the process tree (both sides) ----

def _state(pid: int) -> tuple[str, int]:
  """(state letter, parent pid) from /proc/pid/stat; ("", 0) once it is gone."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      fields = f.read().rsplit(b")", 1)[1].split()
    return fields[0].decode(), int(fields[1])
  except (OSError, IndexError, ValueError):
    return "", 0


def _children(pid: int) -> list[int]:
  """pid's child processes, from /proc/PID/task/*/children (or, without it, every process's parent)."""
  if not _HAS_CHILDREN_FILE:
    return [int(p) for p in filter(str.isdigit, os.listdir("/proc")) if _state(int(p))[1] == pid]
  kids = []
  try:
    for tid in os.listdir(f"/proc/{pid}/task"):
      with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
        kids += map(int, f.read().split())
  except OSError:
    pass
  return kids


_HAS_CHILDREN_FILE = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def descendants(pid: int) -> list[int]:
  """Every live (not zombie) descendant of pid; as a child subreaper, its orphans' too."""
  found, todo = [], _children(pid)
  while todo:
    child = todo.pop()
    if _state(child)[0] not in ("", "Z", "X"):
      found.append(child)
      todo += _children(child)
  return found


def _signal(pids, sig) -> None:
  for pid in pids:
    try:
      os.kill(pid, sig)
    except OSError:
      pass


def kill_tree(root: int, include_root: bool = True, limit_s: float = 2.0) -> int:
  """SIGSTOPs root's descendants (and root) until no new one appears, so none can fork, then SIGKILLs them
  all; again until none is left (up to limit_s). Returns how many were killed, root not counted. Only
  root itself reaps (waitpid(-1) in the trainer would take its other children's exit codes). On return the
  killed processes are gone or zombies, not merely signalled (a loaded host can take a while to deliver)."""
  deadline, killed = time.monotonic() + limit_s, set()
  while True:
    frozen = {root} if include_root else set()
    _signal(frozen, signal.SIGSTOP)
    while new := set(descendants(root)) - frozen:
      _signal(new, signal.SIGSTOP)
      frozen |= new
    _signal(frozen, signal.SIGKILL)
    killed |= frozen - {root}
    if root == os.getpid():
      _reap()
    if not descendants(root) or time.monotonic() > deadline:
      _wait_dead(killed | ({root} if include_root else set()), time.monotonic() + limit_s)
      return len(killed)
    time.sleep(0.005)


def _wait_dead(pids: set[int], deadline: float) -> None:
  """Until every pid is gone or a zombie (SIGKILL is delivered asynchronously), or the deadline."""
  while any(_state(p)[0] not in ("", "Z", "X") for p in pids) and time.monotonic() < deadline:
    time.sleep(0.005)


def _reap() -> None:
  """Collects this process's dead children (the killed ones, and orphans it inherited as a subreaper)."""
  try:
    while os.waitpid(-1, os.WNOHANG)[0]:
      pass
  except ChildProcessError:
    pass


# ---- the worker side ----

class _Capture:
  """fds 1 and 2 -> a pipe; a thread keeps each item's first lines and counts the rest."""

  def __init__(self):
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, self.write_fd = os.pipe()
    self.end = b"\0oapl-item-end-" + os.urandom(8).hex().encode() + b"\0"
    self.done = threading.Condition()
    self.ended = 0  # end markers drained
    self._take_over()
    self._reset()
    threading.Thread(target=self._drain, args=(read_fd,), name="reward-output", daemon=True).start()

  def _take_over(self) -> None:
    os.dup2(self.write_fd, 1)
    os.dup2(self.write_fd, 2)

  def _reset(self) -> None:
    self.head, self.size, self.newlines, self.last = bytearray(), 0, 0, b"\n"

  def _take(self, data: bytes) -> None:
    if data:
      self.head += data[:max(0, KEEP_BYTES - len(self.head))]
      self.size += len(data)
      self.newlines += data.count(b"\n")
      self.last = data[-1:]

  def _drain(self, fd: int) -> None:
    tail, hold = b"", len(self.end) - 1  # a marker may span two reads
    while True:
      try:
        data = tail + os.read(fd, 1 << 16)
        while (k := data.find(self.end)) >= 0:
          with self.done:
            self._take(data[:k])
            self.ended += 1
            self.done.notify_all()
          data = data[k + len(self.end):]
        with self.done:
          self._take(data[:max(0, len(data) - hold)])
        tail = data[max(0, len(data) - hold):]
      except MemoryError:  # under the reward's memory limit: drop this read, keep draining
        tail = b""

  def finish_item(self, seq: int) -> Printed:
    """Writes the item's end marker after all its output, waits for the drain, returns and resets its counts."""
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except (OSError, ValueError, AttributeError):
        pass
    self._take_over()  # the reward may have moved fds 1 and 2
    os.write(self.write_fd, self.end)
    with self.done:
      self.done.wait_for(lambda: self.ended >= seq, timeout=_END_WAIT_S)
      text = bytes(self.head).decode("utf-8", errors="replace").splitlines()[:KEEP_LINES]
      printed = Printed(tuple(text), self.newlines + (self.last != b"\n"), self.size)
      self._reset()
    return printed


_capture: _Capture | None = None
_items = 0  # items this worker ran


def contain(memory_mb: int, warmup: Callable[[], object] | None = None) -> None:
  """The pool's initializer, in each worker: its own session, a subreaper, output captured, a watchdog;
  then warmup() and the memory limit. A warmup that raises is left to the pool's first task (rewards._ready)
  to report, with its traceback."""
  global _capture
  os.setsid()
  import ctypes  # pylint: disable=import-outside-toplevel
  ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come here, not to PID 1
  _capture = _Capture()
  threading.Thread(target=_watch_parent, args=(os.getppid(),), name="reward-watchdog", daemon=True).start()
  try:
    if warmup is not None:
      warmup()
  except BaseException:  # pylint: disable=broad-except
    pass
  if memory_mb:
    _limit_memory(memory_mb)


def _watch_parent(parent: int) -> None:
  while os.getppid() == parent:
    time.sleep(0.5)
  kill_tree(os.getpid(), include_root=False)
  os._exit(1)


def _limit_memory(memory_mb: int) -> None:
  """RLIMIT_AS = the address space now (after the imports and warm-up) + memory_mb."""
  with open("/proc/self/status", encoding="ascii") as f:
    size_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
  hard = resource.getrlimit(resource.RLIMIT_AS)[1]
  resource.setrlimit(resource.RLIMIT_AS, ((size_kb << 10) + (memory_mb << 20), hard))


def run_item(fn: Callable[..., Any], *args) -> Outcome:
  """fn(*args) as a reward, in a contained worker: never raises for what fn does."""
  global _items
  value, error, trace, oom = 0.0, "", "", False
  try:
    value = as_reward(fn(*args))
  except BaseException as e:  # pylint: disable=broad-except  (SystemExit, KeyboardInterrupt: the item's failure)
    error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    trace, oom = traceback.format_exc(), isinstance(e, MemoryError)
  left = kill_tree(os.getpid(), include_root=False) if descendants(os.getpid()) else 0
  printed = Printed()
  if _capture is not None:
    _items += 1
    printed = _capture.finish_item(_items)
  return Outcome(value, error, trace, printed, left, oom)


class PrintLog:
  """In the trainer: the first KEEP_LINES lines a reward printed in the run, and how much in all."""

  def __init__(self):
    self.head: list[str] = []
    self.lines = self.bytes = 0

  def add(self, printed: Printed) -> list[str]:
    """Counts an item's output; returns its lines that are new to the head (to log)."""
    self.lines += printed.lines
    self.bytes += printed.bytes
    new = list(printed.head[:KEEP_LINES - len(self.head)])
    self.head += new
    return new

  @property
  def dropped_lines(self) -> int:
    return max(0, self.lines - len(self.head))

  @property
  def dropped_bytes(self) -> int:
    return max(0, self.bytes - sum(len(line.encode()) + 1 for line in self.head))
