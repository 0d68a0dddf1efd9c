"""`oapl-train --help-config [SECTION]`: every field of the run config, as a user overrides it, with its type,
default, bounds and meaning, all read from the section dataclasses themselves.

    print(config_help.render("loop"))    # the loop section; None: every section; KeyError for an unknown one

A field's meaning is its comment in the dataclass: the comment lines just above it, then the one on its own
lines (a field a subclass restates without one keeps its base's). Sections are RunConfig's, depth first, then
every loss's settings (trainer.loss_settings.<loss>) and every registered task's (task.<name>: its fields are
set as task.<field>, with task.name=<name>). A section named by SECTION comes with the sections inside it.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
import typing
from typing import Any, Optional

from oapl_jax import objectives, sections
from oapl_jax.rl.offline import OfflineConfig
from oapl_jax.run import schema
from oapl_jax.tasks import factory as task_factory

TOP_LEVEL = "run"  # the section name of RunConfig's own scalar fields (seed)
WIDTH = 110


@dataclasses.dataclass(frozen=True)
class Section:
  name: str  # what --help-config takes: loop, trainer.optim, trainer.loss_settings.oapl, task.chat
  prefix: str  # the override path of its fields: loop, trainer.optim, ..., task
  kind: type  # its dataclass
  default: Any  # its default instance (warmstart.optim's defaults differ from trainer.optim's)
  about: str  # the comment on the field that holds it, and its class docstring


@dataclasses.dataclass(frozen=True)
class FieldHelp:
  override: str  # --config.loop.sync_every
  default: Any
  kind: str  # its type and bounds: "int >= 1", "str, one of ['buffer', 'sft']"
  meaning: str


def comments(kind: type) -> dict[str, str]:
  """{field: its comment} over kind's dataclass bases, a subclass's comment winning over its base's."""
  out: dict[str, str] = {}
  for cls in reversed(kind.__mro__):
    if dataclasses.is_dataclass(cls):
      out.update({name: text for name, text in _own_comments(cls).items() if text})
  return out


def _own_comments(cls: type) -> dict[str, str]:
  source = textwrap.dedent(inspect.getsource(cls))
  lines = source.splitlines()
  found = {tok.start[0]: tok.string.lstrip("#").strip()
           for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
  alone = {n for n in found if lines[n - 1].lstrip().startswith("#")}  # a comment line, not a code line's tail
  out = {}
  for node in ast.parse(source).body[0].body:
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
      above, n = [], node.lineno - 1
      while n in alone:
        above.insert(0, found[n])
        n -= 1
      tail = [found[n] for n in range(node.lineno, node.end_lineno + 1) if n in found and n not in alone]
      out[node.target.id] = " ".join(above + tail)
  return out


def _docstring(kind: type) -> str:
  own = kind.__dict__.get("__doc__") or ""
  return "" if own.startswith(f"{kind.__name__}(") else " ".join(own.split())  # dataclass's signature: no doc


def _nested(kind: Any) -> Optional[type]:
  """The section dataclass a field's type holds (Optional[X] too), else None."""
  for candidate in (kind, *typing.get_args(kind)):
    if dataclasses.is_dataclass(candidate):
      return candidate
  return None


def _registered(path: str) -> list[tuple[str, str, type]]:
  """(section name, override prefix, dataclass) of the sections a registry field holds, one per entry."""
  if path == "task":
    return [(f"task.{name}", "task", entry.settings) for name, entry in task_factory.TASKS.items()]
  if path == "trainer.loss_settings":
    return [(f"{path}.{name}",) * 2 + (spec.settings_type,) for name, spec in objectives.LOSSES.items()]
  return []


def all_sections() -> list[Section]:
  """Every section in print order: RunConfig's depth first, a registry's entries where its field is."""
  out = [Section(TOP_LEVEL, "", schema.RunConfig, schema.RunConfig(), _docstring(schema.RunConfig))]

  def walk(kind, default, path):
    hints, notes = typing.get_type_hints(kind), comments(kind)
    for f in sections.fields(kind):
      inner, where = _nested(hints[f.name]), f"{path}.{f.name}" if path else f.name
      for name, prefix, entry in _registered(where):
        out.append(Section(name, prefix, entry, entry(), _docstring(entry)))
      if inner is not None:
        value = getattr(default, f.name)
        value = value if value is not None else OfflineConfig()  # the optional offline section
        about = [notes.get(f.name, "").rstrip("."), _docstring(inner)]
        out.append(Section(where, where, inner, value, ". ".join(filter(None, about))))
        walk(inner, value, where)

  walk(schema.RunConfig, schema.RunConfig(), "")
  return out


def _kind_text(kind: Any, rule: sections.Rule) -> str:
  name = kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")
  each = "each " if typing.get_origin(kind) is tuple else ""
  if rule.choices is not None:
    limits = f"{each}one of {sorted(rule.choices, key=str)}"
  elif rule.low is not None or rule.high is not None:
    limits = f"{each}{rule.bounds()}"
  else:
    limits = ""
  return ", ".join(filter(None, (name, limits, "non-empty" if rule.nonempty else "")))


def fields_of(section: Section) -> list[FieldHelp]:
  """The section's own settable fields (the sections inside it are their own)."""
  hints, notes, out = typing.get_type_hints(section.kind), comments(section.kind), []
  for f in sections.fields(section.kind):
    if _nested(hints[f.name]) is not None or "convert" in f.metadata:
      continue  # a section, or one built from a registry (task, trainer.loss_settings): listed by name
    path = f"{section.prefix}.{f.name}" if section.prefix else f.name
    out.append(FieldHelp(f"--config.{path}", getattr(section.default, f.name),
                         _kind_text(hints[f.name], f.metadata.get("rule", sections.Rule())), notes.get(f.name, "")))
  return out


def render(name: Optional[str] = None) -> str:
  """The help of section `name` and the sections inside it (None: all); KeyError naming the known ones."""
  known = all_sections()
  chosen = [s for s in known if name is None or s.name == name or s.name.startswith(f"{name}.")]
  if not chosen:
    raise KeyError(f"unknown config section {name!r}; known: {', '.join(s.name for s in known)}")
  blocks = []
  for section in chosen:
    lines = [f"[{section.name}]"] + textwrap.wrap(section.about, WIDTH, initial_indent="  ", subsequent_indent="  ",
                                                  break_on_hyphens=False)
    for field in fields_of(section):
      lines.append(f"  {field.override}={field.default!r}")
      lines += textwrap.wrap(f"{field.kind}. {field.meaning}" if field.meaning else field.kind, WIDTH,
                             initial_indent="      ", subsequent_indent="      ", break_on_hyphens=False)
    blocks.append("\n".join(lines))
  return "\n\n".join(blocks) + "\n"
