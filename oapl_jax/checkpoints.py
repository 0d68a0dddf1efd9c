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

Health. A step is readable when, in this order (cheap to costly):
  files  meta/ and state/ exist; meta parses with every Meta field; every file in the record
         exists with its recorded size (and crc32, when checksums are on); state/_METADATA (the
         tree of saved arrays) parses;
  tree   the saved arrays' names, shapes and dtypes equal the restore target's;
  data   orbax restores every array (a missing or truncated data file fails here at the latest).
`restore()` without a step tries the newest step first and falls back to older ones. Damaged
steps newer than the one restored are moved to `<dir>/damaged/<step>-<kind>` (kept, never
deleted; orbax no longer sees them), the reason written next to them, and named in a warning. When no step is readable nothing is
moved and NoReadableCheckpoint lists every step with its reason.
"""
import contextlib
import dataclasses
import gc
import json
import logging
import os
import re
import sys
import zlib
from typing import Any, Callable, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from oapl_jax import sections

RECORD = "file_record.json"  # <step>/file_record.json: every file's size and crc32, written after commit
DAMAGED_DIR = "damaged"
REASON_SUFFIX = ".reason.txt"  # damaged/<step>-<kind>.reason.txt: why it was moved aside
TMP_MARK = ".orbax-checkpoint-tmp"  # orbax's suffix for a save in progress
_META_FILE = "metadata"  # the file orbax's JsonSave writes in the meta/ item


def absolute(path) -> epath.Path:
  """A path as a user gives it (relative, or with ~) as the absolute path orbax requires; URLs
  (gs://...) as they are. Every reader and writer of checkpoints goes through it."""
  text = str(path)
  return epath.Path(text if "://" in text else os.path.abspath(os.path.expanduser(text)))


@dataclasses.dataclass
class Meta:
  syncs_done: int  # completed windows of L trainer steps
  snapshot_version: int  # the sampler's version when the checkpoint was taken
  data_position: int  # training prompts consumed so far (by the windows done)
  seed: int
  window_steps_done: int = 0  # steps of the unfinished window before the save (0: saved at its boundary)
  drift_seen: int = 0  # 1: the last of them drifted past loop.refresh_drift, so the window ends one step later

  def to_json(self) -> dict:
    """Fields at their defaults are left out: a boundary save's meta reads as it always has."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if f.default is dataclasses.MISSING or getattr(self, f.name) != f.default}

  @classmethod
  def from_json(cls, values: Any) -> "Meta":
    """Raises ValueError naming missing, unexpected or non-integer fields."""
    if not isinstance(values, dict):
      raise ValueError(f"holds a JSON {type(values).__name__}, not an object")
    names = [f.name for f in dataclasses.fields(cls)]
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
    problems = []
    if missing := [n for n in required if n not in values]:
      problems.append(f"lacks fields {missing}")
    if unexpected := sorted(set(values) - set(names)):
      problems.append(f"has unknown fields {unexpected}")
    if not_int := [n for n in names if n in values and type(values[n]) is not int]:
      problems.append(f"has non-integer fields {not_int}")
    if problems:
      raise ValueError("; ".join(problems))
    return cls(**values)


class DamagedCheckpoint(Exception):
  """One step that cannot be restored. `kind` is a short slug, `detail` says why in plain words."""

  def __init__(self, step: int, kind: str, detail: str):
    super().__init__(f"checkpoint step {step} is damaged: {detail}")
    self.step, self.kind, self.detail = step, kind, detail


class NoReadableCheckpoint(RuntimeError):
  """Every step of a checkpoint directory is damaged (or does not fit the target)."""


class SaveFailed(RuntimeError):
  """A checkpoint could not be written; the message is one line: the step, the path and the cause."""

  def __init__(self, step: int, path: str, cause: str):
    hint = " (is the disk full?)" if re.search(r"too large|No space|quota", cause, re.I) else ""
    super().__init__(f"checkpoint {step} could not be written to {path}: {cause}{hint}")
    self.step, self.path, self.cause = step, path, cause


def _chain_text(e: BaseException) -> str:
  """The messages of `e` and the errors it came from (orbax wraps tensorstore's), one per line."""
  chain, seen = [], e
  while seen is not None and len(chain) < 10:
    chain.append(str(seen))
    seen = seen.__cause__ or seen.__context__
  return "\n".join(chain)


def plain_write_error(e: BaseException) -> str:
  """The OS's reason (`File too large`, `No space left on device`) from an orbax/tensorstore write error."""
  text = _chain_text(e)
  if m := re.search(r"([A-Z][^:\[\]\n]*?) \[os_error_code='?\d+'?\]", text):
    return m.group(1).strip()
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  return _first_line(e)


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



# ------------------------------------------------------------------------------ files
def list_files(directory: epath.Path) -> dict[str, int]:
  """Relative path -> size in bytes of every file under `directory`."""
  sizes, pending = {}, [directory]
  while pending:
    for path in pending.pop().iterdir():
      if path.is_dir():
        pending.append(path)
      else:
        sizes[str(path.relative_to(directory))] = path.stat().length
  return sizes


def _crc32(path: epath.Path) -> int:
  crc = 0
  with path.open("rb") as f:
    while chunk := f.read(1 << 24):
      crc = zlib.crc32(chunk, crc)
  return crc


def write_record(step_dir: epath.Path, checksums: bool = True) -> None:
  """Writes the file record of a committed step (a tmp file, then a rename: never half-written)."""
  files = {name: {"bytes": size, **({"crc32": _crc32(step_dir / name)} if checksums else {})}
           for name, size in list_files(step_dir).items() if not name.startswith(RECORD)}
  tmp = step_dir / (RECORD + ".tmp")
  tmp.write_text(json.dumps({"files": files}, sort_keys=True))
  tmp.replace(step_dir / RECORD)


def _check_record(step_dir: epath.Path, step: int, checksums: bool) -> None:
  record = step_dir / RECORD
  if not record.exists():
    return  # saved by an older version, or killed between commit and record: the data check decides
  try:
    recorded = {str(name): (int(entry["bytes"]), entry.get("crc32"))
                for name, entry in json.loads(record.read_text())["files"].items()}
  except (ValueError, KeyError, TypeError, AttributeError):
    raise DamagedCheckpoint(step, "bad-record", f"{RECORD} (the file sizes and checksums taken at save) is unreadable")
  present = list_files(step_dir)
  for name, (size, crc) in sorted(recorded.items()):
    if name not in present:
      raise DamagedCheckpoint(step, "missing-file", f"file {name} ({size} bytes when saved) is missing")
    if present[name] != size:
      kind = "truncated-file" if present[name] < size else "grown-file"
      raise DamagedCheckpoint(step, kind, f"file {name} has {present[name]} bytes; {size} were saved")
  for name, (size, crc) in sorted(recorded.items()) if checksums else ():
    if crc is not None and _crc32(step_dir / name) != crc:
      raise DamagedCheckpoint(step, "corrupt-file", f"file {name} has its saved size but not its saved content (crc32)")


def read_meta(step_dir: epath.Path, step: int) -> Meta:
  item = step_dir / "meta"
  if not item.is_dir():
    raise DamagedCheckpoint(step, "no-meta", "the meta/ item directory (run position, seed) is missing")
  if not (item / _META_FILE).exists():
    raise DamagedCheckpoint(step, "no-meta", f"meta/{_META_FILE} (run position, seed) is missing")
  try:
    values = json.loads((item / _META_FILE).read_text())
  except ValueError as e:  # includes UnicodeDecodeError
    raise DamagedCheckpoint(step, "bad-meta", f"meta/{_META_FILE} is not valid JSON ({e})")
  try:
    return Meta.from_json(values)
  except ValueError as e:
    raise DamagedCheckpoint(step, "bad-meta", f"meta/{_META_FILE} {e}")


def _name(path) -> str:
  return ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _check_state_layout(step_dir: epath.Path, step: int) -> None:
  item = step_dir / "state"
  if not item.is_dir():
    raise DamagedCheckpoint(step, "no-state", "the state/ item directory (parameters, optimizer state) is missing")
  if not (item / "_METADATA").exists():
    raise DamagedCheckpoint(step, "no-tree-metadata", "state/_METADATA (the list of saved arrays) is missing")
  if any(p.name.startswith("ocdbt.process_") for p in item.iterdir()) and not (item / "manifest.ocdbt").exists():
    raise DamagedCheckpoint(step, "no-index", "state/manifest.ocdbt (the index of the array data) is missing")


def _read_saved_tree(item: epath.Path, step: int) -> dict[str, tuple[tuple[int, ...], str]]:
  try:
    tree = ocp.StandardCheckpointHandler().metadata(item).tree
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {_name(path): (tuple(m.shape), np.dtype(m.dtype).name) for path, m in leaves}
  except Exception as e:  # orbax raises many kinds for a malformed file
    raise DamagedCheckpoint(step, "bad-tree-metadata", f"the list of saved arrays cannot be read: {plain_read_error(e)}")


def check_files(step_dir: epath.Path, step: int, checksums: bool = False
                ) -> tuple[Meta, dict[str, tuple[tuple[int, ...], str]]]:
  """(meta, saved array name -> (shape, dtype)), or raises DamagedCheckpoint. Without `checksums`
  no array data is read (cheap); with them every recorded file is read once."""
  step_dir = absolute(step_dir)
  if not step_dir.is_dir():
    raise DamagedCheckpoint(step, "missing", f"{step_dir} does not exist")
  meta = read_meta(step_dir, step)
  _check_state_layout(step_dir, step)
  _check_record(step_dir, step, checksums)
  return meta, _read_saved_tree(step_dir / "state", step)


def check_tree(saved: dict, abstract_state: Any, step: int) -> None:
  """Raises unless the saved arrays' names, shapes and dtypes are exactly the target's."""
  leaves = jax.tree_util.tree_flatten_with_path(abstract_state)[0]
  want = {_name(path): (tuple(x.shape), np.dtype(x.dtype).name) for path, x in leaves}
  show = lambda names: ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
  parts = []
  if missing := sorted(set(want) - set(saved)):
    parts.append(f"{len(missing)} arrays of the target are not saved ({show(missing)})")
  if extra := sorted(set(saved) - set(want)):
    parts.append(f"{len(extra)} saved arrays are not in the target ({show(extra)})")
  if differ := [n for n in sorted(set(want) & set(saved)) if want[n] != saved[n]]:
    parts.append("shape/dtype differ for " + show([f"{n} (saved {saved[n][1]}{list(saved[n][0])}, "
                                                   f"target {want[n][1]}{list(want[n][0])})" for n in differ]))
  if parts:
    raise DamagedCheckpoint(step, "tree-mismatch", "the saved state does not match the state being built: " + "; ".join(parts))


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return (text[0][:200] if text else type(e).__name__)


def plain_read_error(e: BaseException) -> str:
  """A one-line reason from a tensorstore/orbax read error (their messages run to pages)."""
  text = _chain_text(e)
  key = re.search(r'Error reading "([^"/]+)[^"]*" in OCDBT', text)
  what = f"array {key.group(1)}" if key else "the array data"
  if m := re.search(r"byte range \[\d+, (\d+)\) is not valid for value of size (\d+)", text):
    return f"{what} cannot be read: a data file holds {m.group(2)} bytes where the index needs {m.group(1)} (truncated)"
  if m := re.search(r"Truncated Zstd-compressed stream|NOT_FOUND", text):
    return f"{what} cannot be read: a data file is missing or empty ({m.group(0)})"
  code = re.search(r"\b(OUT_OF_RANGE|DATA_LOSS|FAILED_PRECONDITION|INVALID_ARGUMENT|UNKNOWN)\b", text)
  detail = next((line for line in text.splitlines() if code and code.group(1) in line), _first_line(e))
  return f"{what} cannot be read ({detail[:240]})"


class _AbandonedReads(logging.Filter):
  """A failed orbax read abandons its sibling read coroutines; one finalized after `_read_arrays` has
  collected them makes asyncio log "Task exception was never retrieved" with a TensorStore traceback.
  Which coroutine is finalized varies (`async_deserialize`, `_read_array_index_and_device_put`, ...), but
  each is defined in orbax's serialization module. That failure is already reported as a
  DamagedCheckpoint: drop the duplicate, and only that."""

  _ORBAX_READ = re.compile(r"coro=<(async_deserialize|_read_\w+)\(\)|orbax/checkpoint/_src/serialization/")

  def filter(self, record):
    message = record.getMessage()
    return not (message.startswith("Task exception was never retrieved") and self._ORBAX_READ.search(message))


logging.getLogger("asyncio").addFilter(_AbandonedReads())


def _read_arrays(step: int, read: Callable[[], Any]) -> Any:
  """Runs an orbax read; a failure becomes DamagedCheckpoint("unreadable-data") with a plain reason
  (running out of memory is not damage and propagates). A failed read abandons its sibling read
  coroutines; they are collected here, quietly, instead of printing GeneratorExit tracebacks later."""
  try:
    return read()
  except Exception as e:
    if isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in str(e):
      raise
    reason = plain_read_error(e)
  hook, sys.unraisablehook = sys.unraisablehook, lambda _: None
  try:
    gc.collect()
  finally:
    sys.unraisablehook = hook
  raise DamagedCheckpoint(step, "unreadable-data", reason)


def restore_to_host(step_dir: epath.Path, step: int) -> tuple[Any, Meta]:
  """Reads a step's arrays into host numpy without a model (the deep health check; the whole
  step is in host memory at once)."""
  step_dir = absolute(step_dir)
  meta, _ = check_files(step_dir, step, checksums=True)
  tree = ocp.StandardCheckpointHandler().metadata(step_dir / "state").tree
  cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=cpu), tree)
  # the synchronous Checkpointer: a failed read leaves no callbacks behind on a closed event loop
  restored = _read_arrays(step, lambda: ocp.Checkpointer(ocp.StandardCheckpointHandler()).restore(
      step_dir / "state", args=ocp.args.StandardRestore(target)))
  return jax.tree.map(np.asarray, restored), meta


