"""A stop asked for by SIGTERM (a pod's preemption, `kill`) or SIGINT (Ctrl-C), read by the loop at step ends.

    stop = preemption.StopFlag(mesh).install()   # the handlers (main thread only); stop.uninstall() restores
    stop = preemption.StopFlag().install()       # before any mesh (a command's first line); .across(mesh) once built
    vote = stop.vote()                           # after dispatching a step: this process's flag, cast async
    if vote(): ...                               # one step later: True on every process, or on none

The first signal only sets a flag and logs one line; the loop then finishes the step in flight, saves a
checkpoint where it stands (inside a window too: checkpoints.py) and writes its summary; in the warm start
(rl/warmstart.py) it saves the warm start's progress and raises Stopped out of run setup. A second signal
gets the default action (the run ends at once, no save). Work with nothing to save (the final eval, after the
last checkpoint) runs inside `stop.interrupting()`, where on one process the first signal raises Stopped at once.
On one process the loop also makes `stop.cuts_work` its sampler's `interrupt`: an eval or a chunk being generated
when the signal comes ends at the sampler's next decode visit (sampler/api.Interrupted), and is made again on
resume.

Several processes (jax.distributed) must stop after the same step, whichever of them got the signal and
when: each step's vote is the max of every process's flag, one tiny all-reduce over the trainer's devices,
dispatched behind the step and read only when that step's metrics are (so the trainer never waits on it).
One process: the vote is the local flag, no device work.
"""
import contextlib
import functools
import logging
import signal
import threading
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_CODES = {"SIGTERM": 0, "SIGINT": 130}  # what a command exits with after a stop (SIGINT: the shell's 128 + 2)


class Stopped(Exception):
  """A signal ended work inside StopFlag.interrupting(), or the warm start (its progress saved)."""


class StopFlag:
  """Signal handlers that set a flag, and the cross-process agreement on it (see the module docstring)."""

  def __init__(self, mesh: Optional[jax.sharding.Mesh] = None, *,
               then: str = "finishing the step in flight, then saving a checkpoint and stopping (send it again to "
                           "stop at once, without a save)"):
    self.signal_name: Optional[str] = None  # the signal that asked for the stop (this process's)
    self.then = then  # what the line logged on a first signal says comes next
    self._previous: dict[int, Any] = {}
    self._interrupting = False
    self._collective = False
    self.across(mesh)

  def across(self, mesh: Optional[jax.sharding.Mesh]) -> "StopFlag":
    """From now on the vote is over every process (one tiny all-reduce over `mesh`'s devices) when there are
    several; a flag made before the mesh (installed at a command's start) joins it here. Returns self."""
    if mesh is None or self._collective or jax.process_count() == 1:
      return self
    devices = mesh.devices.flatten()
    self._flags = NamedSharding(jax.sharding.Mesh(devices, ("all",)), PartitionSpec("all"))
    self._count = len(devices)
    self._any = jax.jit(jnp.max, out_shardings=NamedSharding(self._flags.mesh, PartitionSpec()))
    self._collective = True
    return self

  def install(self) -> "StopFlag":
    """The handlers; nothing when they are in already or a signal has come (a second one then acts at once)."""
    if not self._previous and not self.requested and threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}  # Python allows handlers only there
    return self

  def uninstall(self) -> None:
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}

  def _handle(self, signum: int, frame) -> None:
    del frame
    self.signal_name = signal.Signals(signum).name
    for s, handler in self._previous.items():  # a second signal acts at once, as it would have
      signal.signal(s, handler)
    if self._interrupting:
      logging.warning("%s received: stopping the final eval (the trained state is checkpointed; the same command "
                      "runs the eval)", self.signal_name)
      raise Stopped(self.signal_name)
    logging.warning("%s received: %s", self.signal_name, self.then)

  def request(self, name: str = "SIGTERM") -> None:
    """As if `name` had arrived (tests, notebooks)."""
    self.signal_name = name

  @contextlib.contextmanager
  def interrupting(self):
    """Inside, a signal raises Stopped where the main thread is. One process only: with several, it only sets
    the flag (one process leaving a collective early would leave the others waiting in it)."""
    self._interrupting = not self._collective
    try:
      yield
    finally:
      self._interrupting = False

  @property
  def requested(self) -> bool:
    return self.signal_name is not None

  def cuts_work(self) -> bool:
    """Whether work in flight should end now (a sampler's `interrupt`): a signal came, on one process. With
    several, only the agreed vote stops anything (one process leaving a program early would leave the others
    waiting in its collectives)."""
    return self.requested and not self._collective

  @contextlib.contextmanager
  def cutting(self, sampler):
    """Inside, `sampler`'s generate calls end with sampler/api.Interrupted once `cuts_work` says so."""
    sampler.interrupt = self.cuts_work
    try:
      yield
    finally:
      sampler.interrupt = None

  def vote(self) -> Callable[[], bool]:
    """This process's flag now, entered into the all-process max (dispatched, not waited for); calling the
    result says whether any process had asked to stop then: the same answer on every process."""
    if not self._collective:
      return functools.partial(bool, self.requested)
    local = np.full((1,), self.requested, np.int32)
    agreed = self._any(jax.make_array_from_callback((self._count,), self._flags, lambda index: local))
    return functools.partial(self._read, agreed)

  def _read(self, agreed: jax.Array) -> bool:
    if not bool(np.asarray(agreed.addressable_data(0))):
      return False
    self.signal_name = self.signal_name or "a signal to another process"
    return True
