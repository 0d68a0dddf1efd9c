"""Several programs in one sandbox run (CodeReward's batch_size): the job that carries them, and their records' stream.

The harness (code_harness.py) runs a job's programs one after another, each in a fresh interpreter, and between two
kills every process left and empties /work, then writes "next\\n". A program of a batch is graded only once the harness
is done with it: its "next" arrived, or, for the last, the run ended ok. The programs of a run that ended before (one of
them killed the harness, or used up the run's wall time) run again, the first of them alone (an unbatched run, graded as
every run was before batches), the rest as a new batch: a program's failure, timeout or flood costs only its own reward.
"""
from __future__ import annotations

import dataclasses
import itertools
import marshal
from typing import Sequence

from oapl_jax.tasks import code_harness, sandbox

HARNESS_START_S = 5.0  # harness start-up and prelude imports, on top of the tests' own time
PROGRAM_START_S = 1.0  # each further program of a batch: the harness's exec and prelude again
SEPARATOR = b"next\n"


@dataclasses.dataclass(frozen=True)
class Program:
  """One program's part of a job: entry, its marshalled {code, fn_name, inputs}; tests, how many; biggest, the
  largest input (bytes)."""
  entry: bytes
  tests: int
  biggest: int


def job(programs: Sequence[Program], settings) -> sandbox.Job:
  """The sandbox job that runs `programs` with code_reward.Settings `settings` (see code_harness for the layout). Each
  program may send back `budget` bytes of records, what one unbatched run could: its fixed caps and its number of tests
  only, nothing of the expected outputs."""
  budgets = [min(settings.total_output_bytes, p.tests * (settings.output_bytes + 64)) + 4096 for p in programs]
  offsets = itertools.accumulate((len(p.entry) for p in programs), initial=0)
  header = marshal.dumps(dict(output_bytes=settings.output_bytes, timeout_s=settings.timeout_s,
                              stop_on_failure=not settings.partial_credit,
                              programs=[(o, len(p.entry), b) for o, p, b in zip(offsets, programs, budgets)]))
  stdin = len(header).to_bytes(8, "little") + header + b"".join(p.entry for p in programs)
  biggest = max(max(p.biggest for p in programs), settings.output_bytes + 1)  # a file it writes
  tests = sum(p.tests for p in programs)
  limits = sandbox.Limits(
      wall_s=tests * (settings.timeout_s + 0.5) + HARNESS_START_S + (len(programs) - 1) * PROGRAM_START_S,
      memory_bytes=settings.memory_bytes, stdout_bytes=sum(budgets) + len(programs) * 64 + 4096,
      max_file_bytes=max(16 << 20, 2 * biggest), workdir_bytes=max(64 << 20, 4 * biggest))
  return sandbox.Job(code_harness.HARNESS_SOURCE, stdin, limits)


class BatchHead:
  """A batch run's stdout as it arrives (a sandbox keep_stdout): each program's records go to its own
  code_reward.GraderHead (all but the last made with separated=True) and what it keeps to kept[k]; the sandbox keeps
  nothing. finished: how many programs' separators arrived."""

  def __init__(self, heads: Sequence):
    self.heads, self.kept, self.finished = list(heads), [bytearray() for _ in heads], 0

  def __call__(self, chunk: bytes) -> bytes:
    view = memoryview(chunk)
    while view and self.finished < len(self.heads):
      head = self.heads[self.finished]
      kept, view = head.feed(view)
      self.kept[self.finished] += kept
      if not head.ended:
        head.cut.bytes += len(view)  # past a record the harness did not write: nothing more is read
        break
      self.finished += 1
    return b""

  def done(self, result: sandbox.RunResult) -> int:
    """How many programs (from the first) the harness finished in `result`'s run."""
    last = self.heads[-1]
    return self.finished + (self.finished == len(self.heads) - 1 and result.ok and not last.broken)
