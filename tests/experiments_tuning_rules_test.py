"""The study's tuning rules (experiments/tuning.py, plan.py, claims.Runner): the edge extension, OAPL's beta2 grid by
strength, several tuning seeds, a claim-1 study, and shards that split a stage's cells and meet at its end. The
runs are stand-ins written by a fake `claims.execute` whose validation curve is a known function of the setting."""
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import threading

import pytest

from experiments import claims, plan, results, tuning

GRID = [(lr, k) for lr in (3e-5, 1e-4, 3e-4) for k in (0.1, 0.25, 0.5)]


def _scores(best, tie_knob=False):
  """AUC falling with the distance from `best` in log lr and log knob (flat in the knob with tie_knob)."""
  return {(lr, k): 1 - abs(math.log(lr / best[0])) - (0 if tie_knob else abs(math.log(k / best[1]))) for lr, k in GRID}


def test_extension_continues_each_axis_where_the_winner_sits_at_its_edge():
  assert tuning.extension(_scores((1e-4, 0.25))) == []
  assert tuning.extension(_scores((3e-5, 0.25))) == [(1e-5, 0.1), (1e-5, 0.25), (1e-5, 0.5)]
  assert tuning.extension(_scores((3e-4, 0.5))) == [(1e-3, 0.1), (1e-3, 0.25), (1e-3, 0.5),
                                                    (3e-5, 1.0), (1e-4, 1.0), (3e-4, 1.0)]
  assert tuning.extension(_scores((1e-4, 0.1)), decade_knob=True) == [(3e-5, 0.01), (1e-4, 0.01), (3e-4, 0.01)]
  extended = _scores((3e-5, 0.25))
  extended.update({p: -9.0 for p in tuning.extension(extended)})
  assert tuning.extension(extended) == []  # 1e-5 is the edge now, and worse


def test_a_tie_along_an_axis_does_not_extend_it():
  """On policy GRPO's clip never binds: every clip ties, the tie rule picks the smallest, and that is no edge."""
  assert tuning.extension(_scores((1e-4, 0.1), tie_knob=True)) == []
  assert tuning.extension(_scores((3e-5, 0.1), tie_knob=True)) == [(1e-5, 0.1), (1e-5, 0.25), (1e-5, 0.5)]


def test_beta2_by_strength_scales_the_measured_share_to_each_target():
  s = tuning.beta2_by_strength(0.5, 0.25)  # share proportional to beta2: beta2 = 0.25 x target / 0.5
  assert s.values == tuple(0.25 * t / 0.5 for t in tuning.STRENGTH_TARGETS) == (0.015, 0.15, 1.5)
  assert math.isclose(s.paper_share, 0.5 * 1e-3 / 0.25) and tuning.PAPER_BETA2 not in s.values
  long_answers = tuning.beta2_by_strength(50.0, 0.25)  # a large log-ratio (long responses): 1e-3 means something
  assert long_answers.paper_share == pytest.approx(0.2) and tuning.PAPER_BETA2 in long_answers.values
  for bad in (0.0, float("nan")):
    with pytest.raises(ValueError, match="positive measured share"):
      tuning.beta2_by_strength(bad, 0.25)


def test_claim1_study_has_two_arms_and_tunes_on_every_seed():
  study = plan.make_study("arithmetic", claim1_only=True, tune_seeds=(1000, 1001))
  assert list(study.arms()) == ["oapl_L50", "grpo_obo"] and study.primary_losses() == ("oapl", "grpo")
  cells = plan.tuning_cells(study, "oapl")
  assert [c.seed for c in cells] == [1000] * 9 + [1001] * 9  # the first seed's whole grid first
  assert [c.setting for c in cells[:9]] == [c.setting for c in cells[9:]] == study.grid("oapl")
  assert {c.seed for c in plan.pilot_cells(study)} == {1000}


