"""The one step loop of the codebase: dispatch step t, then finish step t-1 while t runs.

The online window (rl/loop.py), the offline stage (rl/offline.py) and the warm start (rl/warmstart.py) all drive
their jitted train step through `StepDriver`. It calls the step with that step's key, then finishes the step
before it: fetches its metrics (which waits for its compute), polls the checkpointer (a failed background save
stops the run there), shows them to the health monitor and hands them to the caller's `report`. So the host never
waits on the step it has just dispatched. A stop vote (rl/preemption.py) is cast as each step is dispatched and
read when that step is finished, a step later, so reading it never waits either; `stopping` says whether any
finished step's vote was to stop, on every process alike.

What differs between the three is a value given here, not a loop of their own: the step's key, the report (the
online window's also says whether the window policy ends the window: `ended`), whether a checkpointer and a
monitor are watched, and the phase clock the time goes to.
"""
import contextlib
from typing import Any, Callable, ContextManager, Optional

import jax

from oapl_jax.checkpoints import Checkpointer
from oapl_jax.rl.monitors import HealthMonitor
from oapl_jax.rl.preemption import StopFlag

DISPATCH = "train step: dispatch"
FETCH = "host sync: a step's metrics fetched (waits for its compute)"
CHECKPOINT = "checkpoint"

# (step, its metrics on the host, the extras given at its dispatch) -> True to end the window after the next step
Report = Callable[[int, dict, dict], Optional[bool]]


def _never() -> bool:
  return False


def _untimed(phase: str) -> ContextManager:
  del phase
  return contextlib.nullcontext()


class StepDriver:
  """Runs `step_fn(state, batch, key_of(step))` one step ahead of its bookkeeping (module docstring)."""

  def __init__(self, step_fn: Callable, key_of: Callable[[int], jax.Array], report: Report, *,
               stop: Optional[StopFlag] = None, checkpointer: Optional[Checkpointer] = None,
               monitor: Optional[HealthMonitor] = None, timed: Callable[[str], ContextManager] = _untimed):
    self._step_fn, self._key_of, self._report = step_fn, key_of, report
    self._stop, self._checkpointer, self._monitor, self._timed = stop, checkpointer, monitor, timed
    self._pending: Optional[tuple[int, Any, dict, Callable[[], bool]]] = None
    self.ended = False  # a finished step's report asked to end the window
    self.stopping = False  # a finished step had been dispatched after a stop was agreed

  def step(self, state, batch, step: int, extra: Optional[dict] = None):
    """Dispatches step `step` on `state` (donated), then finishes the step before it; returns the new state."""
    with self._timed(DISPATCH):
      state, metrics = self._step_fn(state, batch, self._key_of(step))
    self.flush()
    self._pending = (step, metrics, extra or {}, self._stop.vote() if self._stop is not None else _never)
    return state

  def flush(self) -> bool:
    """Finishes the step in flight, if any (before a probe; at a window's, a stage's or a warm start's end);
    returns whether its report asked to end the window."""
    if self._pending is None:
      return False
    (step, metrics, extra, vote), self._pending = self._pending, None
    with self._timed(FETCH):
      metrics = jax.device_get(metrics)
    if self._checkpointer is not None:
      with self._timed(CHECKPOINT):
        self._checkpointer.poll()
    if self._monitor is not None:
      self._monitor.observe(step, metrics, self._checkpointer.latest_step() if self._checkpointer else None)
    ends = bool(self._report(step, metrics, extra))
    self.ended |= ends
    self.stopping |= vote()
    return ends
