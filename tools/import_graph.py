"""Who imports whom in this repository, read from the source with `ast` (stdlib only; nothing is imported).

    python tools/import_graph.py            # units, layers, imports between units, imports running up, loops
    python tools/import_graph.py --edges    # and every import between units, with its file and line

Every import counts, function-level ones included (a lazy import that dodges a loop is a loop), and so does
one under `if TYPE_CHECKING:`. Terms:
  unit      a package folder (oapl_jax/models/qwen, oapl_jax/run, experiments) or a top-level module of
            oapl_jax/ (oapl_jax/reporting.py)
  layer     a unit's height in the graph of imports that run when a module loads (module level): 0 for a unit
            that imports no other unit, else one above the highest unit it imports
  running up  an import (function-level: module-level ones define the layers) of a unit on a higher layer
  loop      modules that reach each other through imports (a strongly connected set), named by one cycle
tests/layering_test.py reads the graph from here and states DESIGN.md's walls over it.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import sys
from typing import Iterable, Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "oapl_jax"
ROOTS = (PACKAGE, "experiments", "benchmarks", "configs")


@dataclasses.dataclass(frozen=True)
class Import:
  source: str  # the importing module, dotted
  target: str  # the imported module of this repository, dotted
  path: str  # the importing file, relative to the repository
  line: int
  module_level: bool  # runs when `source` loads (not inside a function, not under TYPE_CHECKING)


def modules(repo: str = REPO, roots: Iterable[str] = ROOTS) -> dict[str, str]:
  """{dotted module name: file path relative to repo} for every .py under `roots` (hidden folders skipped)."""
  found = {}
  for root in roots:
    for folder, dirs, files in os.walk(os.path.join(repo, root)):
      dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
      for name in sorted(f for f in files if f.endswith(".py")):
        rel = os.path.relpath(os.path.join(folder, name), repo)
        dotted = rel[:-len(".py")].replace(os.sep, ".").removesuffix(".__init__")
        if dotted != PACKAGE:  # the package's own __init__.py is the house, not a room in it
          found[dotted] = rel
  return found


def imports(repo: str = REPO, roots: Iterable[str] = ROOTS) -> list[Import]:
  """Every import between modules of this repository."""
  known = modules(repo, roots)
  out = []
  for source, rel in known.items():
    with open(os.path.join(repo, rel)) as f:
      tree = ast.parse(f.read(), rel)
    package = source if rel.endswith("__init__.py") else source.rpartition(".")[0]
    for node, module_level in _walk(tree, True):
      for target in _targets(node, package, known):
        if target != source:
          out.append(Import(source, target, rel, node.lineno, module_level))
  return out


def _walk(node: ast.AST, module_level: bool) -> Iterator[tuple[ast.AST, bool]]:
  """(import statement, whether it runs when the module loads) for every import below `node`."""
  for child in ast.iter_child_nodes(node):
    if isinstance(child, (ast.Import, ast.ImportFrom)):
      yield child, module_level
    elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
      for statement in child.body:
        yield from _walk(ast.Module(body=[statement], type_ignores=[]), False)
      for statement in child.orelse:
        yield from _walk(ast.Module(body=[statement], type_ignores=[]), module_level)
    else:
      yield from _walk(child, module_level and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _targets(node: ast.AST, package: str, known: dict[str, str]) -> list[str]:
  """The repository's modules an import statement loads (`from a import b`: a.b when it is a module, else a)."""
  if isinstance(node, ast.Import):
    names = [alias.name for alias in node.names]
  else:
    base = node.module or ""
    if node.level:
      parent = package.split(".")[:len(package.split(".")) - node.level + 1]
      base = ".".join(parent + ([base] if base else []))
    names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
  return sorted({_known_prefix(name, known) for name in names} - {None})


def _known_prefix(name: str, known: dict[str, str]) -> str | None:
  parts = name.split(".")
  for end in range(len(parts), 0, -1):
    if ".".join(parts[:end]) in known:
      return ".".join(parts[:end])
  return None


