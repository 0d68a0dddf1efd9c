"""Config files: 'path/to/file.py[:arg]' -> get_config(arg), with dotted command-line overrides.

    cfg = load("configs/arithmetic.py:smoke", {"loop.num_syncs": 2})
    cfg = load("~/exp/my.py", ["--config.loop.num_syncs=2", "config.seed=3"])
"""
from __future__ import annotations

import ast
import importlib.util
import os
from typing import Any, Mapping, Sequence

from ml_collections import ConfigDict


def load_module(config_spec: str):
  """(module, arg) for 'path/to/file.py[:arg]' (relative or ~ paths), loaded like ml_collections' config_flags."""
  path, _, arg = config_spec.partition(":")
  path = os.path.expanduser(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--config {config_spec}: {path} is not a file")
  spec = importlib.util.spec_from_file_location("_oapl_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module, arg


def load(config_spec: str, overrides: Mapping[str, Any] | Sequence[str] = ()) -> ConfigDict:
  """get_config(arg) of the file, with overrides: {dotted key: value} or ['--config.a.b=value', ...]."""
  module, arg = load_module(config_spec)
  cfg = module.get_config(arg) if arg else module.get_config()
  items = overrides.items() if isinstance(overrides, Mapping) else (parse_override(o) for o in overrides)
  for key, value in items:
    override(cfg, key, value)
  return cfg


def parse_override(flag: str) -> tuple[str, Any]:
  key, sep, text = flag.lstrip("-").partition("=")
  if not sep:
    raise ValueError(f"override {flag!r}: expected --config.FIELD=VALUE")
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    value = text  # a bare string
  return key, value


def override(cfg: ConfigDict, key: str, value: Any) -> None:
  """cfg[a][b] = value for key 'a.b' (or 'config.a.b'): its parents must exist and an existing field keeps its
  type; a new leaf is added (dict fields such as model.overrides take any key) and the typed run config
  (run/schema.py) rejects one no section knows, with its full path."""
  parts = key.split(".")
  if parts[0] == "config":
    parts = parts[1:]
  node = cfg
  for i, part in enumerate(parts[:-1]):
    try:
      node = node[part]
    except (KeyError, TypeError, AttributeError):
      raise ValueError(f"override {key}: {'.'.join(parts[:i + 1])} is not a field of the config") from None
  try:
    node[parts[-1]] = value
  except (TypeError, ValueError, KeyError, AttributeError) as e:
    raise ValueError(f"override {key}={value!r} does not fit the field: {e}") from None
