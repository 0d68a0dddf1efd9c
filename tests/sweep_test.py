"""oapl_jax.sweep: get_hyper expansion (the example sweep's lags at equal trainer steps), run names, commands, the
shared warm start (made once, loaded by every point), and a real two-run sweep of the arithmetic smoke config (its
table against each run's own files, and that a second invocation runs nothing)."""
import csv
import json
import os
import shlex
import subprocess
import sys

import pytest

from oapl_jax.apps import sweep as sweep_app
from oapl_jax.run import files, shared_warmstart, sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY_CONFIG = '''
from configs import arithmetic


def get_config(arg=""):
  c = arithmetic.get_config("smoke")
  c.model.overrides.update(hidden_size=32, intermediate_size=64, num_layers=1, head_dim=8)
  c.warmstart.update(steps=3, batch_size=8)
  c.eval.update(num_prompts=4, samples=2, ks=(1, 2))
  c.sampler.num_slots = 16
  return c


def get_hyper(h):
  return h.product([h.sweep("config.trainer.optim.lr", [1e-4, 3e-4]), h.fixed("config.seed", 1)])
'''


def test_hyper_product_zip_fixed():
  h = sweep.Hyper()
  points = h.product([h.sweep("config.a.x", [1, 2]), h.zip([h.sweep("config.b", ["p", "q"]),
                                                             h.sweep("config.c", [0.5, 1.5])])])
  assert points == [{"config.a.x": 1, "config.b": "p", "config.c": 0.5}, {"config.a.x": 1, "config.b": "q", "config.c": 1.5},
                    {"config.a.x": 2, "config.b": "p", "config.c": 0.5}, {"config.a.x": 2, "config.b": "q", "config.c": 1.5}]
  assert h.fixed("config.seed", 3) == [{"config.seed": 3}]
  with pytest.raises(ValueError, match="different lengths"):
    h.zip([h.sweep("config.a", [1, 2]), h.sweep("config.b", [1])])
  with pytest.raises(ValueError, match="set twice"):
    h.product([h.sweep("config.a", [1]), h.fixed("config.a", 2)])
  with pytest.raises(ValueError, match="must name a config field"):
    h.sweep("loop.sync_every", [1])
  with pytest.raises(ValueError, match="non-empty list"):
    h.sweep("config.a", [])


def test_run_names_are_short_safe_and_unique():
  points = [{"config.trainer.oapl.beta2": 0.25, "config.loop.sync_every": 5},
            {"config.trainer.oapl.beta2": 1e-05, "config.loop.sync_every": 20}]
  assert sweep.run_names(points) == ["beta2=0.25,sync_every=5", "beta2=1e-05,sync_every=20"]
  # Clashing last parts keep one more part; unsafe characters become '_'; tuples join with 'x'.
  clash = [{"config.a.lr": 1, "config.b.lr": 2, "config.task.name": "my pkg/x:y", "config.mesh.ici": (1, -1, 4)}]
  assert sweep.run_names(clash) == ["a.lr=1,b.lr=2,name=my_pkg_x_y,ici=1x-1x4"]
  # Too long: cut, and a hash of the overrides keeps it unique and deterministic.
  long = [{"config.x": "v" * 200}, {"config.x": "v" * 199 + "w"}]
  names = sweep.run_names(long)
  assert all(len(n) == 100 for n in names) and names[0] != names[1] and names == sweep.run_names(long)
  with pytest.raises(ValueError, match="same point twice"):
    sweep.run_names([{"config.x": 1}, {"config.x": 1}])


def test_plan_checks_fields_and_builds_commands(tmp_path):
  config = tmp_path / "cfg.py"
  config.write_text(TINY_CONFIG.replace('"config.seed", 1', '"config.no_such.field", 1'))
  with pytest.raises(ValueError, match="override config.no_such.field: no_such is not a field of the config"):
    sweep.plan(f"{config}", str(tmp_path / "w"))
  config.write_text(TINY_CONFIG.replace('"config.seed", 1', '"config.seed", 1.5'))
  with pytest.raises(ValueError, match=r"config.seed=1.5 does not fit the field"):
    sweep.plan(f"{config}", str(tmp_path / "w"))
  config.write_text(TINY_CONFIG.replace('"config.seed", 1', '"config.trainer.optim.b1", 0.9'))
  runs = sweep.plan(f"{config}", str(tmp_path / "w"))  # floats written as repr() parses them back
  assert [r.flags()[:2] for r in runs] == [["--config.trainer.optim.lr=0.0001", "--config.trainer.optim.b1=0.9"],
                                           ["--config.trainer.optim.lr=0.0003", "--config.trainer.optim.b1=0.9"]]
  runs = sweep.plan("configs/arithmetic.py", str(tmp_path / "w"), share_warmstart=False)
  assert len(runs) == 8 and len({r.workdir for r in runs}) == 8
  command = sweep.launcher_command("launch/slurm.sh", ["--nodes", "2", "--job-name", "oapl-{index}-{run}"],
                                   "configs/arithmetic.py", runs[4], 4, ["--config.loop.num_syncs=2"])
  assert command[:5] == ["launch/slurm.sh", "--nodes", "2", "--job-name", f"oapl-4-{runs[4].name}"]
  assert command[5:10] == ["--config", "configs/arithmetic.py", "--workdir", runs[4].workdir, "--"]
  assert command[10:] == ["--config.loop.sync_every=20", "--config.loop.num_syncs=3", "--config.seed=0",
                          "--config.loop.num_syncs=2"]