# ----------------------------------------------------------------- the runner, on stand-in runs
BEST_LR = 1e-5  # the fake curve's best learning rate: below the grid, so the rule must extend once to reach it


def _fake_auc(cell):
  lr, knob = cell.setting
  return 0.8 - 0.1 * abs(math.log10(lr / BEST_LR)) - 0.01 * abs(math.log10(knob / 0.15)) + 0.001 * (cell.seed - 1000)


def _fake_execute(calls, lock):
  def execute(study, cell, workdir, warm_dir):
    with lock:
      calls.append(cell.name)
    level = _fake_auc(cell)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      for step in range(0, study.steps + 1, study.steps // 2):  # flat curve at the AUC; rises for the pilot
        value = 0.3 + (0.4 if step else 0.0) if cell.seed == 1000 and "lr0.0001_" in cell.name else level
        f.write(json.dumps({"step": step, "policy_eval/val/pass@1": value}) + "\n")
      f.write(json.dumps({"step": 1, "train/log_ratio_abs_mean": 2.0, "train/advantage_std": 1.0}) + "\n")
    final = {"generations": 1, "trainer_steps": study.steps, "wall_seconds": 0.0, "test": {"test": {"pass@1": level}}}
    results.write_json(os.path.join(workdir, results.FINAL_EVAL), final)
    return final
  return execute


def _run_together(functions, timeout_s=120):
  """Each function in its own thread (a shard each), all started at once; fails if one has not ended in time."""
  threads = [threading.Thread(target=f, daemon=True) for f in functions]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=timeout_s)
  assert not any(t.is_alive() for t in threads)


def test_shards_run_each_cell_once_extend_past_the_edge_and_agree(tmp_path, monkeypatch):
  calls, lock = [], threading.Lock()
  monkeypatch.setattr(claims, "execute", _fake_execute(calls, lock))
  def warm_start(study, directory):  # shard 0 makes it; the other waits for its eval.json
    results.write_json(os.path.join(directory, "eval.json"), {"val": {}, "test": {}})
    return {"val": {}, "test": {}}
  monkeypatch.setattr(claims, "warm_start", warm_start)
  study = plan.make_study("arithmetic", claim1_only=True, tune_seeds=(1000, 1001), beta2_by_strength=True)
  runners = [claims.Runner(study, str(tmp_path), stage="tuning", shard=(i, 2), poll_seconds=0.01) for i in range(2)]
  _run_together([r.study_all for r in runners])
  assert len(calls) == len(set(calls))  # no cell ran twice
  a, b = (r.state for r in runners)
  assert a.strength.values == b.strength.values == (0.015, 0.15, 1.5)  # share 0.25 x 2 / 1 = 0.5 at beta2 0.25
  assert a.chosen == b.chosen == {"oapl": (BEST_LR, 0.15), "grpo": (BEST_LR, 0.2)}
  assert a.extended["oapl"][:3] == [(1e-5, 0.015), (1e-5, 0.15), (1e-5, 1.5)]  # the lr edge, then 3e-6 past it
  assert [p[0] for p in a.extended["oapl"][3:]] == [3e-6] * 3
  ran = {c.split("/")[1] + "/" + c.split("/")[2] for c in calls}
  for lr, knob in [*runners[0].study.grid("oapl"), *a.extended["oapl"]]:
    assert f"oapl_L50/lr{lr:g}_beta2{knob:g}" in ran
  seeds = {c.rsplit("/", 1)[1] for c in calls}
  assert seeds == {"seed1000", "seed1001"}  # tuning only: no main seed ran
  # the mean over seeds decides: seed 1001 is 0.001 higher everywhere, so each point's mean is the fake AUC + 0.0005
  cell = plan.tuning_cells(runners[0].study, "oapl", [(BEST_LR, 0.15)])[0]
  assert a.tuning["oapl"][(BEST_LR, 0.15)] == pytest.approx(_fake_auc(cell) + 0.0005)
  collected = claims.Runner(study, str(tmp_path), collect=True)  # every stage, reading only: no secondary losses
  assert collected.study_all().chosen == a.chosen and len(calls) == len(set(calls))


