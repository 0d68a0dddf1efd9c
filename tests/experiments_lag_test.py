"""The lag curve without a run: the wall-time schedule against hand-computed windows and an event simulation,
the learning-curve crossing, the plan's pairing and shapes, GRPO's lr rule, and a run's statistics from a
hand-made history."""
import dataclasses

import numpy as np
import pytest

from experiments import lag_plan, lag_stats, plan, walltime
from experiments.results import RunResult


def test_window_by_hand():
  c = walltime.Costs(sample=2.0, train=1.0, refresh=0.5)
  # chunks ready at 2.5, 4.5, 6.5; updates 2.5-3.5, 4.5-5.5, 6.5-7.5
  assert walltime.window_seconds(c, 3) == 7.5
  assert walltime.simulate_window(c, 3) == (7.5, 0.5 + 2.0 + 1.0 + 1.0, 0.5 + 1.0)
  assert walltime.window_seconds(c, 3, overlapped=False) == 0.5 + 3 * 3.0
  fast_sampler = walltime.Costs(sample=1.0, train=2.0, refresh=0.0)  # the trainer sets the pace
  assert walltime.window_seconds(fast_sampler, 4) == 1.0 + 4 * 2.0
  assert walltime.simulate_window(fast_sampler, 4)[1] == 1.0  # waits only for the first chunk


@pytest.mark.parametrize("seed", range(20))
def test_closed_form_equals_the_event_simulation(seed):
  rng = np.random.default_rng(seed)
  c = walltime.Costs(*rng.uniform(0.01, 3.0, size=3))
  lag = int(rng.integers(1, 60))
  total, trainer_idle, sampler_idle = walltime.simulate_window(c, lag)
  assert total == pytest.approx(walltime.window_seconds(c, lag))
  assert trainer_idle + lag * c.train == pytest.approx(total)  # the trainer is either idle or updating
  assert sampler_idle + lag * c.sample == pytest.approx(total)
  assert walltime.window_seconds(c, lag) <= walltime.window_seconds(c, lag, overlapped=False) + 1e-12


def test_lag_buys_time_only_through_overlap():
  c = walltime.Costs(sample=1.0, train=1.0, refresh=0.0)
  curve = [(0, 0.4), (10, 0.5), (20, 0.7)]
  assert walltime.steps_to(curve, 0.6) == 15.0
  assert walltime.steps_to(curve, 0.3) == 0.0 and walltime.steps_to(curve, 0.9) == float("inf")
  # 15 steps at L = 5: three windows of (1 + 5 * 1) s overlapped, 5 * 2 s synchronous
  assert walltime.time_to_target(c, 5, curve, 0.6) == 18.0
  assert walltime.time_to_target(c, 5, curve, 0.6, overlapped=False) == 30.0
  # the same curve at L = 1, synchronous, is the reference: 15 steps x 2 s
  assert walltime.relative_to_synchronous(c, 5, curve, curve, 0.6) == pytest.approx(18.0 / 30.0)
  assert np.isnan(walltime.relative_to_synchronous(c, 5, curve, [(0, 0.7)], 0.6))  # reached at the start
  assert walltime.median_curve([[(0, 0.1), (10, 0.5)], [(0, 0.3), (10, 0.2), (20, 0.9)]]) == [(0, 0.2), (10, 0.35)]


def _study():
  return plan.Study("t", "configs/claims.py:arithmetic", False, steps=400, lag=50, long_lag=100, batch=4,
                    every_steps=10)


def test_cells_pair_both_losses_at_every_lag_in_the_fresh_shape():
  task, study = lag_plan.TASKS["sort"], _study()
  cells = lag_plan.main_cells(task, study, grpo_lr=3e-4, seeds=(0, 1))
  assert len(cells) == 2 * len(lag_plan.LAGS) * 2
  assert [c.arm.lag for c in cells[:2]] == [50, 50]  # the claim's lag first within a seed
  for lag in lag_plan.LAGS:
    for seed in (0, 1):
      pair = [c for c in cells if c.arm.lag == lag and c.seed == seed]
      assert sorted(c.arm.loss for c in pair) == ["grpo", "oapl"]
      loops = [plan.loop_overrides(study, c.arm) for c in pair]
      assert loops[0] == loops[1]  # the same lag, chunking and delay for both losses
      assert loops[0]["loop.sync_every"] == lag and loops[0]["loop.num_syncs"] * lag == 400
      assert loops[0]["loop.steps_per_rollout"] == 1 and loops[0]["loop.sampler_delay_windows"] == 0
  assert {c.setting for c in cells if c.arm.loss == "oapl"} == {task.oapl}
  assert {c.setting for c in cells if c.arm.loss == "grpo"} == {(3e-4, task.grpo_clip)}
  assert all(c.seed in lag_plan.TUNE_SEEDS for c in lag_plan.tuning_cells(task, study))