def test_example_sweep_moves_the_lag_at_equal_trainer_steps_from_one_warm_start(tmp_path):
  runs = sweep.plan("configs/arithmetic.py:sweep", str(tmp_path))
  warm = os.path.join(str(tmp_path), "warmstart")
  seen = set()
  for run in runs:
    config = files.load("configs/arithmetic.py:sweep", [f for f in run.flags()])
    seen.add((config.loop.sync_every, config.loop.num_syncs, config.seed))
    assert config.loop.steps_per_rollout == 1 and config.loop.prompts_per_rollout == config.loop.batch_prompts
    assert config.model.checkpoint == warm and config.warmstart.steps == 0  # loads the shared start
  # T = 60 trainer steps at every lag; two seeds each (one fresh chunk of 8 prompts x 8 per step at any L)
  assert seen == {(lag, 60 // lag, seed) for lag in (1, 5, 20, 60) for seed in (0, 1)}
  base = files.load("configs/arithmetic.py:sweep")
  assert base.warmstart.steps == 1000 and base.eval.every_steps == 10  # the demo's warm start; a lag-free eval grid


def test_points_that_change_the_warm_start_make_their_own(tmp_path):
  config = tmp_path / "cfg.py"
  config.write_text(TINY_CONFIG)
  assert all(r.warmstart == str(tmp_path / "w" / "warmstart") for r in sweep.plan(f"{config}", str(tmp_path / "w")))
  assert not any(r.warmstart for r in sweep.plan(f"{config}", str(tmp_path / "w"), share_warmstart=False))
  assert not any(r.warmstart for r in sweep.plan(f"{config}", str(tmp_path / "w"), ["--config.warmstart.steps=0"]))
  for key, value in (("config.warmstart.steps", 5), ("config.model.overrides.num_layers", 2),
                     ("config.task.teacher_slip_rate", 0.5)):
    config.write_text(TINY_CONFIG.replace('"config.seed", 1', f'"{key}", {value}'))
    assert not any(r.warmstart for r in sweep.plan(f"{config}", str(tmp_path / "w"))), key
    assert shared_warmstart.unshared_reason(files.load(f"{config}"), [{key: value}]) == \
        f"a point sets {key}, which the warm start reads"


def test_warm_start_is_made_once_and_a_changed_one_refused(tmp_path, monkeypatch, capsys):
  config = tmp_path / "cfg.py"
  config.write_text(TINY_CONFIG)
  made = []

  def fake_build(command, **kwargs):  # stands in for the subprocess; the slow test below runs the real one
    made.append(command)
    with open(os.path.join(tmp_path, "w", "warmstart", "config.json"), "w") as f:
      f.write("{}")
    return subprocess.CompletedProcess(command, 0)
  monkeypatch.setattr(shared_warmstart.subprocess, "run", fake_build)
  first = shared_warmstart.ensure(f"{config}", str(tmp_path / "w"), [])
  again = shared_warmstart.ensure(f"{config}", str(tmp_path / "w"), [])
  assert len(made) == 1 and first == again
  assert made[0][1:] == ["-m", "oapl_jax.apps.sweep_warmstart", f"--config={config}", f"--workdir={tmp_path / 'w'}"]
  assert first["fields"]["warmstart"]["steps"] == 3 and first["fields"]["seed"] == 0
  assert "reused" in capsys.readouterr().out
  with pytest.raises(ValueError, match="made from other warmstart/model/task/seed fields"):
    shared_warmstart.ensure(f"{config}", str(tmp_path / "w"), ["--config.warmstart.steps=4"])
  assert len(made) == 1


def test_report_has_start_final_delta_and_best_of_any_eval(tmp_path):
  from oapl_jax import reporting
  runs = sweep.plan("configs/arithmetic.py", str(tmp_path))[1:4]
  curves = {runs[0].name: [0.1, 0.6, 0.4], runs[1].name: [0.2, 0.3, 0.5]}  # runs[2]: never started
  for run in runs[:2]:
    reporter = reporting.Reporter(run.workdir, total_steps=20)
    for step, value in zip((0, 10, 20), curves[run.name]):
      reporter.scalars(step, {"eval/held_out/pass@1": value, "eval/held_out/pass@4": value + 0.2})
    if run is runs[0]:  # the policy's own eval on the step grid: it counts for "best", not for start or final
      reporter.scalars(10, {"policy_eval/held_out/pass@1": 0.7})
    start = {"eval/held_out/pass@1 (start)": 0.1} if run is runs[0] else {}  # else: the first eval in the history
    reporter.finish({"trainer_steps": 20, "finished": True, "eval/held_out/pass@1 (end)": curves[run.name][-1],
                     "eval/held_out/pass@4 (end)": curves[run.name][-1] + 0.2, **start})
    reporter.close()
  records = {runs[0].name: {"wall_seconds": 12.34, "starts": 2, "status": "finished"}}
  paths = sweep.write_report(str(tmp_path), runs, records, notes=["Every run loads one warm start."])
  rows = {r["run"]: r for r in _csv(paths["csv"])}
  first, second = rows[runs[0].name], rows[runs[1].name]
  columns = ("held_out/pass@1 start", "held_out/pass@1 final", "held_out/pass@1 delta", "held_out/pass@1 best",
             "held_out/pass@4 best", "wall_seconds", "sync_every", "num_syncs", "seed")
  assert [float(first[c]) for c in columns] == pytest.approx([0.1, 0.4, 0.3, 0.7, 0.8, 12.3, 1, 60, 1])
  assert [float(second[c]) for c in columns[:4]] == pytest.approx([0.2, 0.5, 0.3, 0.5])
  assert first["status"] == "finished" and second["wall_seconds"] == "nan"  # no record: not run by the sweep
  assert rows[runs[2].name]["status"] == "not started" and rows[runs[2].name]["held_out/pass@1 final"] == ""
  markdown = open(paths["markdown"]).read().splitlines()
  assert markdown[2] == "Every run loads one warm start." and len(markdown) == 6 + 3
  assert markdown[4].startswith("| run | sync_every | num_syncs | seed | status | held_out/pass@1 start | "
                                "held_out/pass@1 final | held_out/pass@1 delta | held_out/pass@1 best |")
  assert os.path.getsize(paths["curves"]) > 10_000


def test_launcher_submits_each_run_through_a_launch_script(tmp_path, capfd, monkeypatch):
  monkeypatch.chdir(REPO)
  args = ["--config", "configs/arithmetic.py", "--workdir", str(tmp_path), "--launcher", "launch/slurm.sh",
          "--launcher_args=--dry-run --nodes 1 --job-name oapl-{index}", "--", "--config.loop.num_syncs=2"]
  assert sweep_app.main(args) == 0
  out = capfd.readouterr().out
  runs = sweep.plan("configs/arithmetic.py", str(tmp_path), share_warmstart=False)
  srun = [line for line in out.splitlines() if line.startswith("srun ")]  # slurm.sh's own dry run, per run
  assert len(srun) == 8 and "warmstart" not in out  # through a launcher every run makes its own warm start
  for index, (run, line) in enumerate(zip(runs, srun)):  # in the sweep's order
    words = shlex.split(line)
    assert words[words.index("--workdir") + 1] == run.workdir
    assert set(run.flags()) | {"--config.loop.num_syncs=2"} <= set(words)
    assert f"sbatch --job-name=oapl-{index} --nodes=1" in out


def _csv(path):
  with open(path) as f:
    return list(csv.DictReader(f))


@pytest.mark.slow
def test_tiny_sweep_runs_reports_and_skips_finished_runs(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(REPO)  # runs start in the current directory: `configs` imports from the repo root
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.delenv("XLA_FLAGS", raising=False)  # one CPU device per run, as a user's machine has
  config = tmp_path / "tiny.py"
  config.write_text(TINY_CONFIG)
  workdir = str(tmp_path / "sweep")
  args = ["--config", f"{config}", "--workdir", workdir, "--parallel", "2", "--", "--config.loop.num_syncs=1"]
  assert sweep_app.main(args) == 0, capsys.readouterr().out
  first = capsys.readouterr().out
  names = sorted(os.listdir(workdir))
  assert names == ["curves.png", "lr=0.0001,seed=1", "lr=0.0003,seed=1", "results.csv", "results.md", "warmstart"]
  warm = os.path.join(workdir, "warmstart")
  assert {"config.json", "model.safetensors", "sweep_warmstart.json"} <= set(os.listdir(warm))
  assert open(os.path.join(warm, "build.log")).read().count("$ ") == 1  # made once, by one process
  rows = {r["run"]: r for r in _csv(os.path.join(workdir, "results.csv"))}
  assert set(rows) == {"lr=0.0001,seed=1", "lr=0.0003,seed=1"}
  for name, lr in (("lr=0.0001,seed=1", 1e-4), ("lr=0.0003,seed=1", 3e-4)):
    run_dir = os.path.join(workdir, name)
    with open(os.path.join(run_dir, "summary.json")) as f:
      summary = json.load(f)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
      history = [json.loads(line) for line in f]
    # It loaded the shared warm start and made none of its own (a run's warm start logs warmstart/nll).
    with open(os.path.join(run_dir, "config.json")) as f:
      recorded = json.load(f)
    assert recorded["model"]["checkpoint"] == warm and recorded["warmstart"]["steps"] == 0
    assert not any("warmstart/nll" in h for h in history)
    # The override reached the run: the trainer's (constant) learning rate is the swept value.
    rates = sorted({h["train/learning_rate"] for h in history if "train/learning_rate" in h})
    assert rates == pytest.approx([lr], rel=1e-6)
    evals = [h["eval/held_out/pass@1"] for h in history if "eval/held_out/pass@1" in h]
    assert len(evals) == 2  # before the window and at the end
    row = rows[name]
    assert float(row["lr"]) == lr and row["seed"] == "1" and row["status"] == "finished"
    assert float(row["held_out/pass@1 final"]) == pytest.approx(summary["eval/held_out/pass@1 (end)"])
    assert float(row["held_out/pass@1 best"]) == pytest.approx(max(evals))
    assert int(row["trainer_steps"]) == summary["trainer_steps"] == 2
    assert float(row["wall_seconds"]) > 0  # recorded (its size is the machine's, not checked)
  assert first.count("started") == 2
  with open(os.path.join(workdir, "results.md")) as f:
    assert f.read().count("\n| lr=") == 2
  assert os.path.getsize(os.path.join(workdir, "curves.png")) > 10_000

  mtimes = {n: os.path.getmtime(os.path.join(workdir, n, "metrics.jsonl")) for n in rows}
  assert sweep_app.main(args) == 0
  second = capsys.readouterr().out
  assert "started" not in second and second.count("finished before, skipped") == 2, second
  assert "warm start: made before" in second and open(os.path.join(warm, "build.log")).read().count("$ ") == 1
  assert mtimes == {n: os.path.getmtime(os.path.join(workdir, n, "metrics.jsonl")) for n in rows}
  assert _csv(os.path.join(workdir, "results.csv")) == list(rows.values())
  # --print_commands on a finished sweep prints no command either.
  assert sweep_app.main(args[:4] + ["--print_commands"]) == 0
  assert "-m oapl_jax.main" not in capsys.readouterr().out


def test_print_commands_are_runnable_lines(tmp_path, capsys):
  assert sweep_app.main(["--config", "configs/arithmetic.py:sweep", "--workdir", str(tmp_path), "--print_commands"]) == 0
  lines = [shlex.split(line) for line in capsys.readouterr().out.splitlines() if line.startswith(sys.executable)]
  assert lines[0] == [sys.executable, "-m", "oapl_jax.apps.sweep_warmstart", "--config=configs/arithmetic.py:sweep",
                      f"--workdir={tmp_path}"]  # the shared warm start first, then the runs that load it
  assert len(lines) == 9 and all(line[:3] == [sys.executable, "-m", "oapl_jax.main"] for line in lines[1:])
  assert all(f"--config.model.checkpoint={tmp_path}/warmstart" in line for line in lines[1:])
  assert not os.listdir(tmp_path)  # printing creates nothing


def test_fields_that_change_no_warm_start_are_left_out_of_its_record(tmp_path):
  """shared_warmstart.NOT_MADE_FROM: a field added since warm starts were first recorded (here the sampler's layout
  of a tied table) is in the config but not in the record, so a warm start made before it is found."""
  config = tmp_path / "cfg.py"
  config.write_text(TINY_CONFIG)
  cfg = files.load(str(config), [])
  assert "decode_transposed_table" in cfg.model
  made_from = shared_warmstart.fields(cfg)
  assert "decode_transposed_table" not in made_from["model"]
  assert made_from["model"]["preset"] == cfg.model.preset
