"""Typed config sections: each package owns a frozen dataclass for its section of the run config, with
its defaults and its per-field rules declared once, on the fields.

    @dataclasses.dataclass(frozen=True)
    class LoopConfig:
      sync_every: int = sections.rule(50, low=1)
      def __post_init__(self):
        sections.enforce(self)            # direct construction obeys the same rules

    loop = sections.build(LoopConfig, cfg["loop"], "loop")   # ConfigDict/dict -> LoopConfig, or ConfigError

`build` reports every bad field at once with its full dotted path ("loop.sync_every=-1: must be >= 1"),
rejects unknown keys, accepts a list where the type says tuple (the command line gives lists), and
starts nested sections from the parent's default (the warm start's optimizer differs from the
trainer's). Relations between the fields of one section stay in its __post_init__ (a ValueError
there is reported at the section's path). This module imports nothing from the project.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from typing import Any, Callable, Mapping, Optional, Sequence

MISSING = object()


class ConfigError(ValueError):
  """Every problem found in a config, one per line, each naming its field."""

  def __init__(self, problems: Sequence[str]):
    self.problems = list(dict.fromkeys(problems))  # a field read twice is reported once
    super().__init__(f"{len(self.problems)} problem(s) in the config:\n  " + "\n  ".join(self.problems))


class Problems:
  """Collects 'field=value: why' lines."""

  def __init__(self):
    self.errors: list[str] = []
    self.warnings: list[str] = []

  def add(self, path: str, value: Any, why: str) -> None:
    if value is MISSING:
      self.errors.append(f"{path}: {why}")
    else:
      shown = repr(tuple(value) if isinstance(value, list) else value)[:80]  # a command-line list as a tuple
      self.errors.append(f"{path}={shown}: {why}")

  def raise_if_any(self) -> None:
    if self.errors:
      raise ConfigError(self.errors)


@dataclasses.dataclass(frozen=True)
class Rule:
  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False
  high_open: bool = False
  choices: Optional[tuple] = None
  nonempty: bool = False  # tuples: at least one item

  def bounds(self) -> str:
    if self.high is None:
      return f"{'>' if self.low_open else '>='} {self.low}"
    return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"

  def admits(self, v) -> bool:
    if self.choices is not None:
      return v in self.choices
    above = self.low is None or (v > self.low if self.low_open else v >= self.low)
    return above and (self.high is None or (v < self.high if self.high_open else v <= self.high))


def rule(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, low=None, high=None,
         low_open=False, high_open=False, choices: Optional[Sequence] = None, nonempty: bool = False,
         convert: Optional[Callable] = None, internal: bool = False):
  """A dataclass field with its rule. convert(value, path, problems, section_values) builds the field
  itself (e.g. the chosen loss's settings); internal fields are set by code, never by a config."""
  meta = {"rule": Rule(low, high, low_open, high_open, None if choices is None else tuple(choices), nonempty)}
  if convert is not None:
    meta["convert"] = convert
  if internal:
    meta["internal"] = True
  return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


# ------------------------------------------------------------------------------------------------ types
def _finite_real(v) -> bool:
  try:
    return not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(v)
  except OverflowError:  # an integer too large for a float
    return False


def _is_int(v) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def plain(value):
  """ConfigDicts and mappings -> dicts, lists -> tuples, recursively (what a typed field holds)."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, Mapping):
    return {k: plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return tuple(plain(v) for v in value)
  return value


def _describe(kind, r: Rule) -> str:
  bounds = "" if (r.low is None and r.high is None) else f" {r.bounds()}"
  return {int: f"an integer{bounds}", float: f"a finite number{bounds}", bool: "True or False",
          str: "a string"}.get(kind, getattr(kind, "__name__", str(kind)))


def _convert(kind, value, path: str, r: Rule, problems: Problems, default=MISSING):
  """value as `kind`, or MISSING with a problem added."""
  origin, args = typing.get_origin(kind), typing.get_args(kind)
  if origin in (typing.Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    kind = next(a for a in args if a is not type(None))
    origin, args = typing.get_origin(kind), typing.get_args(kind)
  if dataclasses.is_dataclass(kind):
    return build(kind, value, path, problems, base=default if dataclasses.is_dataclass(default) else None)
  if kind is Any:
    return plain(value)
  if origin in (dict, Mapping) or kind in (dict, Mapping):
    if not isinstance(value, Mapping) and not hasattr(value, "to_dict"):
      problems.add(path, value, "must be a mapping")
      return MISSING
    return plain(value)
  if origin is tuple or kind is tuple:
    item = args[0] if args else Any
    fixed = len(args) if args and args[-1] is not Ellipsis else None
    ok = isinstance(value, (tuple, list)) and (fixed is None or len(value) == fixed)
    if ok:
      items = tuple(_scalar(item, v) for v in value)
      ok = all(v is not MISSING and _admitted(r, v) for v in items) and not (r.nonempty and not items)
    if not ok:
      what = f"{fixed} " if fixed else "a non-empty tuple of " if r.nonempty else "a tuple of "
      problems.add(path, value, f"must be {what}{_items_text(item, r)}")
      return MISSING
    return items
  converted = _scalar(kind, value)
  if converted is MISSING:
    problems.add(path, value, f"must be {_choices_text(r)}" if r.choices is not None else
                 f"must be {_describe(kind, r)}")
    return MISSING
  if not _admitted(r, converted):
    problems.add(path, value, f"must be {_choices_text(r) if r.choices is not None else r.bounds()}")
    return MISSING
  return converted


def _items_text(item, r: Rule) -> str:
  if r.choices is not None:
    return f"{sorted(r.choices, key=str)}"
  text = {int: "integers", float: "numbers", str: "strings"}.get(item, "values")
  return text + ("" if r.low is None and r.high is None else f" {r.bounds()}")


def _choices_text(r: Rule) -> str:
  return f"one of {sorted(r.choices, key=str)}"


def _admitted(r: Rule, v) -> bool:
  if r.choices is not None:
    return isinstance(v, (str, bool, type(None), int)) and v in r.choices
  if r.low is None and r.high is None:
    return True
  return r.admits(v)


def _scalar(kind, value):
  if kind is bool:
    return value if isinstance(value, bool) else MISSING
  if kind is int:
    return int(value) if _is_int(value) else MISSING
  if kind is float:
    return float(value) if _finite_real(value) else MISSING
  if kind is str:
    return value if isinstance(value, str) else MISSING
  return plain(value)


# ------------------------------------------------------------------------------------------------ sections
def fields(kind) -> list[dataclasses.Field]:
  """The fields a config may set (internal ones excluded)."""
  return [f for f in dataclasses.fields(kind) if not f.metadata.get("internal")]


def build(kind, values: Any, path: str, problems: Optional[Problems] = None, *, base: Any = None):
  """`values` (a mapping; None = all defaults) as the dataclass `kind`, starting from `base` (default:
  kind()). With `problems` given, adds to it and returns None on failure; else raises ConfigError."""
  own = problems is None
  problems = problems if problems is not None else Problems()
  before = len(problems.errors)
  values = {} if values is None else values
  if not isinstance(values, Mapping) and not hasattr(values, "items"):
    problems.add(path, values, "must be a mapping")
    values = None
  else:
    values = dict(values.items())
    known = {f.name: f for f in fields(kind)}
    for key in sorted(set(values) - set(known), key=str):
      problems.add(f"{path}.{key}" if path else str(key), MISSING, f"unknown setting; known: {sorted(known)}")
    if base is None:
      try:
        base = kind()
      except TypeError:  # a field without a default: the mapping must name it
        base = None
    hints = typing.get_type_hints(kind)
    converted = {}
    for name, f in known.items():
      where = f"{path}.{name}" if path else name
      default = getattr(base, name) if base is not None else MISSING
      if name not in values:
        if default is MISSING:
          problems.add(where, MISSING, "missing from the config")
        continue
      if "convert" in f.metadata:
        v = f.metadata["convert"](values[name], where, problems, values)
      else:
        v = _convert(hints[name], values[name], where, f.metadata.get("rule", Rule()), problems, default)
      if v is not MISSING:
        converted[name] = v
  if len(problems.errors) > before:
    if own:
      problems.raise_if_any()
    return None
  try:
    return dataclasses.replace(base, **converted) if base is not None else kind(**converted)
  except (ValueError, TypeError) as e:  # a relation between fields; a message naming its field stands alone
    message = str(e)
    problems.errors.append(message if path and message.startswith(f"{path}.") else
                           f"{path or kind.__name__}: {message}")
    if own:
      problems.raise_if_any()
    return None


def enforce(instance) -> None:
  """Checks an instance's fields against their rules (for direct construction); raises ValueError."""
  hints = typing.get_type_hints(type(instance))
  problems = Problems()
  for f in dataclasses.fields(instance):
    r = f.metadata.get("rule")
    if r is not None and "convert" not in f.metadata:
      _convert(hints[f.name], getattr(instance, f.name), f"{type(instance).__name__}.{f.name}", r, problems)
  if problems.errors:
    raise ValueError("; ".join(problems.errors))


def to_mapping(instance) -> dict:
  """The settable fields of a section instance as plain dicts (nested sections too)."""
  out = {}
  for f in fields(type(instance)):
    v = getattr(instance, f.name)
    out[f.name] = to_mapping(v) if dataclasses.is_dataclass(v) else dict(v) if isinstance(v, Mapping) else v
  return out


def rules(kind, path: str = "") -> dict[str, tuple[Any, Rule]]:
  """{dotted path: (type, rule)} of every settable field, nested sections flattened (for tests and docs)."""
  hints, out = typing.get_type_hints(kind), {}
  for f in fields(kind):
    where = f"{path}.{f.name}" if path else f.name
    if dataclasses.is_dataclass(hints[f.name]):
      out.update(rules(hints[f.name], where))
    elif "convert" not in f.metadata:
      out[where] = (hints[f.name], f.metadata.get("rule", Rule()))
  return out


def admits(kind, r: Rule, value) -> bool:
  """Whether `build` would accept `value` for a field of this type and rule."""
  return _convert(kind, value, "", r, Problems()) is not MISSING or (value is None and typing.get_origin(kind)
                                                                       in (typing.Union, types.UnionType))
