"""Everything needed to resume an OAPL run, with orbax's CheckpointManager.

A checkpoint is taken at a sync boundary (right before the sampler refresh), where the rollout
buffer is empty by construction, so it holds:
  state  the TrainState (step, params, optimizer state), restored straight into its shardings;
  meta   JSON: syncs done, the sampler snapshot version, the data position (prompts consumed)
         and the run seed from which every rng is derived (trainer: fold_in(seed, step);
         sampler: (seed, version, chunk)).
A run stopped by a signal (rl/preemption.py) saves inside its window instead: meta then also counts the
window's steps done (`window_steps_done` > 0), and the step holds a third item,
  sampler the sampler's snapshot (decode layout), from which the window's rollouts are regenerated
         exactly (their seeds are (seed, version, chunk)), so the resumed run equals an uninterrupted one.

Restore order: build the TrainState's abstract shapes and shardings -> restore `state` into them
-> read `meta` -> set the sampler's snapshot version -> refresh the sampler from the restored
params -> reset the buffer to that version -> continue with the next sync window. Inside a window
(window_steps_done > 0) the refresh is replaced by `restore_sampler` into the sampler's shardings,
installed at the saved version, and the window continues at its next step.

A save that fails (disk full, a file-size limit) raises SaveFailed, one line naming the step, the path
and the cause: at the next `poll` (the loop polls every step) or save at the latest, never later.

Saves are orbax's: written into `<step>.orbax-checkpoint-tmp`, renamed to `<step>` once whole, so
a killed save leaves only a tmp directory that orbax ignores (and replaces when it saves that step
again). Once a save has committed, `<step>/file_record.json` records every file's size and crc32.

Health (what makes a step readable, checked cheap to costly, and the file record): checkpoint_files.py.
`restore()` without a step tries the newest step first and falls back to older ones. Damaged
steps newer than the one restored are moved to `<dir>/damaged/<step>-<kind>` (kept, never
deleted; orbax no longer sees them), the reason written next to them, and named in a warning. When no step is readable nothing is
moved and NoReadableCheckpoint lists every step with its reason.
"""
import contextlib
import dataclasses
import logging
import re
import sys
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp
from etils import epath

from oapl_jax import sections
from oapl_jax import checkpoint_files


class NoReadableCheckpoint(RuntimeError):
  """Every step of a checkpoint directory is damaged (or does not fit the target)."""


class SaveFailed(RuntimeError):
  """A checkpoint could not be written; the message is one line: the step, the path and the cause."""

  def __init__(self, step: int, path: str, cause: str):
    hint = " (is the disk full?)" if re.search(r"too large|No space|quota", cause, re.I) else ""
    super().__init__(f"checkpoint {step} could not be written to {path}: {cause}{hint}")
    self.step, self.path, self.cause = step, path, cause


def plain_write_error(e: BaseException) -> str:
  """The OS's reason (`File too large`, `No space left on device`) from an orbax/tensorstore write error."""
  text = checkpoint_files.chain_text(e)
  if m := re.search(r"([A-Z][^:\[\]\n]*?) \[os_error_code='?\d+'?\]", text):
    return m.group(1).strip()
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  return checkpoint_files.first_line(e)


class _ReportedSaveErrors(logging.Filter):
  """orbax logs a failed background save as several ERROR tracebacks from its threads; the Checkpointer
  raises it as one SaveFailed line instead. Drops those records, and only those."""

  _ORBAX_SAVE = re.compile(r"_SignalingThread\.run\(\) raised an exception|Failed to run \d+ Handler Commit operations|"
                           r"in background save thread|Save Finalize thread \(\w+\) failed")
  _ABANDONED_WRITE = re.compile(r"^(_GatheringFuture|Task) exception was never retrieved.*Error writing .* in OCDBT", re.S)

  def filter(self, record):
    message = record.getMessage()
    return not (record.levelno >= logging.ERROR and (self._ORBAX_SAVE.search(message) or
                                                     self._ABANDONED_WRITE.search(message)))


logging.getLogger("absl").addFilter(_ReportedSaveErrors())
logging.getLogger("asyncio").addFilter(_ReportedSaveErrors())


