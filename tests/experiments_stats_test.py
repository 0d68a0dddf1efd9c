"""The claims study's decisions without any run: paired statistics against hand-computed values, the verdict
rule, the pilot and tuning rules on synthetic curves, the cell plan and its priority order, task B's halves."""
import math

import numpy as np
import pytest

from experiments import claims_stats, hard_tail_task, paired_stats, plan, tuning
from experiments.results import RunResult


def test_paired_summary_by_hand():
  s = paired_stats.paired([0.1, 0.2, -0.05, 0.15])
  assert s.n == 4 and s.mean == pytest.approx(0.1)
  # deviations 0, .1, -.15, .05: squares sum .035, / 3 -> sd = sqrt(.0116667) = .1080123
  assert s.sd == pytest.approx(math.sqrt(0.035 / 3))
  half = 3.182446 * math.sqrt(0.035 / 3) / 2  # t_{0.975,3} * sd / sqrt(4)
  assert (s.ci_low, s.ci_high) == (pytest.approx(0.1 - half, abs=1e-6), pytest.approx(0.1 + half, abs=1e-6))
  # the 16 sign patterns' sums, by hand (0, 1 and 2 flips; 3 and 4 flips are the negatives of 1 and 0):
  sums = [0.40, 0.20, 0.00, 0.50, 0.10, -0.20, 0.30, -0.10, 0.10, -0.30, 0.20,
          -0.10, -0.50, 0.00, -0.20, -0.40]
  assert len(sums) == 16
  assert s.p == pytest.approx(sum(abs(x) >= 0.4 - 1e-9 for x in sums) / 16) == 0.25


def test_t_quantile_and_its_fallback(monkeypatch):
  assert paired_stats.t_quantile_975(3) == pytest.approx(3.182446, abs=1e-6)
  assert paired_stats.t_quantile_975(7) == pytest.approx(2.364624, abs=1e-6)
  import builtins
  real_import = builtins.__import__

  def no_scipy(name, *args, **kwargs):
    if name.startswith("scipy"):
      raise ImportError(name)
    return real_import(name, *args, **kwargs)
  monkeypatch.setattr(builtins, "__import__", no_scipy)
  assert paired_stats.t_quantile_975(3) == 3.182446
  assert paired_stats.t_quantile_975(31) == pytest.approx(2.039513, abs=1e-5)
  assert paired_stats.t_quantile_975(60) == pytest.approx(2.000298, abs=1e-5)


def test_sign_flip_extremes_and_small_n():
  assert paired_stats.sign_flip_p([0.1] * 5) == pytest.approx(2 / 32) == paired_stats.min_p(5)
  assert paired_stats.sign_flip_p([0.3, 0.1, 0.2, 0.4, 0.1, 0.2, 0.5, 0.3]) == pytest.approx(2 / 256)
  assert paired_stats.sign_flip_p([0.0, 0.0, 0.0]) == 1.0
  one = paired_stats.paired([0.2])
  assert one.p == 1.0 and math.isnan(one.ci_low) and one.mean == 0.2
  assert paired_stats.paired([]).n == 0


def test_holm_by_hand():
  # sorted: A .01*4 = .04; C .03*3 = .09; B .04*2 = .08 -> .09 (running max); D .2*1 = .2
  adjusted = paired_stats.holm({"A": 0.01, "B": 0.04, "C": 0.03, "D": 0.2})
  assert adjusted == pytest.approx({"A": 0.04, "B": 0.09, "C": 0.09, "D": 0.2})
  assert paired_stats.holm({"A": 0.5, "B": 0.9})["B"] == 1.0  # capped
  out = paired_stats.holm({"A": 0.01, "B": float("nan")})
  assert out["A"] == 0.01 and math.isnan(out["B"])


def test_verdict_rule():
  up = paired_stats.paired([0.3, 0.1, 0.2, 0.4, 0.1, 0.2, 0.5, 0.3])
  assert paired_stats.verdict(up, 0.01, planned_n=8) == "supported"
  assert paired_stats.verdict(up, 0.01, direction=-1) == "contradicted"
  assert paired_stats.verdict(up, 0.2) == "inconclusive"
  assert 0.14 < up.ci_low < 0.15  # mean .2625, sd .1408, t_{.975,7} 2.3646: half-width .1177
  assert paired_stats.verdict(up, 0.01, margin=0.10) == "supported"
  assert paired_stats.verdict(up, 0.01, margin=0.15) == "inconclusive"  # the interval reaches below the margin
  assert paired_stats.verdict(up, 0.01, margin=up.ci_high + 0.01) == "contradicted"  # clearly short of it
  assert paired_stats.verdict(paired_stats.paired([0.1] * 5), 0.06, planned_n=8) == \
      "inconclusive (interim: n=5 < planned 8)"