def test_the_code_task_runs_its_phases_in_turn_each_round_robin_by_seed():
  task, study = lag_plan.TASKS["code"], _study()
  cells = lag_plan.main_cells(task, study, grpo_lr=1e-4, seeds=(0, 1, 2))
  assert len(cells) == 2 * len(lag_plan.CODE_LAGS) * 3  # every lag, 400 included, both losses, every seed
  first = 2 * len(lag_plan.CODE_PHASES[0]) * 3
  assert {c.arm.lag for c in cells[:first]} == set(lag_plan.CODE_PHASES[0])  # no L = 200 or 10 before these
  assert [(c.seed, c.arm.lag) for c in cells[:first:2]] == [(s, L) for s in (0, 1, 2) for L in (400, 50, 1)]
  assert [c.arm.lag for c in cells[first::2][:2]] == [200, 10]
  assert {c.lr for c in lag_plan.tuning_cells(task, study)} == set(lag_plan.CODE_GRPO_LRS)

def test_grpo_lr_rule():
  assert lag_plan.choose_lr({1e-4: [0.5, 0.6], 3e-4: [0.6, 0.5], 1e-3: [0.1, 0.2]}) == 1e-4  # tie: smaller
  assert lag_plan.choose_lr({1e-4: [0.5, 0.5], 3e-4: [0.7, None]}) == 1e-4  # an unfinished lr cannot win
  assert lag_plan.choose_lr({3e-4: [None, None]}) is None


def test_run_stats_from_a_hand_made_history():
  lag, steps = 4, 8
  history = [{"step": 0, "policy_eval/dev/pass@1": 0.4}, {"step": 8, "policy_eval/dev/pass@1": 0.6}]
  grad = [1.0, 0.0, 0.0, 9.0, 0.0, 1.0, 1.0, 1.0]  # one spike (9 > 5 x median 1 of the steps with a gradient)
  drift = [0.0, 0.1, 0.2, 0.3, 0.0, 0.2, 0.4, 0.6]  # window ends at steps 3 and 7
  for s in range(steps):
    history.append({"step": s, "train/seq_log_ratio_abs_mean": drift[s], "train/grad_norm": grad[s],
                    "train/update_skipped": 0.0, "train/log_ratio_abs_mean": drift[s], "train/advantage_std": 0.5,
                    "train/frac_groups_all_equal_reward": 1.0 if grad[s] == 0 else 0.5,
                    "train/tokens": 30.0, "train/tokens_per_second": 300.0, "rollout/seconds": 0.2,
                    "sampler/refresh_seconds": 0.01})
  arm = lag_plan.arm("oapl", lag)
  r = RunResult(plan.Cell(arm, (1e-4, 0.1), 3), {"test": {"test": {"pass@1": 0.35}}, "generations": 256,
                                                  "trainer_steps": steps}, history)
  s = lag_stats.run_stats(r, warm_test_pass1=0.4, beta2=0.1)
  assert s.collapsed and s.test_pass1 == 0.35 and s.val_auc == pytest.approx(0.5)
  assert s.drift_max == 0.6 and s.drift_window_end == pytest.approx((0.3 + 0.6) / 2)
  assert s.grad_spikes == 1 and s.train_seconds == pytest.approx(0.1) and s.sample_seconds == 0.2
  assert s.knob == pytest.approx(np.mean([0.1 * d / 0.5 for d in drift]))


def test_ab_arms_get_their_loss_shape_as_the_study_runs_it():
  from experiments import ab
  study = _study()
  grpo, shape = ab.arm_loop(study, {"trainer.loss": "grpo", "trainer.optim.lr": 3e-4})
  assert shape == {"loss": "grpo", "shape": "off_by_one", "lag": 2}  # never OAPL's L = 50
  assert grpo["loop.sync_every"] == 2 and grpo["loop.sampler_delay_windows"] == 1 and grpo["trainer.optim.lr"] == 3e-4
  oapl, shape = ab.arm_loop(study, {})
  assert shape == {"loss": "oapl", "shape": "fresh", "lag": 50} and oapl["loop.num_syncs"] == 8
  same_lag, shape = ab.arm_loop(study, {"trainer.loss": "grpo", "shape": "fresh", "lag": 50})
  assert shape["lag"] == 50 and same_lag["loop.sync_every"] == 50 and "shape" not in same_lag
  own, _ = ab.arm_loop(study, {"loop.sync_every": 8})  # an arm's own loop fields win
  assert own["loop.sync_every"] == 8


def test_a_stop_is_one_line(capsys):
  import signal
  from experiments import stopping
  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(SystemExit) as stop:
    with stopping.one_line_stop("t"):
      signal.raise_signal(signal.SIGTERM)
  assert stop.value.code == 0
  with pytest.raises(SystemExit) as stop:
    with stopping.one_line_stop("t"):
      raise RuntimeError(f"/x: the run {stopping.EARLY_END} ({{'finished': False}})")
  assert stop.value.code == 0
  with pytest.raises(SystemExit) as stop:
    with stopping.one_line_stop("t"):
      raise KeyboardInterrupt
  assert stop.value.code == 130
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 3 and all(line.startswith("[t] stopped by SIG") for line in err)
  with pytest.raises(ValueError):  # anything else is not a stop
    with stopping.one_line_stop("t"):
      raise ValueError("bad")
  assert signal.getsignal(signal.SIGTERM) is before  # the handler is the caller's again


