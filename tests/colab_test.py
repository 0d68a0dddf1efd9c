"""colab/oapl_quickstart.ipynb executes top to bottom in a real Jupyter kernel on CPU (its quick variant), started
in colab/ as Jupyter and `jupyter execute` start it, failing on any cell's error; its outputs show a trained run,
pass@k and sampled answers. Its first cell finds the repository from colab/, the root or a fresh clone."""
import os
import re
import shutil
import subprocess
import sys
import time

import nbformat
import pytest
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "colab", "oapl_quickstart.ipynb")
BADGE = "https://colab.research.google.com/github/YOUR_ORG/oapl_jax/blob/main/colab/oapl_quickstart.ipynb"


def _text(cell) -> str:
  parts = []
  for output in cell.get("outputs", []):
    parts.append(output.get("text", ""))
    parts.append(output.get("data", {}).get("text/plain", ""))
  return "".join(parts)


def _first_code(notebook):
  return next(c for c in notebook.cells if c.cell_type == "code")


def test_notebook_is_stored_without_outputs():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(notebook)
  code = [c for c in notebook.cells if c.cell_type == "code"]
  assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_badge_opens_this_notebook_and_names_the_same_repository_as_repo_url():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  first = notebook.cells[0]
  assert first.cell_type == "markdown" and f"]({BADGE})" in first.source
  repo_url = re.search(r'REPO_URL = "([^"]+)"', _first_code(notebook).source).group(1)
  assert repo_url == "https://github.com/YOUR_ORG/oapl_jax"  # the badge's <ORG>/<REPO>: both change together
  assert os.path.relpath(NOTEBOOK, REPO) == BADGE.split("/blob/main/")[1]


def _locate_cell(cwd, repo_url=None):
  """Runs the notebook's first cell as Python in `cwd` (IPython's own translation of its ! and % lines, the
  shell lines run for real); returns its namespace and what it printed."""
  from IPython.core.inputtransformer2 import TransformerManager
  source = _first_code(nbformat.read(NOTEBOOK, as_version=4)).source
  if repo_url:
    source = re.sub(r'REPO_URL = "[^"]+"', f"REPO_URL = {repo_url!r}", source)
  shell_lines, printed, namespace = [], [], {}

  class Shell:  # what get_ipython() gives the translated lines: {NAME} expanded from the cell's variables
    def system(self, line):
      shell_lines.append(line.format(**namespace))
      subprocess.run(shell_lines[-1], shell=True, check=True)

    def run_line_magic(self, name, line):
      shell_lines.append(f"%{name} {line.format(**namespace)}")

  namespace.update(get_ipython=Shell, print=lambda *a: printed.append(" ".join(map(str, a))))
  old_cwd, old_path = os.getcwd(), list(sys.path)
  os.chdir(cwd)
  try:
    exec(TransformerManager().transform_cell(source), namespace)  # pylint: disable=exec-used
    return namespace, shell_lines, printed, os.getcwd()
  finally:
    os.chdir(old_cwd)
    sys.path[:] = old_path


def test_first_cell_finds_the_repository_from_colab_or_the_root_without_cloning():
  for cwd in (os.path.join(REPO, "colab"), REPO):
    namespace, shell_lines, printed, cwd_after = _locate_cell(cwd)
    assert namespace["REPO"] == REPO and cwd_after == REPO and shell_lines == [], (cwd, shell_lines)
    assert printed[0] == f"repository root {REPO}"


def test_first_cell_stops_on_the_placeholder_url_and_clones_a_real_one(tmp_path):
  with pytest.raises(RuntimeError, match="set REPO_URL above"):
    _locate_cell(tmp_path)
  assert not os.listdir(tmp_path)
  source = tmp_path / "published"  # a stand-in for the published repository: its committed files
  subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{REPO}", str(source)], check=True)
  colab = tmp_path / "content"
  colab.mkdir()
  namespace, shell_lines, _, cwd_after = _locate_cell(colab, f"file://{source}")
  assert namespace["REPO"] == cwd_after == str(colab / "oapl_jax_repo")
  assert shell_lines == [f"git clone -q file://{source} oapl_jax_repo"]  # oapl_jax is installed here: no pip
  shutil.rmtree(source)
  namespace, shell_lines, _, _ = _locate_cell(colab, "file:///nowhere")  # run again: the clone is found, not redone
  assert namespace["REPO"] == str(colab / "oapl_jax_repo") and shell_lines == []


@pytest.mark.slow  # the whole notebook; fast: the cell tests above, readme_test's blocks
def test_notebook_runs_top_to_bottom_on_cpu_from_its_own_folder(tmp_path, monkeypatch):
  monkeypatch.setenv("OAPL_NOTEBOOK_QUICK", "1")
  monkeypatch.setenv("OAPL_NOTEBOOK_WORKDIR", str(tmp_path / "run"))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.delenv("XLA_FLAGS", raising=False)  # one CPU device, as a Colab CPU runtime has
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  client = NotebookClient(notebook, timeout=900, kernel_name="python3",
                          resources={"metadata": {"path": os.path.join(REPO, "colab")}})  # Jupyter's working dir
  start = time.perf_counter()
  client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
  print(f"notebook executed in {time.perf_counter() - start:.0f}s")
  code = [c for c in notebook.cells if c.cell_type == "code"]
  install, _, train, passk, answers, qwen = code
  # The kernel found the checkout from colab/ and ran its package (the install cell skipped the clone and pip).
  assert f"repository root {REPO}\n" in _text(install), _text(install)
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
  # The Qwen3-0.6B + GSM8K recipe is in the notebook, and off unless asked for (it needs the Hub).
  assert "oapl-prepare model Qwen/Qwen3-0.6B --out ~/models/Qwen3-0.6B" in qwen.source
  assert "oapl-prepare data gsm8k --out ~/data/gsm8k" in qwen.source
  assert _text(qwen).startswith("Qwen3-0.6B + GSM8K: skipped"), _text(qwen)
