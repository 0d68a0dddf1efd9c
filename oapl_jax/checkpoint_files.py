"""A checkpoint directory's files and their health, read without a Checkpointer or a model.

Layout (written by checkpoints.Checkpointer): `<dir>/<step>/{state,meta[,sampler]}/`, `<step>/file_record.json`
(every file's size and crc32, written once the save has committed), interrupted saves as
`<step>.orbax-checkpoint-tmp`, and steps a restore moved aside under `<dir>/damaged/`.

Health. A step is readable when, in this order (cheap to costly):
  files  meta/ and state/ exist; meta parses with every Meta field; every file in the record
         exists with its recorded size (and crc32, when checksums are on); state/_METADATA (the
         tree of saved arrays) parses;
  tree   the saved arrays' names, shapes and dtypes equal the restore target's;
  data   orbax restores every array (a missing or truncated data file fails here at the latest).
`rows(resolve(path))` lists a directory's steps with their health (the CLI: oapl-checkpoints, apps/checkpoints.py):
committed steps (deep=True also checks every crc32 and restores each step's arrays to host numpy), then steps a
restore moved aside (damaged/) and interrupted saves (orbax tmp directories).
"""
import dataclasses
import gc
import json
import logging
import os
import re
import sys
import traceback
import zlib
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

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



def chain_text(e: BaseException) -> str:
  """The messages of `e` and the errors it came from (orbax wraps tensorstore's), one per line."""
  chain, seen = [], e
  while seen is not None and len(chain) < 10:
    chain.append(str(seen))
    seen = seen.__cause__ or seen.__context__
  return "\n".join(chain)



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


def read_saved_tree(item: epath.Path, step: int) -> dict[str, tuple[tuple[int, ...], str]]:
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
  return meta, read_saved_tree(step_dir / "state", step)


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


def first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return (text[0][:200] if text else type(e).__name__)


def plain_read_error(e: BaseException) -> str:
  """A one-line reason from a tensorstore/orbax read error (their messages run to pages)."""
  text = chain_text(e)
  key = re.search(r'Error reading "([^"/]+)[^"]*" in OCDBT', text)
  what = f"array {key.group(1)}" if key else "the array data"
  if m := re.search(r"byte range \[\d+, (\d+)\) is not valid for value of size (\d+)", text):
    return f"{what} cannot be read: a data file holds {m.group(2)} bytes where the index needs {m.group(1)} (truncated)"
  if m := re.search(r"Truncated Zstd-compressed stream|NOT_FOUND", text):
    return f"{what} cannot be read: a data file is missing or empty ({m.group(0)})"
  code = re.search(r"\b(OUT_OF_RANGE|DATA_LOSS|FAILED_PRECONDITION|INVALID_ARGUMENT|UNKNOWN)\b", text)
  detail = next((line for line in text.splitlines() if code and code.group(1) in line), first_line(e))
  return f"{what} cannot be read ({detail[:240]})"


class _AbandonedReads(logging.Filter):
  """A failed orbax read abandons its sibling read coroutines; one finalized after `read_arrays` has
  collected them makes asyncio log "Task (or _GatheringFuture) exception was never retrieved" with a TensorStore
  traceback. Which coroutine is finalized varies (`async_deserialize`, `_read_array_index_and_device_put`, ...),
  but each is defined in orbax's serialization module (named in the message or in the logged traceback). That
  failure is already reported as a DamagedCheckpoint: drop the duplicate, and only that."""

  _NEVER_RETRIEVED = re.compile(r"(Task|_GatheringFuture) exception was never retrieved")
  _ORBAX_READ = re.compile(r"coro=<(async_deserialize|_read_\w+)\(\)|orbax/checkpoint/_src/serialization/")

  def filter(self, record):
    message = record.getMessage()
    if not self._NEVER_RETRIEVED.match(message):
      return True
    logged = message + ("".join(traceback.format_exception(*record.exc_info)) if record.exc_info else "")
    return not self._ORBAX_READ.search(logged)


logging.getLogger("asyncio").addFilter(_AbandonedReads())


def read_arrays(step: int, read: Callable[[], Any]) -> Any:
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
  restored = read_arrays(step, lambda: ocp.Checkpointer(ocp.StandardCheckpointHandler()).restore(
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


# ------------------------------------------------------------------------------ a directory's listing
def resolve(path: str) -> epath.Path:
  """A run dir (holding checkpoints/) or a checkpoint dir; raises FileNotFoundError otherwise."""
  given = absolute(path)
  for candidate in (given / "checkpoints", given):
    steps, interrupted = step_dirs(candidate)
    if steps or interrupted or (candidate / DAMAGED_DIR).is_dir():
      return candidate
  raise FileNotFoundError(f"{path} holds no checkpoints (looked for step directories in {given / 'checkpoints'} and {given})")


def human_size(num_bytes: int) -> str:
  for unit in ("B", "KiB", "MiB", "GiB"):
    if num_bytes < 1024 or unit == "GiB":
      return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
    num_bytes /= 1024
  raise AssertionError("unreachable")


def _meta_cells(step_dir: epath.Path, step: int) -> dict:
  try:
    return {k: str(v) for k, v in read_meta(step_dir, step).to_json().items()}
  except DamagedCheckpoint:
    return {}


def _step_row(step: int, step_dir: epath.Path, deep: bool) -> dict:
  row = {"step": str(step), "size": human_size(sum(list_files(step_dir).values())), "ok": False,
         **_meta_cells(step_dir, step)}
  try:
    _, saved = check_files(step_dir, step)
    if deep:
      tree, _ = restore_to_host(step_dir, step)
      arrays = jax.tree.leaves(tree)
      row["health"] = f"ok (read {len(arrays)} arrays, {human_size(sum(a.nbytes for a in arrays))})"
    elif (step_dir / RECORD).exists():
      row["health"] = f"ok ({len(saved)} arrays, file sizes as saved; --deep checks contents)"
    else:
      row["health"] = f"ok? ({len(saved)} arrays; no file record, data unchecked: use --deep)"
    row["ok"] = True
  except DamagedCheckpoint as d:
    row["health"] = f"DAMAGED: {d.detail}"
  return row


def rows(directory: epath.Path, deep: bool = False) -> list[dict]:
  """One dict per committed step, moved-aside step and interrupted save (string values, plus `ok`)."""
  steps, interrupted = step_dirs(directory)
  table = [_step_row(step, path, deep) for step, path in steps.items()]
  aside = directory / DAMAGED_DIR
  for path in sorted(aside.iterdir()) if aside.is_dir() else ():
    if path.is_dir():
      reason = epath.Path(f"{path}{REASON_SUFFIX}")
      why = reason.read_text().strip() if reason.exists() else path.name
      step = path.name.split("-")[0]
      table.append({"step": step, "size": human_size(sum(list_files(path).values())),
                    "health": f"moved aside to {DAMAGED_DIR}/{path.name}: {why}", "ok": True,
                    **(_meta_cells(path, int(step)) if step.isdigit() else {})})
  for path in interrupted:
    table.append({"step": path.name.split(".")[0], "size": human_size(sum(list_files(path).values())),
                  "health": f"interrupted save {path.name} (never committed; ignored)", "ok": True})
  return table