def test_pilot_rule_on_synthetic_curves():
  steps = list(range(0, 201, 10))
  learns = [(s, 0.2 + 0.5 * s / 200) for s in steps]  # 0.45 at step 100
  p = tuning.pilot_verdict(learns, 200)
  assert p.ok and p.step == 100 and p.mid == pytest.approx(0.45) and p.start == pytest.approx(0.2)
  flat = [(s, 0.2 + 0.1 * s / 200) for s in steps]
  p = tuning.pilot_verdict(flat, 200)
  assert not p.ok and "does not learn" in p.message and "not the losses" in p.message
  saturates = [(s, min(0.2 + s / 50, 0.99)) for s in steps]
  p = tuning.pilot_verdict(saturates, 200)
  assert not p.ok and "saturates" in p.message
  assert not tuning.pilot_verdict([], 200).ok
  assert tuning.pilot_verdict([(0, 0.1), (30, 0.5), (70, 0.5)], 100).step == 30  # nearest to 50, earlier on a tie


def test_hard_tail_rule():
  def warm(hard1, hard_k, easy1):
    return {"test_hard": {"pass@1": hard1, "pass@256": hard_k}, "test_easy": {"pass@1": easy1, "pass@256": 0.9}}
  ok, message = tuning.hard_tail_verdict(warm(0.03, 0.125, 0.27))  # 7/8 of the hard half never solved
  assert ok and "pass@256 0.125" in message
  assert not tuning.hard_tail_verdict(warm(0.2, 0.6, 0.27))[0]  # most hard problems solved sometimes
  assert not tuning.hard_tail_verdict(warm(0.0, 0.0, 0.01))[0]  # the easy half gives no signal


def test_auc_choice_and_edge_extension():
  assert tuning.auc([(0, 0.0), (10, 1.0)]) == pytest.approx(0.5)
  assert tuning.auc([(0, 0.2), (10, 0.4), (30, 0.4)]) == pytest.approx((3 + 8) / 30)
  fast, slow = [(0, 0.2), (10, 0.8), (20, 0.8)], [(0, 0.2), (10, 0.3), (20, 0.8)]
  assert tuning.auc(fast) > tuning.auc(slow)  # same end, the faster riser wins
  assert tuning.choose({1e-4: 0.5, 3e-4: 0.6, 3e-5: 0.6}) == 3e-5  # a tie goes to the smaller lr
  grid = [3e-5, 1e-4, 3e-4]
  assert tuning.edge(grid, 1e-4) is None and tuning.edge(grid, 3e-4) == "high" and tuning.edge([1e-4], 1e-4) is None
  points = {"low": 1e-5, "high": 1e-3}
  assert tuning.extension({"oapl": (grid, 1e-4), "grpo": (grid, 1e-4)}, points) == []
  assert tuning.extension({"oapl": (grid, 3e-4), "grpo": (grid, 1e-4)}, points) == [1e-3]
  assert tuning.extension({"oapl": (grid, 3e-4), "grpo": (grid, 3e-5)}, points) == [1e-5, 1e-3]


