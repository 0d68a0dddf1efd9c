"""colab/oapl_quickstart.ipynb executes top to bottom in a real Jupyter kernel on CPU (its quick variant),
failing on any cell's error; its outputs show a trained run, pass@k and sampled answers."""
import os
import re
import time

import nbformat
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "colab", "oapl_quickstart.ipynb")


def _text(cell) -> str:
  parts = []
  for output in cell.get("outputs", []):
    parts.append(output.get("text", ""))
    parts.append(output.get("data", {}).get("text/plain", ""))
  return "".join(parts)


def test_notebook_is_stored_without_outputs():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(notebook)
  code = [c for c in notebook.cells if c.cell_type == "code"]
  assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_notebook_runs_top_to_bottom_on_cpu(tmp_path, monkeypatch):
  monkeypatch.setenv("OAPL_NOTEBOOK_QUICK", "1")
  monkeypatch.setenv("OAPL_NOTEBOOK_WORKDIR", str(tmp_path / "run"))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.delenv("XLA_FLAGS", raising=False)  # one CPU device, as a Colab CPU runtime has
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  client = NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": REPO}})
  start = time.perf_counter()
  client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
  print(f"notebook executed in {time.perf_counter() - start:.0f}s")
  code = [c for c in notebook.cells if c.cell_type == "code"]
  install, _, train, passk, answers = code
  # The kernel ran this checkout's package (the install cell skipped the pip install).
  assert f"oapl_jax from {os.path.join(REPO, 'oapl_jax')}" in _text(install), _text(install)
  # The curve was drawn (a PNG in the display that training updates) and the run finished.
  assert any("image/png" in o.get("data", {}) for o in train.outputs), [o.get("output_type") for o in train.outputs]
  assert re.search(r"eval/held_out/pass@1 \(end\): \d\.\d{3}", _text(train)), _text(train)
  assert os.path.exists(tmp_path / "run" / "summary.json")
  found = re.search(r"8 held-out prompts x 8 samples: \{'pass@1': ([\d.]+), 'pass@4': ([\d.]+), 'pass@8': ([\d.]+)\}",
                    _text(passk))
  assert found, _text(passk)
  p1, p4, p8 = map(float, found.groups())
  assert 0 <= p1 <= p4 <= p8 <= 1  # pass@k cannot fall with k
  lines = [line for line in _text(answers).splitlines() if " gold " in line]
  assert len(lines) == 6 and all(line.count("'") >= 8 for line in lines), _text(answers)