def test_a_claim_goes_to_one_runner_and_a_dead_holders_claim_is_free(tmp_path):
  workdir = str(tmp_path / "study" / "oapl_L50" / "lr0.0001" / "seed0")
  held = claims._claim(workdir)
  assert held is not None
  other = []
  t = threading.Thread(target=lambda: other.append(claims._claim(workdir)))
  t.start(); t.join()
  assert other == [None]  # another runner (here a thread of this process) may not take it
  os.close(held)
  # a shard that holds the claim and is killed: while it lives the cell is its, once dead the cell is free
  holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[2]); from experiments "
                             "import claims; assert claims._claim(sys.argv[1]) is not None; print('held', flush=True); "
                             "sys.stdin.read()", workdir, os.path.dirname(os.path.dirname(claims.__file__))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline().strip() == "held"
  assert claims._claim(workdir) is None
  holder.kill()
  holder.wait()
  taken = claims._claim(workdir)
  assert taken is not None
  os.close(taken)


def test_a_tuning_record_stands_for_the_grid_and_is_refused_when_off(tmp_path, monkeypatch):
  """The record a finished tuning writes (tuning.json) lets another runs dir run the pilot and the main seeds at the
  recorded choice, running no tuning cell; a record of another study, or whose choice is not the rule's winner of
  its own scores, is refused."""
  from experiments import claims_report, tuning_record  # pylint: disable=import-outside-toplevel
  calls, lock = [], threading.Lock()
  monkeypatch.setattr(claims, "execute", _fake_execute(calls, lock))
  monkeypatch.setattr(claims, "warm_start", lambda study, directory: {"val": {}, "test": {}})
  study = plan.make_study("arithmetic", claim1_only=True, tune_seeds=(1000, 1001), seeds=(0, 1))
  tuned = claims.Runner(study, str(tmp_path / "a"), stage="tuning")
  state = tuned.study_all()
  path = claims_report.write_tuning_record(tuned.study, str(tmp_path / "a"), state, str(tmp_path))
  record = tuning_record.read(path, study.name, (1000, 1001))
  recorded = record.losses
  assert {loss: r.chosen for loss, r in recorded.items()} == state.chosen
  assert {lr for lr, _ in state.chosen.values()} == {BEST_LR}  # reached past the grid's edge
  assert recorded["oapl"].extended == state.extended["oapl"] and recorded["oapl"].curves  # curves kept from the runs
  calls.clear()
  again = claims.Runner(study, str(tmp_path / "b"), record=record)
  assert again.study_all().chosen == state.chosen
  pilot = {c.name for c in plan.pilot_cells(study)}
  main = {c.name for c in plan.main_cells(again.study, state.chosen)}
  assert set(calls) == pilot | main and {c.rsplit("/", 1)[1] for c in main} == {"seed0", "seed1"}
  body = json.load(open(path))
  with pytest.raises(tuning_record.RecordError, match="not this study"):
    tuning_record.read(path, "claims_another_task")
  body["losses"]["grpo"]["chosen"] = [3e-4, 0.2]
  json.dump(body, open(path, "w"))
  with pytest.raises(tuning_record.RecordError, match="not the rule's winner"):
    tuning_record.read(path, study.name)