def test_plan_arms_shapes_and_equal_generation_budget():
  study = plan.Study(False, steps=200, lag=50, long_lag=100, batch=8, every_steps=10)
  arms = study.arms()
  gens = {}
  for key, arm in arms.items():
    o = plan.loop_overrides(study, arm)
    assert o["loop.sync_every"] * o["loop.num_syncs"] == 200
    windows_chunks = -(-o["loop.sync_every"] // o["loop.steps_per_rollout"])
    gens[key] = o["loop.num_syncs"] * windows_chunks * o["loop.prompts_per_rollout"] * 8
  assert {gens[k] for k in arms if arms[k].shape != "reuse2"} == {200 * 8 * 8}
  assert gens["oapl_L50_reuse2"] == 200 * 8 * 8 // 2
  obo = plan.loop_overrides(study, arms["grpo_obo"])
  assert (obo["loop.sync_every"], obo["loop.steps_per_rollout"], obo["loop.prompts_per_rollout"],
          obo["loop.sampler_delay_windows"]) == (2, 2, 16, 1)
  assert arms["grpo_onpolicy"].lag == 1 and arms["grpo_onpolicy"].loss == "grpo_onpolicy"
  assert [k for k in arms if arms[k].loss == "grpo"] == ["grpo_obo", "hard_tail/grpo_obo"]  # no 'grpo at lag 1'
  assert arms["oapl_L100"].lag == 100 and plan.loop_overrides(study, arms["oapl_L100"])["loop.num_syncs"] == 2
  assert arms["oapl_L100"].tier == "claim" and study.tuning_arm("grpo").name == "grpo_obo"
  cell = plan.Cell(arms["grpo_obo"], 1e-4, 3)
  cmd = plan.command(study, cell, "/w/warm", "runs/x")
  assert cmd.startswith("python -m oapl_jax.main --config configs/claims.py:arithmetic --workdir runs/x")
  for flag in ("--config.loop.sampler_delay_windows=1", "--config.seed=3", "--config.trainer.loss=grpo"):
    assert flag in cmd


def test_priority_order_is_round_robin_by_seed():
  study = plan.Study(False, steps=200, lag=50, long_lag=100, batch=8, every_steps=10)
  chosen = {"oapl": 1e-4, "grpo": 1e-4, "grpo_onpolicy": 3e-5}
  cells = plan.main_cells(study, chosen)
  claim_arms = [k for k, a in study.arms().items() if a.tier == "claim"]
  first = cells[:2 * (len(claim_arms) + 1)]  # seeds 0 and 1 of every claim arm and the baseline
  assert {c.seed for c in first} == {0, 1}
  assert {(c.arm.task, c.arm.name) for c in first} == {(a.task, a.name) for k, a in study.arms().items()
                                                        if a.tier in ("claim", "baseline")}
  assert [c.seed for c in cells] == sorted(c.seed for c in cells)  # rounds never go back a seed
  by_arm = {}
  for c in cells:
    by_arm.setdefault((c.arm.task, c.arm.name), []).append(c.seed)
  assert by_arm[("arithmetic", "oapl_L50")] == list(range(8))
  assert by_arm[("arithmetic", "grpo_onpolicy")] == list(range(5))
  assert plan.TUNE_SEED not in {c.seed for c in cells}
  assert all(c.lr == chosen[c.arm.loss] for c in cells)
  assert not [c for c in plan.main_cells(study, chosen, hard_tail=False) if c.arm.task == "hard_tail"]


def test_paired_configs_differ_only_in_the_method(tmp_path):
  from experiments import claims
  from oapl_jax.run import schema
  study = plan.Study(False, steps=200, lag=50, long_lag=100, batch=8, every_steps=10)
  arms = study.arms()
  records = {}
  for key in ("oapl_L50", "grpo_obo", "oapl_L100", "oapl_L50_reuse2", "grpo_onpolicy"):
    cfg = claims.run_config(study, plan.Cell(arms[key], 1e-4 if key != "grpo_onpolicy" else 3e-4, 2), str(tmp_path))
    records[key] = schema.to_mapping(schema.from_config(cfg))
  for key in records:
    assert plan.config_differences(records["oapl_L50"], records[key]) == []
  other_seed = schema.to_mapping(schema.from_config(claims.run_config(study, plan.Cell(arms["grpo_obo"], 1e-4, 3),
                                                                      str(tmp_path))))
  assert plan.config_differences(records["grpo_obo"], other_seed) == ["seed"]
  assert records["oapl_L50"]["trainer"]["loss_settings"]["oapl"]["beta1"] == 1.0
  assert (records["grpo_obo"]["eval"]["every_steps"], records["grpo_obo"]["sampler"]["temperature"],
          records["grpo_obo"]["eval"]["temperature"], records["grpo_obo"]["eval"]["top_p"]) == (10, 1.0, 0.6, 0.95)


def _run(curve, generations=1000, steps=100):
  history = [{"step": s, "policy_eval/val/pass@1": v} for s, v in curve]
  return RunResult(None, {"generations": generations, "trainer_steps": steps}, history)


def test_generations_to_target_and_claim5_rule():
  r = _run([(0, 0.2), (10, 0.4), (20, 0.6), (30, 0.9)])  # 10 generations per step
  assert r.generations_to(0.5) == pytest.approx(150.0)  # crosses halfway between steps 10 and 20
  assert r.generations_to(0.95) == math.inf and math.isnan(r.generations_to(0.1))
  oapl = _run([(0, 0.2), (10, 0.6), (20, 0.9)], generations=500)  # 5 per step: 0.5 at step 7.5, 0.8 at 16.67
  grpo = _run([(0, 0.2), (10, 0.4), (20, 0.6), (30, 0.9)])  # 10 per step: 0.5 at step 15, 0.8 at 26.67
  expected = np.mean([math.log2(150 / 37.5), math.log2((20 + 20 / 3) * 10 / ((10 + 20 / 3) * 5))])
  assert claims_stats.claim5_log_ratio(oapl, grpo) == pytest.approx(expected)
  never = _run([(0, 0.2), (100, 0.3)])
  assert claims_stats.claim5_log_ratio(never, never) == 0.0
  assert claims_stats.claim5_log_ratio(never, grpo) <= 0.0 and claims_stats.claim5_log_ratio(oapl, never) >= 0.0


def test_hard_tail_halves():
  from oapl_jax import config_base
  base = config_base.arithmetic_task(2, 512, 256)
  base.teacher_slip_rate = 0.5
  task, tests = hard_tail_task.build(dict(base=base, num_val=16, num_test=32, hard_slip_rate=1.0))
  assert {k: len(v) for k, v in task.eval_sets.items()} == {"val_easy": 16, "val_hard": 16}
  assert {k: len(v) for k, v in tests.items()} == {"test_easy": 32, "test_hard": 32}
  assert all(int(p.prompt.split("+")[0]) % 2 == 1 for p in tests["test_hard"] + task.eval_sets["val_hard"])
  assert all(int(p.prompt.split("+")[0]) % 2 == 0 for p in tests["test_easy"])
  demos = task.demonstrations(0)
  wrong = {True: [], False: []}
  for p, d in zip(task.train, demos):
    wrong[hard_tail_task.is_hard(p)].append(task.tokenizer.decode(d.completion_tokens[:-1]) != p.answer)
  assert all(wrong[True]) and 0.3 < np.mean(wrong[False]) < 0.7
  assert hard_tail_task.is_hard(task.train[0]) == (int(task.train[0].prompt.split("+")[0]) % 2 == 1)