def step_dirs(directory: epath.Path) -> tuple[dict[int, epath.Path], list[epath.Path]]:
  """(step -> committed step directory, interrupted saves' tmp directories) of a checkpoint dir."""
  steps, interrupted, directory = {}, [], absolute(directory)
  for path in directory.iterdir() if directory.is_dir() else ():
    if TMP_MARK in path.name:
      interrupted.append(path)
    elif path.name.isdigit() and path.is_dir():
      steps[int(path.name)] = path
  return dict(sorted(steps.items())), sorted(interrupted)


# ------------------------------------------------------------------------------ the checkpointer
class Checkpointer:
  """ocp.CheckpointManager with a (state, meta) item pair, file records, and a verified restore."""

  def __init__(self, directory: str, max_to_keep: int = 3, checksums: bool = True):
    """`checksums`: crc32 every file once its save has committed (at the next save or close, on
    the caller's thread) and check them before a restore; each costs one read of the checkpoint."""
    self.directory = str(absolute(directory))
    self.checksums = checksums
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        item_names=("state", "meta", "sampler"))
    self._unrecorded: list[int] = []  # saves whose file record is not written yet
    self._failed: Optional[SaveFailed] = None  # once a save failed, nothing more is written
    _ClosedLoopCallbacks.install()

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, meta: Meta, sampler: Any = None) -> None:
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
        write_record(step_dir, self.checksums)
    self._unrecorded = []

  def restore_sampler(self, step: int, abstract_snapshot: Any) -> Any:
    """The sampler snapshot a mid-window save holds, into `abstract_snapshot`'s shapes and shardings."""
    if not (epath.Path(self.directory) / str(step) / "sampler").is_dir():
      raise DamagedCheckpoint(step, "no-sampler", "the sampler/ item (the window's snapshot) of a mid-window save "
                                                  "is missing")
    return _read_arrays(step, lambda: self.manager.restore(step, args=ocp.args.Composite(
        sampler=ocp.args.StandardRestore(abstract_snapshot))))["sampler"]

  def _restore_step(self, step: int, abstract_state: Any) -> tuple[Any, Meta]:
    step_dir = epath.Path(self.directory) / str(step)
    meta, saved = check_files(step_dir, step, self.checksums)
    check_tree(saved, abstract_state, step)
    restored = _read_arrays(step, lambda: self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore())))
    return restored["state"], meta

  def restore(self, abstract_state: Any, step: Optional[int] = None) -> tuple[Any, Meta]:
    """`abstract_state`: jax.ShapeDtypeStruct leaves carrying the target shardings.

    With `step`, restores exactly that step or raises DamagedCheckpoint. Without, the newest
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
      except DamagedCheckpoint as d:
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

  def _move_aside(self, damage: DamagedCheckpoint) -> epath.Path:
    parent = epath.Path(self.directory) / DAMAGED_DIR
    parent.mkdir(parents=True, exist_ok=True)
    dest, n = parent / f"{damage.step}-{damage.kind}", 1
    while dest.exists():
      n += 1
      dest = parent / f"{damage.step}-{damage.kind}-{n}"
    (epath.Path(self.directory) / str(damage.step)).rename(dest)
    epath.Path(f"{dest}{REASON_SUFFIX}").write_text(damage.detail + "\n")
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
    writer.save(absolute(run_dir) / BASE_DIR, params, force=True)


def restore_base(run_dir: str, abstract: Any) -> Any:
  """The frozen base into `abstract`'s shapes, dtypes and shardings (jax.ShapeDtypeStruct leaves)."""
  path = absolute(run_dir) / BASE_DIR
  if not (path / "_METADATA").exists():
    raise FileNotFoundError(f"{path}: this LoRA run's frozen base params are missing (written when the run "
                            "started); without them its adapter checkpoints cannot be used")
  check_tree(_read_saved_tree(path, -1), abstract, -1)
  return _read_arrays(-1, lambda: ocp.Checkpointer(ocp.StandardCheckpointHandler()).restore(
      path, args=ocp.args.StandardRestore(abstract)))


def abstract_like(state: Any) -> Any:
  """ShapeDtypeStructs (with shardings) of a live state: the restore target."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """The `checkpoint` section: save every `every_syncs` windows (and at the end), keep the newest max_to_keep."""
  every_syncs: int = sections.rule(1, low=1)
  max_to_keep: int = sections.rule(3, low=1)

  def __post_init__(self):
    sections.enforce(self)
