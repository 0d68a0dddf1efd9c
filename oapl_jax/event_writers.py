"""TensorBoard events of a run, through clu's writer or the tensorboard package's own (the `report` section).

    writer = open_writer(workdir, "clu")          # clu's SummaryWriter (imports tensorflow); tensorboard's without it
    writer = open_writer(workdir, "tensorboard")  # tensorboard's protos and framing, pure Python: no tensorflow
    writer.write_scalars(step, {"train/loss": 0.1}); writer.write_texts(step, {...}); writer.flush()

Both write the same events files, read by the same TensorBoard. clu's writes each scalar as an eager TensorFlow op,
~0.11 ms a scalar on a 2-core AMD EPYC (2.85 ms for 25, against 0.07 ms here), and importing it takes 2.4 s: nothing
beside a step of seconds, but ~4 ms of a CPU demo's ~60 ms step (docs/benchmarks.md, "The events writer").
"""
import contextlib
import dataclasses
import itertools
import logging
import os
import re
import socket
import sys
import tempfile
import time
from typing import Optional

from oapl_jax import sections

WRITERS = ("clu", "tensorboard")
_FILE_IDS = itertools.count()  # two writers of one process in one second get two files


@dataclasses.dataclass(frozen=True)
class ReportConfig:
  """The `report` section: how a run's metrics reach TensorBoard (metrics.jsonl is written either way)."""
  # 'clu': clu's SummaryWriter (tensorflow; where it cannot import, tensorboard's own takes over with a warning);
  # 'tensorboard': tensorboard's protos written by this package, no tensorflow: ~40x cheaper a write, 2.4 s less
  # start-up; the same events files
  events: str = sections.rule("clu", choices=WRITERS)

  def __post_init__(self):
    sections.enforce(self)


class NoEvents:
  """Stands in for the events writers where neither can import: metrics.jsonl is still written."""

  def write_scalars(self, step, scalars):
    pass

  def write_texts(self, step, texts):
    pass

  def flush(self):
    pass

  def close(self):
    pass


# What TensorFlow's C++ prints at import on any host, INFO through absl before absl::InitializeLog (which no
# environment variable silences): "WARNING: All log messages before absl::InitializeLog() ...", then
# "I0000 00:00:... port.cc] oneDNN custom operations are on ..." and "cudart_stub.cc] Could not find cuda ...".
_IMPORT_BANNER = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\)|I\d{4} \S+ +\d+ \S+:\d+\] ")


@contextlib.contextmanager
def native_banners_dropped():
  """Holds what is written to file descriptor 2 (C++ and Python alike) until the block ends, then writes it
  back without TensorFlow's import banner (_IMPORT_BANNER lines); warnings and errors pass."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as held:
    os.dup2(held.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      held.seek(0)
      lines = held.read().decode(errors="replace").splitlines(keepends=True)
      sys.stderr.write("".join(line for line in lines if not _IMPORT_BANNER.match(line)))
      sys.stderr.flush()


class TensorBoardEvents:
  """Scalars and texts as TensorBoard events, pure Python: the tensorboard package's protos and record framing
  written to a local events file by this thread. (Its EventFileWriter would import tensorflow where installed,
  for tf.io.gfile, and write from a thread of its own.) The file is flushed at most FLUSH_SECONDS after a write."""

  FLUSH_SECONDS = 10.0

  def __init__(self, workdir: str):
    # pylint: disable=import-outside-toplevel
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    from tensorboard.plugins.text import metadata as text_metadata
    from tensorboard.summary.writer.record_writer import RecordWriter
    self._event, self._summary, self._tensor, self._types, self._text = (event_pb2, summary_pb2, tensor_pb2,
                                                                         types_pb2, text_metadata)
    os.makedirs(workdir, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILE_IDS)}"
    self.path = os.path.join(workdir, name)
    self._records = RecordWriter(open(self.path, "wb"))  # pylint: disable=consider-using-with
    self._records.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
    self.flush()

  def _add(self, step, values):
    event = self._event.Event(wall_time=time.time(), step=int(step), summary=self._summary.Summary(value=values))
    self._records.write(event.SerializeToString())
    if time.monotonic() - self._flushed > self.FLUSH_SECONDS:
      self.flush()

  def write_scalars(self, step, scalars):
    self._add(step, [self._summary.Summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()])

  def write_texts(self, step, texts):
    as_text = lambda v: self._tensor.TensorProto(dtype=self._types.DT_STRING, string_val=[v.encode()])  # noqa: E731
    self._add(step, [self._summary.Summary.Value(tag=k, metadata=self._text.create_summary_metadata(k, ""),
                                                 tensor=as_text(v)) for k, v in texts.items()])

  def flush(self):
    if not self._records.closed:
      self._records.flush()
    self._flushed = time.monotonic()

  def close(self):
    if not self._records.closed:
      self._records.close()


def _tensorboards(workdir: str, why_not_clu: Optional[ImportError] = None):
  """tensorboard's own writer, or NoEvents (a warning) where it cannot import either."""
  try:
    writer = TensorBoardEvents(workdir)
  except ImportError as err:
    clu_part = f"clu's writers failed to import: {why_not_clu}; " if why_not_clu else ""
    logging.warning("no TensorBoard events (%stensorboard's: %s); metrics.jsonl is written", clu_part, err)
    return NoEvents()
  if why_not_clu is not None:
    logging.warning("clu's writers failed to import (%s): TensorBoard events through tensorboard's own writer",
                    why_not_clu)
  return writer


def open_writer(workdir: Optional[str], kind: str = "clu"):
  """The events writer `kind` (WRITERS) for `workdir` (None: one that writes nothing). clu's import tensorflow (its
  banner dropped); on a host without it (a GPU image, say) the tensorboard package's own writer takes the events,
  and without that too the run goes on with metrics.jsonl only."""
  if kind not in WRITERS:
    raise ValueError(f"events writer {kind!r}: one of {WRITERS}")
  if kind == "tensorboard":
    return _tensorboards(workdir) if workdir else NoEvents()
  try:
    with native_banners_dropped():
      from clu import metric_writers  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    return _tensorboards(workdir, err) if workdir else NoEvents()
  return metric_writers.SummaryWriter(workdir) if workdir else metric_writers.MultiWriter([])
