"""What a run directory records about the run that made it: its fully resolved config.

    run_dir.record_config(workdir, cfg)                       # at start: config.json + config.yaml
    run_dir.check_resume(workdir, cfg, allow_changes=False)   # on a resume: raises ConfigChanged on a diff
    cfg = run_dir.load_config(workdir)                        # export / eval: the config that made the run

The recorded config is the one after every command-line override, as plain JSON (tuples become lists), so
`config.json` is the single answer to "what made this run". Fields in RESUME_IGNORED are operational
(how long this invocation runs), not part of the experiment, and may change on a resume.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping

import jax
import yaml
from ml_collections import ConfigDict

CONFIG_JSON = "config.json"
CONFIG_YAML = "config.yaml"
# May differ between the first start and a resume without counting as a change of experiment.
RESUME_IGNORED: frozenset = frozenset()
_ABSENT = "<absent>"


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
                ignored: frozenset[str] = RESUME_IGNORED) -> list[str]:
  """'field: old -> new' for every leaf that differs (absent on one side shows as <absent>)."""
  old, new = flatten(plain(recorded)), flatten(plain(current))
  out = []
  for key in sorted(set(old) | set(new)):
    if key in ignored:
      continue
    a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
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
                     (CONFIG_YAML, yaml.safe_dump(values, sort_keys=True))):
    tmp = os.path.join(workdir, name + ".tmp")
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, os.path.join(workdir, name))
  return path


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


def load_config(workdir: str) -> ConfigDict:
  """The recorded config as a ConfigDict (lists stay lists: ml_collections accepts them where tuples were)."""
  values = recorded_config(workdir)
  if values is None:
    raise FileNotFoundError(f"{workdir} has no {CONFIG_JSON}: it was not started by oapl_jax.main (or by a version "
                            f"that did not record its config); pass the config explicitly (--config FILE:ARG)")
  return ConfigDict(values)


def check_resume(workdir: str, cfg: Any, allow_changes: bool = False) -> list[str]:
  """On a resume: compare `cfg` with the recorded config and return the differences ('field: old -> new').
  Any difference raises ConfigChanged unless `allow_changes`; then each is logged as a warning, the old
  config is kept as config.previous-N.json and the new one recorded. No recorded config: nothing to check."""
  recorded = recorded_config(workdir)
  if recorded is None:
    return []
  found = differences(recorded, cfg)
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