def test_the_arms_table_counts_seeds_that_fell_below_the_warm_start(tmp_path, monkeypatch):
  from experiments import claims_report  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(claims, "execute", _fake_execute([], threading.Lock()))
  monkeypatch.setattr(claims, "warm_start", lambda study, directory: {"val": {}, "test": {}})
  study = plan.make_study("arithmetic", claim1_only=True, seeds=(0, 1))
  runner = claims.Runner(study, str(tmp_path))
  state = runner.study_all()
  runs = claims_report.collect(runner.study, str(tmp_path), state)
  finals = sorted(r.test_mean("pass@1") for r in runs["oapl_L50"].values())
  for warm, below in ((finals[0] - 0.01, 0), ((finals[0] + finals[1]) / 2, 1), (finals[1] + 0.01, 2)):
    state.warm = {"test": {"test": {"pass@1": warm}}}
    row = next(l for l in claims_report._arm_lines(runner.study, runs, state) if l.startswith("| oapl_L50 |"))
    assert row.split(" | ")[8] == f"{below}/2", (warm, finals, row)
  state.warm = None  # unknown: left blank, not a count
  row = next(l for l in claims_report._arm_lines(runner.study, runs, state) if l.startswith("| oapl_L50 |"))
  assert row.split(" | ")[8] == ""


def test_lag_curve_shards_split_the_cells_and_agree_on_the_lr(tmp_path, monkeypatch):
  from experiments import lag_curve, lag_plan, lag_report  # pylint: disable=import-outside-toplevel
  calls, lock, reports = [], threading.Lock(), []
  monkeypatch.setattr(claims, "execute", _fake_execute(calls, lock))
  monkeypatch.setattr(claims, "POLL_SECONDS", 0.01)
  def warm_start(study, directory):  # shard 0 makes it; the other waits for its eval.json
    results.write_json(os.path.join(directory, "eval.json"), {"val": {}, "test": {}})
    return {"val": {}, "test": {}}
  monkeypatch.setattr(claims, "warm_start", warm_start)
  monkeypatch.setattr(lag_report, "write", lambda task, study, runs_dir, out, warm, aucs, lr, cells: reports.append(
      (lr, [c.name for c in cells])) or out)
  task = lag_plan.TASKS["digits3"]
  _run_together([functools.partial(lag_curve.run_curve, task, str(tmp_path), str(tmp_path / f"out{i}"), False, False,
                                    (0,), (i, 2)) for i in range(2)])
  assert len(calls) == len(set(calls))  # no cell ran twice
  sharded = set(calls)
  calls.clear()
  lag_curve.run_curve(task, str(tmp_path / "one"), str(tmp_path / "out"), False, False, (0,))  # one process
  assert reports[0] == reports[1] == reports[2]  # the same lr and cells, sharded or not
  assert sharded == set(calls) and len(calls) > 8  # the same cells ran: GRPO's tuning, then both losses at 4 lags


