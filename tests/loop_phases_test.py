"""Where a run's time goes: the loop writes a per-thread phase table into summary.md, and no thread's phases add
up to more than the loop's wall time (they are disjoint stretches of one thread's time)."""
import json
import os
import re
import time

from oapl_jax import reporting
from oapl_jax.rl import loop
from oapl_jax.run import assemble
from tests.loop_test import fast_config

TRAINER_PHASES = {"waiting for samples", "train step: dispatch", "refresh", "eval", "checkpoint",
                  "host sync: a step's metrics fetched (waits for its compute)"}
SAMPLER_PHASES = {"sampling", "scoring", "eval", "packing: groups into the buffer"}


def _tables(summary_md: str) -> tuple[float, dict[str, dict[str, float]]]:
  """(the loop's wall seconds, {thread: {phase: seconds}}) as summary.md prints them."""
  section = summary_md.split("## Where the time went")[1].split("\n## ")[0]
  wall = float(re.search(r"wall time: ([\d.]+) s", section).group(1))
  tables, thread = {}, None
  for line in section.splitlines():
    if m := re.match(r"\| (\w+) thread \|", line):
      thread = tables.setdefault(m.group(1), {})
    elif thread is not None and (m := re.match(r"\| (.+?) \| (-?[\d.]+) \| ", line)):
      thread[m.group(1)] = float(m.group(2))
  return wall, tables


def test_a_runs_summary_has_the_phase_table_and_no_thread_exceeds_the_wall(tmp_path):
  run = assemble.setup(fast_config(num_syncs=2, eval_every_syncs=1), str(tmp_path))
  summary = loop.train(run)
  with open(summary["paths"]["summary"]) as f:
    wall, tables = _tables(f.read())
  assert set(tables) == {"trainer", "sampler"}
  assert TRAINER_PHASES <= set(tables["trainer"]) and SAMPLER_PHASES <= set(tables["sampler"])
  assert all(phases["other"] >= 0 for phases in tables.values()), tables
  with open(os.path.join(tmp_path, "summary.json")) as f:
    recorded = json.load(f)  # the same numbers unrounded: the property holds exactly
  assert abs(recorded["loop_seconds"] - wall) <= 0.05
  for thread, phases in recorded["phase_seconds"].items():
    assert set(phases) == set(tables[thread]) - {"other"}
    assert 0 < sum(phases.values()) <= recorded["loop_seconds"], (thread, phases)
  assert recorded["phase_seconds"]["trainer"]["eval"] > 0 and recorded["loop_seconds"] <= recorded["wall_seconds"] + 0.1
  compiled = recorded["compile_seconds"]["trainer"]  # a fresh process compiles the step inside its dispatch
  assert 0 < compiled["train step: dispatch"] <= recorded["phase_seconds"]["trainer"]["train step: dispatch"]
  evals = [h for h in run.reporter.history() if "time/loop_seconds" in h]
  assert evals and all(0 < h["time/eval_seconds"] < h["time/loop_seconds"] <= wall + 0.1 for h in evals)


def test_the_clock_sums_per_thread_and_counts_time_outside_any_phase_as_other():
  clock = reporting.PhaseClock()
  clock.add("trainer", "train step", 2.0)
  clock.add("trainer", "train step", 1.0)
  clock.add("sampler", "sampling", 4.0)
  with clock.timed("trainer", "eval"):
    time.sleep(0.01)
  assert clock.seconds("trainer", "train step") == 3.0 and clock.seconds(phase="eval") >= 0.01
  table = clock.markdown(wall=10.0)
  assert "| train step | 3.00 | 30.0% | 0.00 |" in table and "| sampling | 4.00 | 40.0% | 0.00 |" in table
  assert "| other | 6.00 | 60.0% | 0.00 |" in table  # the sampler's 10 - 4


def test_compiling_is_counted_inside_the_phase_it_happens_in():
  import jax  # pylint: disable=import-outside-toplevel
  clock = reporting.PhaseClock()
  clock.start()
  with clock.timed("trainer", "train step"):
    jax.jit(lambda x: x * 3.0 + 1.0)(2.0)
  jax.jit(lambda x: x * 5.0 - 1.0)(2.0)  # outside any phase: "other"
  clock.stop()
  jax.jit(lambda x: x * 7.0)(2.0)  # after stop: not counted
  compiled = clock.compile_seconds()["trainer"]
  assert set(compiled) == {"train step", "other"}
  assert 0 < compiled["train step"] <= clock.seconds("trainer", "train step")
