"""DESIGN.md's walls, read from the source (tools/import_graph.py: ast, every import, function-level included)."""
import fnmatch

import pytest

from tools import import_graph

GROUND = "oapl_jax/*.py"  # the ground floor: top-level modules of oapl_jax/ (reporting.py, run_dir.py, ...)
OUTSIDE = ("experiments", "benchmarks", "configs")  # beside configs/, outside the installed library

# (who, what it may not import, why). A room is a unit (tools/import_graph.unit_of), a folder with all below
# it, or a glob. benchmarks/ may import all of the library (apps/ too) and configs/; experiments/ all but apps/.
WALLS = [
    ((GROUND,), ("oapl_jax/run", "oapl_jax/apps"), "the ground floor never reaches up to run/ or apps/"),
    (("oapl_jax/models", "oapl_jax/objectives", "oapl_jax/tasks"), ("oapl_jax/rl", "oapl_jax/sampler", "oapl_jax/run"),
     "models/, objectives/ and tasks/ know nothing of RL, the sampler or a run"),
    (("oapl_jax",), ("oapl_jax/apps",), "apps/ are the entry points: nothing below them imports one"),
    (("oapl_jax",), OUTSIDE, "the library never imports the studies, benchmarks or configs that use it"),
    (("configs",), ("experiments", "benchmarks"), "configs/ are read by studies and benchmarks, never built on them"),
    (("experiments", "configs"), ("oapl_jax/apps",),
     "studies and configs use the library under run/ (a sweep, the shared warm start), not a command's module"),
]
# Units the walls do not hold yet, each with its reason; one that no longer crosses a wall must leave the list.
EXCEPTIONS = {
    "oapl_jax/main.py": "apps/train.py under the name `python -m oapl_jax.main`: an entry point, not a floor",
}


@pytest.fixture(scope="module")
def graph():
  return import_graph.report()


def _in(unit: str, rooms) -> bool:
  return any(unit == r or unit.startswith(r + "/") or fnmatch.fnmatch(unit, r) for r in rooms)


def _crossing(graph, who, forbidden) -> list:
  return [e for (a, b), found in sorted(graph.unit_imports.items()) if _in(a, who) and _in(b, forbidden)
          for e in found]


@pytest.mark.parametrize("who, forbidden, why", WALLS, ids=[" ".join(w[0]) + " -/-> " + " ".join(w[1]) for w in WALLS])
def test_no_import_crosses_a_wall(graph, who, forbidden, why):
  crossing = [f"{e.path}:{e.line} imports {e.target}" for e in _crossing(graph, who, forbidden)
              if graph.unit_of[e.source] not in EXCEPTIONS]
  assert not crossing, f"{why}; these imports cross the wall:\n  " + "\n  ".join(crossing)


def test_every_exception_is_still_needed(graph):
  crossing = {graph.unit_of[e.source] for who, forbidden, _ in WALLS for e in _crossing(graph, who, forbidden)}
  assert not set(EXCEPTIONS) - crossing, f"{sorted(set(EXCEPTIONS) - crossing)} cross no wall now: drop them"


def test_no_import_loop(graph):
  """A loop anywhere (oapl_jax/, experiments/, benchmarks/, configs/), function-level imports included: a lazy
  import that dodges a loop is a loop."""
  assert not graph.loops, "modules that import each other (move the shared definition down a floor):\n  " + \
      "\n  ".join(" -> ".join(cycle) for cycle in graph.loops)


def test_the_reader_sees_function_level_imports_and_names_a_loop(tmp_path):
  """The reader itself: a function-level import closing a loop is found, with its cycle."""
  package = tmp_path / "oapl_jax"
  package.mkdir()
  (package / "__init__.py").write_text("")
  (package / "low.py").write_text("def f():\n  from oapl_jax import high  # lazy\n")
  (package / "high.py").write_text("from oapl_jax import low\n")
  found = import_graph.report(str(tmp_path), ("oapl_jax",))
  assert found.loops == [["oapl_jax.high", "oapl_jax.low", "oapl_jax.high"]]
  assert [(e.path, e.line) for e in found.running_up] == [("oapl_jax/low.py", 2)]
