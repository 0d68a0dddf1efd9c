"""A study, curve or A/B stopped by a signal ends in one line: Ctrl-C or SIGTERM between runs, or inside a run
(the loop then saves a checkpoint and the harness sees the run end early). Finished runs are kept and the same
command resumes."""
from __future__ import annotations

import contextlib
import signal
import sys
import time

EARLY_END = "stopped before its last window"  # what the harness raises when the loop ended on a signal


class Stopped(Exception):
  """Raised by the SIGTERM handler outside a run (the loop installs its own inside one)."""


@contextlib.contextmanager
def one_line_stop(tag: str):
  """Turns a stop into `[tag] stopped by SIGNAL after Ns: ...` on stderr and SystemExit (130 for Ctrl-C, 0 for
  SIGTERM, as the loop exits); any other error passes through."""
  def on_sigterm(signum, frame):  # noqa: ARG001
    raise Stopped("SIGTERM")
  previous = signal.signal(signal.SIGTERM, on_sigterm)
  start = time.time()
  try:
    yield
  except (KeyboardInterrupt, Stopped, RuntimeError) as e:
    if isinstance(e, RuntimeError) and EARLY_END not in str(e):
      raise
    name = "SIGINT" if isinstance(e, KeyboardInterrupt) else "SIGTERM"
    print(f"[{tag}] stopped by {name} after {time.time() - start:.0f}s: finished runs are kept and an unfinished "
          "one resumes from its checkpoint; run the same command to go on (--collect writes the report from what "
          "finished)", file=sys.stderr, flush=True)
    raise SystemExit(130 if name == "SIGINT" else 0) from None
  finally:
    signal.signal(signal.SIGTERM, previous)