def test_collect_names_the_pilot_arms_not_run(tmp_path):
  from experiments import claims
  study = _study()
  runner = claims.Runner(study, str(tmp_path), collect=True)
  assert not runner.pilot()
  assert runner.state.pilot_missing == [a.name for a in study.primary_arms()]


def test_pooled_over_tasks_by_hand(tmp_path):
  from experiments import pooled
  # weights 1/4, 1/4 (task 1's two seeds), 1/2 (task 2's one seed, x2 its value): patterns by hand
  # |+-.25 +-.25 +-1|: 1.5, .5, 1, 1, 1, 1, .5, 1.5 -> two of eight reach the observed 1.5
  assert pooled.stratified_sign_flip([[1.0, 1.0], [2.0]]) == 0.25
  p = pooled.pool([[0.1, 0.3], [-0.2, -0.4, -0.3]])
  assert p.tasks == 2 and p.mean == pytest.approx((0.2 - 0.3) / 2)  # every task weighs the same
  var = (0.02 / 2 + 0.01 / 3) / 4  # sample variances 0.02 and 0.01, over n, over K^2
  assert p.ci_high - p.mean == pytest.approx(1.959964 * var ** 0.5)
  assert (p.tasks_below, p.tasks_above) == (1, 1) and p.between_sd == pytest.approx(0.5 / 2 ** 0.5)
  spec = {"claim": "c", "comparisons": [{"task": "a", "comparison": "x - y", "source": "s", "diffs": {"0": 0.1, "1": 0.3}},
                                        {"task": "b", "comparison": "x - y", "source": "s",
                                         "diffs": {"0": -0.2, "1": -0.4, "2": -0.3}}]}
  text = open(pooled.report(spec, str(tmp_path))).read()
  assert "-0.050" in text and (tmp_path / "forest.png").stat().st_size > 0


def test_main_cells_differ_from_the_tuning_cells_only_in_their_evals():
  from experiments import claims
  study = _study()
  main = lag_plan.main_study(study)
  assert dataclasses.replace(main, every_steps=study.every_steps, final_samples=None) == study
  assert main.every_steps == lag_plan.MAIN_EVAL_EVERY and claims.final_sampling(main) == lag_plan.MAIN_FINAL_SAMPLES
  assert claims.final_sampling(study) == claims.FINAL_SAMPLES


def test_an_edge_winner_extends_the_grid_by_half_a_decade():
  assert lag_plan.extend((1e-4, 3e-4, 1e-3), 1e-4) == 3e-5
  assert lag_plan.extend((3e-5, 1e-4, 3e-4, 1e-3), 3e-5) == 1e-5
  assert lag_plan.extend((1e-4, 3e-4, 1e-3), 1e-3) == 3e-3
  assert lag_plan.extend((1e-4, 3e-4, 1e-3, 3e-3), 3e-3) == 1e-2
  assert lag_plan.extend((1e-4, 3e-4, 1e-3), 3e-4) is None


def test_pooled_reads_lag_curves_at_one_lag():
  from experiments import pooled
  run = lambda loss, lag, seed, v: {"loss": loss, "lag": lag, "seed": seed, "test_pass1": v}  # noqa: E731
  stats = {"task": "t", "runs": [run("oapl", 50, 0, 0.6), run("grpo", 50, 0, 0.5), run("oapl", 50, 1, 0.7),
                                 run("grpo", 10, 1, 0.9)]}  # seed 1 has no GRPO at L = 50: no pair
  spec = pooled.from_lag_stats([stats], 50, ["p"])
  assert spec["comparisons"][0]["diffs"] == {"0": pytest.approx(0.1)}


def test_phase_costs_from_a_summary_by_hand():
  summary = {"trainer_steps": 10, "loop_seconds": 30.0,
             "phase_seconds": {"trainer": {"eval": 10.0, "waiting for samples": 2.0, "train step: dispatch": 5.0,
                                           "old-policy scores": 1.0},
                               "sampler": {"sampling": 6.0, "scoring": 2.0, "waiting for the trainer": 14.0}}}
  c = lag_stats.phase_costs(summary)
  assert c["train"] == pytest.approx(0.6) and c["sample"] == pytest.approx(0.8)
  assert c["trainer_wait"] == pytest.approx(2.0 / 20.0)
  assert c["sampler_wait"] == pytest.approx((14.0 - 10.0) / 20.0)  # its wait during the trainer's eval left out
  assert lag_stats.phase_costs({"trainer_steps": 10}) is None
