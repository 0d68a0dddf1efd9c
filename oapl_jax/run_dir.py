"""What a run directory records about the run that made it (its fully resolved config), and who runs in it.

    lock = run_dir.lock(workdir)                              # first: one run per directory (RunDirBusy)
    run_dir.record_config(workdir, cfg)                       # at start: config.json + config.yaml
    run_dir.check_resume(workdir, cfg, allow_changes=False)   # on a resume: raises ConfigChanged on a diff
    values = run_dir.recorded_config(workdir)                 # the run's config as a dict (typed: schema.from_run_dir)

The recorded config is the one after every command-line override, as plain JSON (tuples become lists), so
`config.json` is the single answer to "what made this run". Fields in RESUME_IGNORED are operational
(how long this invocation runs), not part of the experiment, and may change on a resume.

The lock: `<workdir>/run.lock`, held with fcntl.flock for the run's life (the OS drops it when the process
dies, however it dies) and holding {"pid", "host", "since"} of its holder. A second run is refused at once
naming them. A record left by a holder that is gone (flock free) is taken over with a warning when it names
this host; one naming another host is refused unless `force` (where flock does not reach across hosts, as
on some network filesystems, this host cannot tell whether that run still lives). A filesystem without
flock leaves the record alone to decide: same host, pid alive -> refused. A workdir this user cannot write in
is WorkdirUnwritable when the lock is taken, before anything is written. Only process 0 of a multi-process run
takes it (the workdir is shared); the others learn its answer.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import tempfile
import time
from typing import Any, Mapping, Optional

import jax
import yaml
from ml_collections import ConfigDict

CONFIG_JSON = "config.json"
CONFIG_YAML = "config.yaml"
# May differ between the first start and a resume without counting as a change of experiment.
# How many generations are kept on disk; which writer takes the TensorBoard events (a resume rebuilds them).
RESUME_IGNORED: frozenset = frozenset({"eval.save_prompts", "report.events"})
_ABSENT = "<absent>"
PRESET_UNUSED = "(unused: model.checkpoint names the model)"


class ConfigChanged(ValueError):
  """A resume whose config differs from the one the run directory recorded."""

  def __init__(self, workdir: str, differences: list[str]):
    self.differences = differences
    lines = "\n".join(f"  {d}" for d in differences)
    super().__init__(f"{workdir} was started with another config ({os.path.join(workdir, CONFIG_JSON)}); "
                     f"{len(differences)} field(s) differ (recorded -> now):\n{lines}\nResume with the recorded "
                     f"config, use a fresh workdir, or allow the change explicitly (it is then recorded).")


def plain(cfg: Any) -> Any:
  """A ConfigDict (or mapping) as JSON-ready Python: dicts, lists, str, numbers, bools, None."""
  if isinstance(cfg, ConfigDict):
    cfg = cfg.to_dict()
  return json.loads(json.dumps(cfg, default=_json_default))


def _json_default(value):
  if isinstance(value, (set, frozenset)):
    return sorted(value)
  if hasattr(value, "item"):  # numpy scalars
    return value.item()
  raise TypeError(f"config value {value!r} of type {type(value).__name__} has no JSON form")


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """{"a": {"b": 1}} -> {"a.b": 1}; an empty dict stays a leaf (so adding its first key shows)."""
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict) and value:
      out.update(flatten(value, name + "."))
    else:
      out[name] = value
  return out


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any],
                ignored: frozenset[str] = RESUME_IGNORED, defaults: Optional[Mapping[str, Any]] = None) -> list[str]:
  """'field: old -> new' for every leaf that differs (absent on one side shows as <absent>). A field the recorded
  config lacks and `current` holds at its value in `defaults` is none: it was added to the code since, and its
  default is what the recorded run did."""
  old, new = flatten(plain(recorded)), flatten(plain(current))
  added = flatten(plain(defaults)) if defaults is not None else {}
  out = []
  for key in sorted(set(old) | set(new)):
    if key in ignored:
      continue
    a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
    if a == _ABSENT and key in added and added[key] == b:
      continue
    if a != b:
      out.append(f"{key}: {_show(a)} -> {_show(b)}")
  return out


def _show(value) -> str:
  return value if value == _ABSENT else json.dumps(value)


def record_config(workdir: str, cfg: Any) -> str:
  """Writes the resolved config as config.json and config.yaml (process 0 only; each through a tmp
  file and a rename). Returns the JSON path."""
  path = os.path.join(workdir, CONFIG_JSON)
  if jax.process_index() != 0:
    return path
  os.makedirs(workdir, exist_ok=True)
  values = plain(cfg)
  for name, text in ((CONFIG_JSON, json.dumps(values, indent=2, sort_keys=True) + "\n"),
                     (CONFIG_YAML, yaml.safe_dump(for_people(values), sort_keys=True))):
    tmp = os.path.join(workdir, name + ".tmp")
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, os.path.join(workdir, name))
  return path


def for_people(values: dict) -> dict:
  """config.yaml's values: config.json's, with the model named once (a preset beside a checkpoint is unused, so it
  reads as such; config.json keeps every field, the record a resume and a study's pairing compare)."""
  model = values.get("model")
  if isinstance(model, dict) and model.get("checkpoint") and "preset" in model:
    return {**values, "model": {**model, "preset": PRESET_UNUSED}}
  return values


def recorded_config(workdir: str) -> dict | None:
  """The recorded config as a plain dict, or None when the run directory has none."""
  path = os.path.join(workdir, CONFIG_JSON)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    try:
      return json.load(f)
    except ValueError as e:
      raise ValueError(f"{path} (the config this run was started with) is not valid JSON: {e}") from None


def check_resume(workdir: str, cfg: Any, allow_changes: bool = False,
                 defaults: Optional[Mapping[str, Any]] = None) -> list[str]:
  """On a resume: compare `cfg` with the recorded config and return the differences ('field: old -> new'; a field
  added to the code since the record, at its value in `defaults`, is none).
  Any difference raises ConfigChanged unless `allow_changes`; then each is logged as a warning, the old
  config is kept as config.previous-N.json and the new one recorded. No recorded config: nothing to check."""
  recorded = recorded_config(workdir)
  if recorded is None:
    return []
  found = differences(recorded, cfg, defaults=defaults)
  if found and not allow_changes:
    raise ConfigChanged(workdir, found)
  for line in found:
    logging.warning("resuming %s with a changed config field: %s", workdir, line)
  if found:
    keep_previous(workdir)
    record_config(workdir, cfg)
  return found


def keep_previous(workdir: str) -> str | None:
  """Copies config.json to config.previous-N.json (N = 1, 2, ...: the first unused); returns its path."""
  source = os.path.join(workdir, CONFIG_JSON)
  if jax.process_index() != 0 or not os.path.exists(source):
    return None
  n = 1
  while os.path.exists(dest := os.path.join(workdir, f"config.previous-{n}.json")):
    n += 1
  with open(source) as f, open(dest, "w") as g:
    g.write(f.read())
  return dest


# ------------------------------------------------------------------------------ one run per directory
LOCK_FILE = "run.lock"
_held: dict[str, "RunLock"] = {}  # path -> the lock this process holds (a second setup in it replaces it)


class RunDirBusy(RuntimeError):
  """Another run holds the run directory (or may: see the module docstring)."""


class WorkdirUnwritable(RuntimeError):
  """The run directory cannot be created or written (read-only, another user's): found before any work."""

  def __init__(self, workdir: str, reason: str):
    super().__init__(f"cannot write in the workdir {workdir} ({reason}): make it writable for this user, or give "
                     "another workdir")


class RunLock:
  """An exclusive lock on one run directory (see the module docstring); `release()` when the run ends."""

  def __init__(self, workdir: str):
    self.path = os.path.join(os.path.abspath(workdir), LOCK_FILE)
    self._fd: Optional[int] = None

  def acquire(self, force: bool = False) -> "RunLock":
    if self.path in _held:
      _held.pop(self.path).release()
    workdir = os.path.dirname(self.path)
    try:  # a read-only or foreign workdir is one line here, before the run writes anything
      os.makedirs(workdir, exist_ok=True)
      tempfile.TemporaryFile(dir=workdir).close()  # it takes a new file (a run.lock there may open even so)
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise WorkdirUnwritable(workdir, e.strerror or str(e)) from None
    try:
      flocked = _try_flock(fd)
      holder = _read_record(fd)
      host = socket.gethostname()
      if flocked is False:
        raise RunDirBusy(f"{os.path.dirname(self.path)} is in use by {_who(holder)}: wait for that run to end, "
                         "stop it, or use another workdir")
      if holder and holder.get("host") != host and not force:
        raise RunDirBusy(f"{self.path} names {_who(holder)}, another host, which this one cannot check; if that run "
                         "is over, start again with --force_lock (or delete the file)")
      if holder and flocked is None and holder.get("host") == host and _alive(holder.get("pid")):
        raise RunDirBusy(f"{os.path.dirname(self.path)} is in use by {_who(holder)} (this filesystem has no flock: "
                         "the pid decides)")
      if holder:
        logging.warning("taking over the lock of %s on %s: that run is gone (%s)", _who(holder),
                        os.path.dirname(self.path), "forced" if holder.get("host") != host else "not running")
      _write_record(fd, {"pid": os.getpid(), "host": host, "since": time.strftime("%Y-%m-%d %H:%M:%S")})
    except BaseException:
      os.close(fd)
      raise
    self._fd = fd
    _held[self.path] = self
    return self

  def release(self) -> None:
    """Clears the record (a clean end leaves nothing to take over) and drops the lock."""
    if self._fd is None:
      return
    try:
      os.ftruncate(self._fd, 0)
    finally:
      os.close(self._fd)  # closing the descriptor drops the flock
      self._fd = None
      _held.pop(self.path, None)


def lock(workdir: str, force: bool = False) -> Optional[RunLock]:
  """The run's lock on `workdir`, taken by process 0 (None on the others), or RunDirBusy (WorkdirUnwritable on
  process 0 where it cannot write there) on every process."""
  held, refusal = None, None
  if jax.process_index() == 0:
    try:
      held = RunLock(workdir).acquire(force)
    except (RunDirBusy, WorkdirUnwritable) as e:
      refusal = e
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    if int(multihost_utils.broadcast_one_to_all(np.int32(refusal is not None))) and refusal is None:
      refusal = RunDirBusy(f"process 0 could not lock {workdir} (its log says why)")
  if refusal is not None:
    raise refusal
  return held


def _try_flock(fd: int) -> Optional[bool]:
  """True: locked; False: another holds it; None: this filesystem has no flock."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return True
  except OSError as e:
    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      return False
    if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
      logging.warning("the filesystem of this workdir has no flock (%s): the run lock is its pid/host record only", e)
      return None
    raise


def _read_record(fd: int) -> dict:
  os.lseek(fd, 0, os.SEEK_SET)
  text = os.read(fd, 4096).decode(errors="replace").strip()
  try:
    record = json.loads(text) if text else {}
  except ValueError:
    record = {"pid": "?", "host": "?", "since": f"an unreadable record: {text[:80]!r}"}
  return record if isinstance(record, dict) else {}


def _write_record(fd: int, record: dict) -> None:
  os.ftruncate(fd, 0)
  os.lseek(fd, 0, os.SEEK_SET)
  os.write(fd, (json.dumps(record) + "\n").encode())
  os.fsync(fd)


def _who(holder: dict) -> str:
  if not holder:
    return "another process (starting: no record yet)"
  return f"pid {holder.get('pid')} on host {holder.get('host')} (since {holder.get('since')})"


def _alive(pid: Any) -> bool:
  try:
    os.kill(int(pid), 0)
  except (ProcessLookupError, ValueError, TypeError):
    return False
  except PermissionError:
    return True
  return True
