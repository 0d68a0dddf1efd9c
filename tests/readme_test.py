"""Every ```python block of the README runs, in order, in one namespace (on the suite's 8 fake devices)."""
import os
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(tmp_path, capsys):
  blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
  assert blocks, "the README has no python block"
  namespace: dict = {}
  cwd = os.getcwd()
  os.chdir(tmp_path)
  try:
    for block in blocks:
      exec(compile(block, str(README), "exec"), namespace)  # pylint: disable=exec-used
  finally:
    os.chdir(cwd)
  assert "(1, 4, 8) (1, 4, 8)" in capsys.readouterr().out
  assert (pathlib.Path("/tmp/oapl-readme-model") / "config.json").exists()


def _train_commands() -> list[list[str]]:
  """The README's `python -m oapl_jax.main` / `oapl-train` commands on the built-in task (no data to fetch)."""
  import shlex  # pylint: disable=import-outside-toplevel
  text = README.read_text().replace("\\\n", " ")
  out = []
  for line in text.splitlines():
    line = line.split("  #")[0].strip()
    for prefix in ("python -m oapl_jax.main ", "oapl-train "):
      if line.startswith(prefix) and "configs/arithmetic.py" in line:
        out.append(shlex.split(line[len(prefix):]))
  return out


def test_readme_train_commands_pass_the_dry_run(capsys):
  from oapl_jax.apps import train  # pylint: disable=import-outside-toplevel
  commands = _train_commands()
  assert len(commands) >= 3, commands  # at least the LoRA, adaptive lag and demonstrations switches
  for argv in commands:
    assert train.main(argv + ["--dry_run"]) == 0, argv
    assert "config and data OK" in capsys.readouterr().out