class _ClosedLoopCallbacks:
  """When a write fails, orbax's save thread ends its asyncio loop while tensorstore still has writes in
  flight; each of them then calls `loop.call_soon_threadsafe` from C on the closed loop, and Python reports
  the RuntimeError('Event loop is closed') through sys.unraisablehook (no object: a bare traceback), one to
  dozens of times. The failed save itself is raised as one SaveFailed line, so this hook drops exactly those
  reports (a RuntimeError with that message and no object) and hands every other one to the hook it wraps.
  Installed once, process-wide, on the first Checkpointer; `dropped` counts what it dropped."""

  def __init__(self, wrapped):
    self.wrapped, self.dropped = wrapped, 0

  def __call__(self, unraisable) -> None:
    if (unraisable.exc_type is RuntimeError and unraisable.object is None
        and str(unraisable.exc_value) == "Event loop is closed"):
      self.dropped += 1
      return
    self.wrapped(unraisable)

  @classmethod
  def install(cls) -> "_ClosedLoopCallbacks":
    if not isinstance(sys.unraisablehook, cls):
      sys.unraisablehook = cls(sys.unraisablehook)
    return sys.unraisablehook



# ------------------------------------------------------------------------------ the checkpointer
class Checkpointer:
  """ocp.CheckpointManager with a (state, meta) item pair, file records, and a verified restore."""

  def __init__(self, directory: str, max_to_keep: int = 3, checksums: bool = True):
    """`checksums`: crc32 every file once its save has committed (at the next save or close, on
    the caller's thread) and check them before a restore; each costs one read of the checkpoint."""
    self.directory = str(checkpoint_files.absolute(directory))
    self.checksums = checksums
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        item_names=("state", "meta", "sampler"))
    self._unrecorded: list[int] = []  # saves whose file record is not written yet
    self._failed: Optional[SaveFailed] = None  # once a save failed, nothing more is written
    _ClosedLoopCallbacks.install()

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, meta: checkpoint_files.Meta, sampler: Any = None) -> None:
    """Starts an async save of `state` and `meta` (and, inside a window, the sampler's snapshot); raises
    SaveFailed for this save or an earlier one that failed."""
    self._record_finished()  # orbax waits for the previous save here anyway
    items = dict(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta.to_json()))
    if sampler is not None:
      items["sampler"] = ocp.args.StandardSave(sampler)
    with self._failing_as(step):
      self.manager.save(step, args=ocp.args.Composite(**items))
    self._unrecorded.append(step)

  def poll(self) -> None:
    """Raises SaveFailed if a background save has failed by now (cheap: never waits)."""
    if self._unrecorded and not self._failed and not self.manager.is_saving_in_progress():
      self._record_finished()  # finished: no wait

  @contextlib.contextmanager
  def _failing_as(self, step: int):
    """Any error inside is SaveFailed for `step`; once one failed, every later save or poll raises it again."""
    if self._failed:
      raise self._failed
    try:
      yield
    except SaveFailed:
      raise
    except Exception as e:  # orbax and tensorstore raise many kinds for a failed write
      self._failed = SaveFailed(step, f"{self.directory}/{step}", plain_write_error(e))
      raise self._failed from None

  def _record_finished(self) -> None:
    if self._unrecorded:
      with self._failing_as(self._unrecorded[-1]):
        self.manager.wait_until_finished()
    for step in self._unrecorded:
      step_dir = epath.Path(self.directory) / str(step)
      if jax.process_index() == 0 and step_dir.is_dir():  # absent if max_to_keep already dropped it
        checkpoint_files.write_record(step_dir, self.checksums)
    self._unrecorded = []

  def restore_sampler(self, step: int, abstract_snapshot: Any) -> Any:
    """The sampler snapshot a mid-window save holds, into `abstract_snapshot`'s shapes and shardings."""
    if not (epath.Path(self.directory) / str(step) / "sampler").is_dir():
      raise checkpoint_files.DamagedCheckpoint(
          step, "no-sampler", "the sampler/ item (the window's snapshot) of a mid-window save is missing")
    return checkpoint_files.read_arrays(step, lambda: self.manager.restore(step, args=ocp.args.Composite(
        sampler=ocp.args.StandardRestore(abstract_snapshot))))["sampler"]

  def _restore_step(self, step: int, abstract_state: Any) -> tuple[Any, checkpoint_files.Meta]:
    step_dir = epath.Path(self.directory) / str(step)
    meta, saved = checkpoint_files.check_files(step_dir, step, self.checksums)
    checkpoint_files.check_tree(saved, abstract_state, step)
    restored = checkpoint_files.read_arrays(step, lambda: self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore())))
    return restored["state"], meta

  def restore(self, abstract_state: Any, step: Optional[int] = None) -> tuple[Any, checkpoint_files.Meta]:
    """`abstract_state`: jax.ShapeDtypeStruct leaves carrying the target shardings.

    With `step`, restores exactly that step or raises checkpoint_files.DamagedCheckpoint. Without, the newest
    readable step; damaged newer steps are moved aside to <dir>/damaged/ with a warning each.
    """
    if step is not None:
      return self._restore_step(step, abstract_state)
    steps = sorted(self.manager.all_steps(), reverse=True)
    if not steps:
      raise NoReadableCheckpoint(f"no checkpoint in {self.directory}")
    damaged = []
    for candidate in steps:
      try:
        result = self._restore_step(candidate, abstract_state)
      except checkpoint_files.DamagedCheckpoint as d:
        logging.warning("%s", d)
        damaged.append(d)
        continue
      for d in damaged:
        if jax.process_index() == 0:
          logging.warning("checkpoint step %d (%s) moved aside to %s", d.step, d.kind, self._move_aside(d))
      if damaged:
        ocp.multihost.sync_global_processes("oapl_checkpoints_moved_aside")
        self.manager.reload()
        logging.warning("continuing from step %d, the newest readable checkpoint in %s", candidate, self.directory)
      return result
    lines = "\n".join(f"  step {d.step}: {d.detail}" for d in damaged)
    raise NoReadableCheckpoint(
        f"no checkpoint in {self.directory} can be restored:\n{lines}\nNothing was moved or deleted. Repair or move "
        f"these steps away to start afresh in this workdir, or check that the config builds the state they hold.")

  def _move_aside(self, damage: checkpoint_files.DamagedCheckpoint) -> epath.Path:
    parent = epath.Path(self.directory) / checkpoint_files.DAMAGED_DIR
    parent.mkdir(parents=True, exist_ok=True)
    dest, n = parent / f"{damage.step}-{damage.kind}", 1
    while dest.exists():
      n += 1
      dest = parent / f"{damage.step}-{damage.kind}-{n}"
    (epath.Path(self.directory) / str(damage.step)).rename(dest)
    epath.Path(f"{dest}{checkpoint_files.REASON_SUFFIX}").write_text(damage.detail + "\n")
    return dest

  def wait(self) -> None:
    self._record_finished()

  def close(self) -> None:
    """Waits for the last save (SaveFailed if it failed) and releases the manager either way."""
    try:
      if not self._failed:
        self._record_finished()
    finally:
      try:
        self.manager.close()
      except Exception:  # pylint: disable=broad-except
        if not self._failed:
          raise


