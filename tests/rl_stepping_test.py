"""rl/stepping.StepDriver: the one step loop of the online window, the offline stage and the warm start.

Checked against a hand-made step (state + the key's first word) and a record of every event in order: a step is
finished only once the next is dispatched, its stop vote is the one cast at its dispatch, and its report's wish
to end the window is kept."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oapl_jax import checkpoints
from oapl_jax.rl import monitors, preemption, stepping


class _Recorder:

  def __init__(self, ends_at=()):
    self.events, self.ends_at = [], set(ends_at)

  def step_fn(self, state, batch, key):
    self.events.append(("dispatch", int(batch)))
    return state + jax.random.key_data(key)[-1].astype(jnp.int32), {"loss": jnp.float32(batch), "batch": batch}

  def report(self, step, metrics, extra):
    assert isinstance(metrics["loss"], np.ndarray), "the report sees host values"
    self.events.append(("report", step, extra.get("tag")))
    return step in self.ends_at


def test_each_step_is_reported_after_the_next_is_dispatched_and_flush_reports_the_last():
  rec = _Recorder()
  driver = stepping.StepDriver(rec.step_fn, jax.random.PRNGKey, rec.report)
  state = jnp.int32(0)
  for step in range(3):
    state = driver.step(state, step, step, {"tag": f"t{step}"})
  assert rec.events == [("dispatch", 0), ("dispatch", 1), ("report", 0, "t0"), ("dispatch", 2), ("report", 1, "t1")]
  assert driver.flush() is False and rec.events[-1] == ("report", 2, "t2")
  assert driver.flush() is False and len(rec.events) == 6  # nothing pending: nothing reported twice
  # the step's key is key_of(step): the state sums each key's last word
  expected = sum(int(jax.random.key_data(jax.random.PRNGKey(s))[-1]) for s in range(3))
  assert int(state) == np.int32(expected)


def test_a_stop_is_read_from_the_vote_cast_at_the_finished_steps_dispatch():
  rec, stop = _Recorder(), preemption.StopFlag()
  driver = stepping.StepDriver(rec.step_fn, jax.random.PRNGKey, rec.report, stop=stop)
  state = driver.step(jnp.int32(0), 0, 0)
  stop.request()  # after step 0's dispatch: its vote said go on
  state = driver.step(state, 1, 1)  # finishes step 0
  assert not driver.stopping
  state = driver.step(state, 2, 2)  # finishes step 1, dispatched after the request
  assert driver.stopping


def test_ended_keeps_any_reports_wish_and_flush_says_the_last_ones():
  rec = _Recorder(ends_at={1})
  driver = stepping.StepDriver(rec.step_fn, jax.random.PRNGKey, rec.report)
  state = driver.step(jnp.int32(0), 0, 0)
  state = driver.step(state, 1, 1)
  assert not driver.ended
  state = driver.step(state, 2, 2)  # step 1's report asks to end
  assert driver.ended
  assert driver.flush() is False and driver.ended  # step 2's does not; the window's wish stays


def test_the_health_monitor_sees_every_step_and_times_go_to_the_named_phases():
  rec, monitor, phases = _Recorder(), monitors.HealthMonitor(monitors.MonitorConfig()), []

  class _Timed:
    def __init__(self, phase):
      phases.append(phase)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      return False

  skip = lambda state, batch, key: (state, {"loss": jnp.float32(1.0), "update_skipped": jnp.float32(batch % 2)})
  driver = stepping.StepDriver(skip, jax.random.PRNGKey, rec.report, monitor=monitor, timed=_Timed)
  state = jnp.int32(0)
  for step in range(4):
    state = driver.step(state, step, step)
  driver.flush()
  assert monitor.counts["skipped_updates"] == 2  # steps 1 and 3
  assert phases.count(stepping.DISPATCH) == 4 and phases.count(stepping.FETCH) == 4
  assert stepping.CHECKPOINT not in phases  # no checkpointer given: none polled


def test_a_failed_background_save_stops_the_loop_at_the_next_steps_finish_before_its_report():
  rec = _Recorder()

  class _FailedSave:  # a checkpointer whose background write of step 1 failed after step 2 was dispatched
    def __init__(self):
      self.polls = 0

    def poll(self):
      self.polls += 1
      if self.polls == 2:
        raise checkpoints.SaveFailed(1, "/w/checkpoints/1", "File too large")

    def latest_step(self):
      return 0

  driver = stepping.StepDriver(rec.step_fn, jax.random.PRNGKey, rec.report, checkpointer=_FailedSave())
  state = driver.step(jnp.int32(0), 0, 0)
  state = driver.step(state, 1, 1)  # finishes step 0: the first poll passes
  with pytest.raises(checkpoints.SaveFailed, match="checkpoint 1 could not be written"):
    driver.step(state, 2, 2)  # finishing step 1 polls again
  assert [e for e in rec.events if e[0] == "report"] == [("report", 0, None)]  # step 1 was never reported
