"""oapl-train --help-config (run/config_help.py): every field of the typed config, its default as the dataclasses
hold it, a meaning for each, overrides that load back, and an unknown section refused with exit 2."""
import ast
import dataclasses
import importlib
from typing import Optional

import pytest

from oapl_jax import objectives, sections
from oapl_jax.apps import train
from oapl_jax.rl.offline import OfflineConfig
from oapl_jax.run import config_help, files, schema
from oapl_jax.tasks import factory as task_factory
from oapl_jax.tasks.arithmetic import ArithmeticSettings


def printed(text: str) -> dict[str, dict[str, object]]:
  """{section: {override path: default}} read back from render()'s text."""
  out, section = {}, None
  for line in text.splitlines():
    if line.startswith("["):
      section = out.setdefault(line.strip("[]"), {})
    elif line.startswith("  --config."):
      path, _, default = line.strip()[len("--config."):].partition("=")
      section[path] = ast.literal_eval(default)
  return out


def expected() -> dict[str, dict[str, object]]:
  """The same, walked from the dataclasses' own fields and defaults, the offline section and both registries."""
  out = {}

  def walk(instance, name: str, prefix: str):
    fields = out.setdefault(name, {})
    for f in dataclasses.fields(instance):
      if f.metadata.get("internal") or "convert" in f.metadata or (name, f.name) == ("run", "offline"):
        continue  # set by code; a registry's (walked below); offline: None unless a config has it
      value, path = getattr(instance, f.name), f"{prefix}{f.name}"
      if dataclasses.is_dataclass(value):
        walk(value, path, f"{path}.")
      else:
        fields[path] = value

  walk(schema.RunConfig(), "run", "")
  walk(OfflineConfig(), "offline", "offline.")
  for loss, spec in objectives.LOSSES.items():
    walk(spec.settings_type(), f"trainer.loss_settings.{loss}", f"trainer.loss_settings.{loss}.")
  for task, entry in task_factory.TASKS.items():
    walk(entry.settings(), f"task.{task}", "task.")
  return out


def test_every_field_appears_once_with_its_dataclass_default():
  shown, wanted = printed(config_help.render()), expected()
  assert shown.keys() == wanted.keys()
  for name in wanted:
    assert shown[name] == wanted[name], name
    assert [type(v) for v in shown[name].values()] == [type(v) for v in wanted[name].values()], name
  assert shown["warmstart.optim"]["warmstart.optim.lr"] == 1e-4 != shown["trainer.optim"]["trainer.optim.lr"]


def test_every_field_has_a_meaning():
  missing = [f.override for s in config_help.all_sections() for f in config_help.fields_of(s) if not f.meaning]
  assert not missing


def test_printed_overrides_load_back_as_the_defaults():
  """What --help-config prints is what a user types: every line of the sections an arithmetic run has, given
  to the config loader, gives the typed config of all defaults."""
  names = [s.name for s in config_help.all_sections() if s.name != "offline" and
           (not s.name.startswith("task.") or s.name == "task.arithmetic")]
  flags = dict.fromkeys(line.strip() for name in names for line in config_help.render(name).splitlines()
                        if line.startswith("  --config."))
  rc = schema.from_config(files.load("configs/arithmetic.py", list(flags)))
  assert rc == dataclasses.replace(schema.RunConfig(), task=ArithmeticSettings())


def test_a_section_comes_with_the_sections_inside_it_and_no_other():
  shown = printed(config_help.render("trainer"))
  assert set(shown) == {"trainer", "trainer.optim", "trainer.lora",
                        *(f"trainer.loss_settings.{loss}" for loss in objectives.LOSSES)}
  assert set(printed(config_help.render("trainer.loss_settings.oapl"))) == {"trainer.loss_settings.oapl"}
  assert set(printed(config_help.render("task"))) == {f"task.{t}" for t in task_factory.TASKS}
  with pytest.raises(KeyError, match="known: run, model"):
    config_help.render("trainer.opt")  # a prefix of a section's name is not a section


@dataclasses.dataclass(frozen=True)
class _Base:
  size: int = 1  # the base's meaning
  shape: int = 2  # kept by a subclass that restates the field without a comment


@dataclasses.dataclass(frozen=True)
class _Commented(_Base):
  # the block above a field,
  # two lines of it
  above: int = 0
  tail: str = sections.rule("a", choices=("a", "b"))  # the comment on its line
  wrapped: tuple[int, ...] = sections.rule((1,),
                                           low=0)  # on its last line
  shape: int = 3

  blank: Optional[int] = None

  # a block and a tail
  both: int = 0  # joined


def test_comments_read_above_and_on_a_field_and_from_its_base():
  assert config_help.comments(_Commented) == {
      "size": "the base's meaning", "shape": "kept by a subclass that restates the field without a comment",
      "above": "the block above a field, two lines of it", "tail": "the comment on its line",
      "wrapped": "on its last line", "both": "a block and a tail joined"}


def test_the_train_command_prints_a_section_without_a_config(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)  # no configs/ here: the default --config is never read
  with pytest.raises(SystemExit) as done:
    train.main(["--help-config", "loop"])
  assert done.value.code == 0
  assert "  --config.loop.sync_every=50\n" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["offline", "eval", "export", "serve", "sweep", "sweep_warmstart",
                                     "compile_check"])
def test_every_command_that_reads_a_config_lists_its_fields(command, tmp_path, monkeypatch, capsys):
  """Issue 55: not only oapl-train; no config, run directory or checkpoint is read first."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(SystemExit) as done:
    importlib.import_module(f"oapl_jax.apps.{command}").main(["--help-config", "loop"])
  assert done.value.code == 0
  assert "  --config.loop.sync_every=50\n" in capsys.readouterr().out


def test_an_unknown_section_is_one_error_line_and_exit_2(capsys):
  with pytest.raises(SystemExit) as done:
    train.main(["--help-config", "looop"])
  assert done.value.code == 2
  out, err = capsys.readouterr()
  assert not out and err.count("\n") == 1 and err.startswith("error: unknown config section 'looop'; known: ")
  assert "loop" in err.split("known: ")[1].split(", ")