def unit_of(module: str, known: dict[str, str]) -> str:
  """oapl_jax.models.qwen.hf -> 'oapl_jax/models/qwen'; oapl_jax.reporting -> 'oapl_jax/reporting.py';
  experiments.claims -> 'experiments'."""
  rel = known[module]
  folder = os.path.dirname(rel)
  if folder == PACKAGE and not rel.endswith("__init__.py"):
    return rel
  return folder.replace(os.sep, "/")


def loops(edges: Iterable[Import]) -> list[list[str]]:
  """Each set of modules that import each other (Tarjan's strongly connected components, size > 1), as one
  cycle through all of its members where one exists, else through as many as a walk finds; sorted."""
  graph: dict[str, set[str]] = {}
  for e in edges:
    graph.setdefault(e.source, set()).add(e.target)
    graph.setdefault(e.target, set())
  components = [c for c in _strongly_connected(graph) if len(c) > 1]
  return sorted(_cycle(graph, c) for c in components)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      out.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def _cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
  """A shortest cycle from the component's first module back to it, inside the component (breadth first)."""
  members, start = set(component), component[0]
  paths = {start: [start]}
  frontier = [start]
  while frontier:
    nxt = []
    for v in frontier:
      for w in sorted(graph[v] & members):
        if w == start:
          return paths[v] + [start]
        if w not in paths:
          paths[w] = paths[v] + [w]
          nxt.append(w)
    frontier = nxt
  raise AssertionError(f"no cycle through {start}")  # unreachable: the component is strongly connected


def layers(unit_edges: set[tuple[str, str]], units: Iterable[str]) -> dict[str, int]:
  """{unit: layer} over module-level imports between units (a loop among them shares one layer)."""
  graph = {u: set() for u in units}
  for a, b in unit_edges:
    graph[a].add(b)
  components = _strongly_connected(graph)
  component_of = {u: i for i, c in enumerate(components) for u in c}
  height: dict[int, int] = {}
  for i, component in enumerate(components):  # Tarjan emits a component after all it reaches
    below = {component_of[w] for u in component for w in graph[u]} - {i}
    height[i] = 1 + max((height[j] for j in below), default=-1)
  return {u: height[component_of[u]] for u in graph}


@dataclasses.dataclass
class Report:
  units: list[str]
  unit_of: dict[str, str]  # module -> its unit
  layer: dict[str, int]
  unit_imports: dict[tuple[str, str], list[Import]]  # (importing unit, imported unit) -> the imports
  running_up: list[Import]
  loops: list[list[str]]

  def lines(self, edges: bool = False) -> list[str]:
    out = [f"units / layers / imports between units: {len(self.units)} / {len(set(self.layer.values()))} / "
           f"{len(self.unit_imports)}; imports running up: {len(self.running_up)}; loops: {len(self.loops)}"]
    for height in sorted(set(self.layer.values()), reverse=True):
      out.append(f"  layer {height}: {', '.join(u for u in self.units if self.layer[u] == height)}")
    for e in self.running_up:
      out.append(f"  running up: {e.path}:{e.line} imports {e.target} (layer {self.layer[self.unit_of[e.source]]} -> "
                 f"{self.layer[self.unit_of[e.target]]})")
    for cycle in self.loops:
      out.append(f"  loop: {' -> '.join(cycle)}")
    if edges:
      for (a, b), found in sorted(self.unit_imports.items()):
        out.append(f"  {a} -> {b}: " + ", ".join(f"{e.path}:{e.line}" for e in found))
    return out


def report(repo: str = REPO, roots: Iterable[str] = ROOTS) -> Report:
  known = modules(repo, roots)
  found = imports(repo, roots)
  unit = {m: unit_of(m, known) for m in known}
  units = sorted(set(unit.values()))
  unit_imports: dict[tuple[str, str], list[Import]] = {}
  for e in found:
    if unit[e.source] != unit[e.target]:
      unit_imports.setdefault((unit[e.source], unit[e.target]), []).append(e)
  layer = layers({(unit[e.source], unit[e.target]) for e in found
                  if e.module_level and unit[e.source] != unit[e.target]}, units)
  running_up = [e for e in found if layer[unit[e.target]] > layer[unit[e.source]]]
  return Report(units, unit, layer, unit_imports, running_up, loops(found))


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--edges", action="store_true", help="list every import between units")
  args = parser.parse_args(argv)
  print("\n".join(report().lines(args.edges)))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