def test_the_run_archive_collects_the_same_report_elsewhere(tmp_path, monkeypatch):
  """study --archive's file, extracted into another runs directory, gives --collect the same decisions and claims."""
  import tarfile  # pylint: disable=import-outside-toplevel
  from experiments import claims_report, run_archive  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(claims, "execute", _fake_execute([], threading.Lock()))
  def warm_start(study, directory):
    results.write_json(os.path.join(directory, "eval.json"), {"val": {}, "test": {"test": {"pass@1": 0.1}}})
    return results.read_json(os.path.join(directory, "eval.json"))
  monkeypatch.setattr(claims, "warm_start", warm_start)
  study = plan.make_study("arithmetic", claim1_only=True, seeds=(0, 1))
  runs, elsewhere = str(tmp_path / "runs"), str(tmp_path / "elsewhere")
  runner = claims.Runner(study, runs)
  runner.study_all()
  warm_dir = claims.warm_dir_of(runs, study)
  with open(os.path.join(warm_dir, "model.safetensors"), "wb") as f:  # the warm start's weights
    f.write(b"w" * 1000)
  os.makedirs(tmp_path / "out")
  archive = lambda: run_archive.write(runs, run_archive.finished_runs(os.path.join(runs, study.name)),  # noqa: E731
                                      warm_dir, str(tmp_path / "out"))
  monkeypatch.setattr(run_archive, "WARM_START_MAX_BYTES", 100)  # too large to carry: its eval only
  warm_files = lambda tar: sorted(os.path.basename(n) for n in tar.getnames()  # noqa: E731
                                 if os.path.dirname(n) == os.path.relpath(warm_dir, runs))
  with tarfile.open(archive()[0]) as tar:
    assert warm_files(tar) == ["eval.json"]
  monkeypatch.setattr(run_archive, "WARM_START_MAX_BYTES", 10_000)
  path, count = archive()
  assert count == len(run_archive.finished_runs(runs)) > 4  # the pilot, the tuning grid, two main seeds per arm
  with tarfile.open(path) as tar:
    assert not [n for n in tar.getnames() if "checkpoint" in n]
    assert warm_files(tar) == ["eval.json", "model.safetensors"]
    tar.extractall(elsewhere)
  collected = claims.Runner(study, elsewhere, collect=True)
  state = collected.study_all()
  assert state.chosen == runner.state.chosen and state.warm == runner.state.warm
  assert state.tuning == runner.state.tuning and state.primary_metric == runner.state.primary_metric
  here, there = (claims_report.collect(r.study, d, r.state) for r, d in ((runner, runs), (collected, elsewhere)))
  assert claims_report._arm_lines(collected.study, there, state) == claims_report._arm_lines(runner.study, here,
                                                                                              runner.state)
  final = lambda rs: {a: {s: r.test_mean("pass@1") for s, r in by_seed.items()} for a, by_seed in rs.items()}  # noqa
  assert final(there) == final(here) and set(there) == {"oapl_L50", "grpo_obo"}
  # resumed elsewhere: a run the archive lacks runs again, from the archived warm start; the finished ones do not
  lost = run_archive.finished_runs(os.path.join(elsewhere, study.name))[-1]
  shutil.rmtree(lost)
  calls = []
  monkeypatch.setattr(claims, "execute", _fake_execute(calls, threading.Lock()))
  claims.Runner(study, elsewhere).study_all()
  assert [os.path.join(elsewhere, c) for c in calls] == [lost]


def test_the_tuned_points_table_says_where_each_winner_sits(tmp_path, capsys):
  """experiments.tuned_points: a winner inside its grid is settled; one at the high lr edge that beats its inner
  neighbour is not (the rule would add the next lr at every knob); the strength scales the pilot's share."""
  from experiments import tuned_points, tuning_record  # pylint: disable=import-outside-toplevel
  inside, edge = _scores((1e-4, 0.25)), _scores((3e-4, 0.25))
  for name, scores in (("inside", inside), ("edge", edge)):
    tuning_record.write(str(tmp_path / f"{name}.json"), tuning_record.Record(
        "s", (1000, 1001), "hand-made", {"oapl": tuning_record.Recorded(scores, tuning.choose(scores), [], {}, {})}))
  spec = {"title": "t", "tasks": [
      {"task": "in", "tuning": "inside.json", "pilot": {"share": 0.2, "beta2": 0.25}},
      {"task": "at edge", "tuning": str(tmp_path / "edge.json")}]}
  (tmp_path / "spec.json").write_text(json.dumps(spec))
  assert tuned_points.main([str(tmp_path / "spec.json"), "--out", str(tmp_path / "out")]) == 0
  text = (tmp_path / "out" / "report.md").read_text()
  rows = [line for line in text.splitlines() if line.startswith("| in ") or line.startswith("| at edge ")]
  assert "**0.0001, 0.25**" in rows[0] and "| 0.2 |" in rows[0]  # 0.25 * 0.2 / 0.25
  assert "inside / inside | settled |" in rows[0]
  assert "**0.0003, 0.25**" in rows[1] and "high edge / inside | would add 3 points |" in rows[1]
  assert (tmp_path / "out" / "tuned_points.png").stat().st_size > 10_000
  assert tuned_points.main([str(tmp_path / "missing.json"), "--out", str(tmp_path / "o2")]) == 2
  assert "missing.json" in capsys.readouterr().err