# ------------------------------------------------------------------------------ a LoRA run's frozen base
BASE_DIR = "lora_base"  # RUN/lora_base: the base params a LoRA run's adapters apply to, written once


def save_base(run_dir: str, params: Any) -> None:
  """Writes a LoRA run's frozen base (after any warm start) once, before its first step; its step
  checkpoints then hold only the adapters. A restart before the first checkpoint writes it again."""
  with ocp.StandardCheckpointer() as writer:
    writer.save(checkpoint_files.absolute(run_dir) / BASE_DIR, params, force=True)


def restore_base(run_dir: str, abstract: Any) -> Any:
  """The frozen base into `abstract`'s shapes, dtypes and shardings (jax.ShapeDtypeStruct leaves)."""
  path = checkpoint_files.absolute(run_dir) / BASE_DIR
  if not (path / "_METADATA").exists():
    raise FileNotFoundError(f"{path}: this LoRA run's frozen base params are missing (written when the run "
                            "started); without them its adapter checkpoints cannot be used")
  checkpoint_files.check_tree(checkpoint_files.read_saved_tree(path, -1), abstract, -1)
  return checkpoint_files.read_arrays(-1, lambda: ocp.Checkpointer(ocp.StandardCheckpointHandler()).restore(
      path, args=ocp.args.StandardRestore(abstract)))


def abstract_like(state: Any) -> Any:
  """ShapeDtypeStructs (with shardings) of a live state: the restore target."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """The `checkpoint` section: when the loop saves and how many saves it keeps."""
  every_syncs: int = sections.rule(1, low=1)  # save every this many windows (and at the end)
  max_to_keep: int = sections.rule(3, low=1)  # the newest this many checkpoints are kept

  def __post_init__(self):
    sections.enforce(self)
