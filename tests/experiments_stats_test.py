"""The claims study's decisions without any run: paired statistics against hand-computed values, the verdict
rule, the pilot, headroom and tuning rules on synthetic curves, the interpolation and the matched comparison
by hand, the cell plan and its priority order, the validation/test split, task B's halves."""
import dataclasses
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
  assert tuning.pilot_verdict(saturates, 200, ceiling=None).ok  # the study's call: the headroom rule decides
  assert not tuning.pilot_verdict([], 200).ok
  assert tuning.pilot_verdict([(0, 0.1), (30, 0.5), (70, 0.5)], 100).step == 30  # nearest to 50, earlier on a tie


def test_headroom_rule_per_arm():
  steps = list(range(0, 301, 10))
  slow = [(s, 0.1 + 0.6 * s / 300) for s in steps]  # 0.4 at step 150
  fast = [(s, min(0.1 + s / 100, 0.97)) for s in steps]  # 0.97 from step 90
  h = tuning.headroom(slow, 300)
  assert h.ok and h.step == 150 and h.mid == pytest.approx(0.4)
  h = tuning.headroom(fast, 300)
  assert not h.ok and h.mid == pytest.approx(0.97) and "ceiling" in h.message
  assert not tuning.headroom([(0, 0.1), (150, 0.9)], 300).ok  # the rule is strict: 0.9 itself has no headroom
  assert not tuning.headroom([], 300).ok


def test_auc_and_choice_over_lr_and_knob():
  assert tuning.auc([(0, 0.0), (10, 1.0)]) == pytest.approx(0.5)
  assert tuning.auc([(0, 0.2), (10, 0.4), (30, 0.4)]) == pytest.approx((3 + 8) / 30)
  fast, slow = [(0, 0.2), (10, 0.8), (20, 0.8)], [(0, 0.2), (10, 0.3), (20, 0.8)]
  assert tuning.auc(fast) > tuning.auc(slow)  # same end, the faster riser wins
  assert tuning.choose({1e-4: 0.5, 3e-4: 0.6, 3e-5: 0.6}) == 3e-5  # a tie goes to the smaller lr
  scores = {(1e-4, 0.5): 0.70, (1e-4, 0.1): 0.74, (3e-4, 0.25): 0.74, (3e-5, 0.25): 0.60}
  assert tuning.choose(scores) == (1e-4, 0.1)  # beta2 0.1 wins at lr 1e-4; the tie goes to the smaller lr
  grid = [3e-5, 1e-4, 3e-4]
  assert tuning.edge(grid, 1e-4) is None and tuning.edge(grid, 3e-4) == "high" and tuning.edge([1e-4], 1e-4) is None


def _study(**kw):
  return plan.Study("arithmetic", "configs/claims.py:arithmetic", False, steps=kw.pop("steps", 300), lag=50,
                    long_lag=100, batch=8, every_steps=10, **kw)


def test_every_loss_tunes_its_own_knob_with_the_same_budget():
  from oapl_jax.run import files, schema
  study = _study()
  grids = {loss: study.grid(loss) for loss in study.losses()}
  assert {len(g) for g in grids.values()} == {9}  # 3 lrs x 3 knob values, every loss alike
  assert sorted({v for _, v in grids["oapl"]}) == [0.1, 0.25, 0.5]  # OAPL's binding knob is beta2
  assert sorted({v for _, v in grids["grpo"]}) == [0.1, 0.2, 0.3]
  assert study.middle("oapl") == (1e-4, 0.25) and study.middle("grpo") == (1e-4, 0.2)
  for loss, (key, values) in plan.KNOBS.items():  # each knob is a real field of that loss's settings
    cfg = files.load("configs/claims.py:arithmetic", {"trainer.loss": loss, key: values[0],
                                                     "loop.sync_every": 1, "loop.num_syncs": 4})
    rc = schema.from_config(cfg)
    assert getattr(rc.trainer.loss_settings, key.rsplit(".", 1)[1]) == values[0]
  smoke = dataclasses.replace(study, knob_points=1, learning_rates=(1e-4,))
  assert smoke.grid("oapl") == [(1e-4, 0.25)]
  pilots = plan.pilot_cells(study)
  assert [c.arm.name for c in pilots] == ["oapl_L50", "grpo_obo", "oapl_L100", "oapl_L50_reuse2", "grpo_onpolicy"]
  assert all(c.seed == plan.TUNE_SEED and c.setting == study.middle(c.arm.loss) for c in pilots)
  assert pilots[0] in plan.tuning_cells(study, "oapl")  # the main arms' pilots are tuning runs too


def test_plan_arms_shapes_and_equal_generation_budget():
  study = _study(steps=200)
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
  assert [k for k in arms if arms[k].loss == "grpo"] == ["grpo_obo"]  # no 'grpo at lag 1'
  assert arms["oapl_L100"].lag == 100 and plan.loop_overrides(study, arms["oapl_L100"])["loop.num_syncs"] == 2
  assert arms["oapl_L100"].tier == "claim" and study.tuning_arm("grpo").name == "grpo_obo"
  cell = study.cell(arms["grpo_obo"], (1e-4, 0.2), 3)
  assert cell.name == "arithmetic/grpo_obo/lr0.0001_clip_eps0.2/seed3"
  cmd = plan.command(study, cell, "/w/warm", "runs/x")
  assert cmd.startswith("python -m oapl_jax.main --config configs/claims.py:arithmetic --workdir runs/x")
  for flag in ("--config.loop.sampler_delay_windows=1", "--config.seed=3", "--config.trainer.loss=grpo",
               "--config.trainer.loss_settings.grpo.clip_eps=0.2", "--config.eval.every_steps=10"):
    assert flag in cmd


def test_study_of_a_named_task_or_any_config():
  assert plan.study_config("arithmetic", None) == ("arithmetic", "configs/claims.py:arithmetic")
  assert plan.study_config(None, "configs/own_task.py") == ("own_task",
                                                            "experiments/task_config.py:configs/own_task.py")
  assert plan.study_config(None, "configs/own_task.py:smoke")[0] == "own_task_smoke"
  with pytest.raises(ValueError, match="--config FILE"):
    plan.study_config("gsm8k", None)
  study = plan.make_study(config="configs/own_task.py")
  assert (study.batch, study.steps, study.lag, study.long_lag) == (16, 300, 50, 100)
  assert study.steps // study.long_lag >= 3  # claim 3: several windows at the long lag


def test_the_warm_start_is_keyed_by_what_it_is_made_from():
  study = plan.make_study(config="configs/own_task.py")
  key = plan.warm_key(study)
  assert len(key) == 12 and key == plan.warm_key(plan.make_study(config="configs/own_task.py"))
  assert plan.warm_key(dataclasses.replace(study, shared=(("trainer.optim.lr", 3e-4),))) == key  # not read by it
  assert plan.warm_key(dataclasses.replace(study, shared=(("warmstart.steps", 5),))) != key
  assert plan.warm_key(dataclasses.replace(study, shared=(("seed", 1),))) != key
  assert plan.warm_key(plan.make_study(config="configs/own_task.py", smoke=True)) != key


def test_a_reshaped_study_has_its_own_name_shape_and_warm_start():
  """--set: the reshape reaches every cell's overrides and the warm start, and names the directories, so it never
  resumes the unshaped study's runs."""
  plain = plan.make_study(config="configs/own_task.py")
  shaped = plan.make_study(config="configs/own_task.py", sets={"loop.batch_prompts": 4, "warmstart.steps": 500})
  assert shaped.name == "own_task_batch_prompts4_steps500" and shaped.batch == 4
  assert dict(shaped.shared) == {"loop.batch_prompts": 4, "warmstart.steps": 500}
  cell = shaped.cell(shaped.arms()["oapl_L50"], (1e-4, 0.25), 0)
  assert plan.overrides(shaped, cell, "/w")["warmstart.steps"] == 0  # a cell starts from the warm start
  assert plan.overrides(shaped, cell, "/w")["loop.batch_prompts"] == 4
  assert plan.warm_key(shaped) != plan.warm_key(plain)
  assert "--config.loop.batch_prompts=4" in plan.command(shaped, cell, "/w", "/x")


def test_the_warm_start_key_names_the_devices(monkeypatch):
  import jax
  study = plan.make_study(config="configs/own_task.py")
  key = plan.warm_key(study)
  monkeypatch.setattr(jax, "device_count", lambda: jax.local_device_count() + 1)
  assert plan.warm_key(study) != key  # another device count computes other params from the same seed


def test_priority_order_is_round_robin_by_seed():
  study = _study()
  chosen = {"oapl": (1e-4, 0.25), "grpo": (1e-4, 0.2), "grpo_onpolicy": (3e-5, 0.2)}
  cells = plan.main_cells(study, chosen)
  claim_arms = [k for k, a in study.arms().items() if a.tier == "claim"]
  first = cells[:2 * (len(claim_arms) + 1)]  # seeds 0 and 1 of every claim arm and the baseline
  assert {c.seed for c in first} == {0, 1}
  assert {c.arm.name for c in first} == {a.name for a in study.arms().values() if a.tier in ("claim", "baseline")}
  assert [c.seed for c in cells] == sorted(c.seed for c in cells)  # rounds never go back a seed
  by_arm = {}
  for c in cells:
    by_arm.setdefault(c.arm.name, []).append(c.seed)
  assert by_arm["oapl_L50"] == list(range(8))
  assert by_arm["grpo_onpolicy"] == list(range(5))
  assert plan.TUNE_SEED not in {c.seed for c in cells}
  assert all(c.setting == chosen[c.arm.loss] for c in cells)


def test_paired_configs_differ_only_in_the_method(tmp_path):
  from experiments import claims
  from oapl_jax.run import schema
  study = _study()
  arms = study.arms()
  records = {}
  for key in ("oapl_L50", "grpo_obo", "oapl_L100", "oapl_L50_reuse2", "grpo_onpolicy"):
    setting = (1e-4, 0.1) if arms[key].loss == "oapl" else (3e-4, 0.3)
    cfg = claims.run_config(study, study.cell(arms[key], setting, 2), str(tmp_path))
    records[key] = schema.to_mapping(schema.from_config(cfg))
  for key in records:
    assert plan.config_differences(records["oapl_L50"], records[key]) == []
  assert records["oapl_L50"]["trainer"]["loss_settings"]["oapl"]["beta2"] == 0.1
  other_seed = schema.to_mapping(schema.from_config(claims.run_config(
      study, study.cell(arms["grpo_obo"], (3e-4, 0.3), 3), str(tmp_path))))
  assert plan.config_differences(records["grpo_obo"], other_seed) == ["seed"]
  assert records["oapl_L50"]["trainer"]["loss_settings"]["oapl"]["beta1"] == 1.0
  assert (records["grpo_obo"]["eval"]["every_steps"], records["grpo_obo"]["sampler"]["temperature"],
          records["grpo_obo"]["eval"]["temperature"], records["grpo_obo"]["eval"]["top_p"]) == (10, 1.0, 0.6, 0.95)


def _run(curve, generations=1000, steps=100, test=None, **other):
  history = [{"step": s, "policy_eval/val/pass@1": v} for s, v in curve]
  for key, values in other.items():  # e.g. token_entropy=[(step, value), ...]
    for h, (s, v) in zip(history, values):
      assert h["step"] == s
      h[f"policy_eval/val/{key.replace('pass', 'pass@')}"] = v
  final = {"generations": generations, "trainer_steps": steps, "test": {"test": test or {"pass@1": 0.0}}}
  return RunResult(None, final, history)


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


def test_interpolation_and_first_crossing_by_hand():
  curve = [(0, 0.2), (10, 0.6), (20, 0.8)]
  assert claims_stats.interpolate(curve, 15) == pytest.approx(0.7)  # halfway between 0.6 and 0.8
  assert claims_stats.interpolate(curve, 0) == pytest.approx(0.2) and claims_stats.interpolate(curve, 20) == 0.8
  assert math.isnan(claims_stats.interpolate(curve, 25)) and math.isnan(claims_stats.interpolate([], 1))
  assert claims_stats.first_crossing(curve, 0.7) == pytest.approx(15.0)  # 10 + (0.7 - 0.6) / 0.2 * 10
  assert claims_stats.first_crossing(curve, 0.3) == pytest.approx(2.5)  # (0.3 - 0.2) / 0.4 * 10
  assert claims_stats.first_crossing(curve, 0.1) == 0.0  # starts there
  assert math.isnan(claims_stats.first_crossing(curve, 0.9))
  dips = [(0, 0.2), (10, 0.7), (20, 0.5), (30, 0.9)]
  assert claims_stats.first_crossing(dips, 0.6) == pytest.approx(8.0)  # the first crossing, not a later one


def test_matched_comparison_at_validation_pass1_by_hand():
  # A rises faster and ends higher; B reaches only 0.7. Matched level: min(0.8, 0.7) = 0.7.
  a_p1, a_ent = [(0, 0.2), (10, 0.6), (20, 0.8)], [(0, 1.0), (10, 0.8), (20, 0.6)]
  b_p1, b_ent = [(0, 0.2), (10, 0.4), (20, 0.7)], [(0, 1.0), (10, 0.9), (20, 0.5)]
  m = claims_stats.matched_at_pass1(a_p1, a_ent, b_p1, b_ent)
  assert m.level == pytest.approx(0.7)
  assert (m.step_a, m.step_b) == (pytest.approx(15.0), pytest.approx(20.0))  # A at 15 (interpolated), B at 20
  assert m.value_a == pytest.approx(0.7) and m.value_b == pytest.approx(0.5)  # entropy 0.8 -> 0.6 halfway: 0.7
  assert m.diff == pytest.approx(0.2)
  # at matched steps (the end) the same runs give 0.6 - 0.5 = 0.1: the two views differ, as they should
  flat = [(0, 0.2), (10, 0.2), (20, 0.2)]
  assert math.isnan(claims_stats.matched_at_pass1(flat, a_ent, b_p1, b_ent).diff)  # no progress both made
  # through RunResult: pass@k - pass@1 on the eval grid, matched the same way
  a = _run(a_p1, pass4=[(0, 0.5), (10, 0.8), (20, 0.9)], token_entropy=a_ent)
  b = _run(b_p1, pass4=[(0, 0.5), (10, 0.7), (20, 0.8)], token_entropy=b_ent)
  assert a.val_kmax() == 4
  assert claims_stats.passk_gap_curve(a) == [(0, pytest.approx(0.3)), (10, pytest.approx(0.2)),
                                             (20, pytest.approx(0.1))]
  # gaps: A at step 15 -> 0.15; B at step 20 -> 0.1
  assert claims_stats.matched_pair(claims_stats.passk_gap_curve)(a, b) == pytest.approx(0.05)
  assert claims_stats.matched_pair(lambda r: r.curve("token_entropy"))(a, b) == pytest.approx(0.2)


def test_claims_from_synthetic_runs_by_hand():
  study = _study()
  rise = [(0, 0.2), (150, 0.5), (300, 0.7)]
  runs = {}
  for seed in range(3):
    runs.setdefault("oapl_L50", {})[seed] = _run(rise, 19200, 300, {"pass@1": 0.70 + 0.01 * seed})
    runs.setdefault("oapl_L100", {})[seed] = _run(rise, 19200, 300, {"pass@1": 0.68 + 0.02 * seed})
    runs.setdefault("grpo_obo", {})[seed] = _run(rise, 19200, 300, {"pass@1": 0.60})
  outcomes = {o.claim.key: o for o in claims_stats.evaluate_claims(study, runs)}
  assert outcomes["1"].summary.diffs == pytest.approx((0.10, 0.11, 0.12))
  # claim 3: (L100 - L50) + 0.05 per seed: -0.02 + 0.05, -0.01 + 0.05, 0 + 0.05
  assert outcomes["3"].summary.diffs == pytest.approx((0.03, 0.04, 0.05))
  assert outcomes["3"].claim.comparator == "oapl_L50"
  # claim 5: the same curves and budgets: log2 ratio 0 per seed; the best candidate of those present
  assert outcomes["5"].summary.diffs == pytest.approx((0.0, 0.0, 0.0)) and outcomes["5"].arm == "oapl_L50"
  assert outcomes["5"].summary.p == 1.0  # 1 x 3, capped at 1
  assert outcomes["2"].summary.n == 0  # no entropy curve logged: missing, never a made-up number
  auc = {o.claim.key: o for o in claims_stats.evaluate_claims(study, runs, primary="auc")}
  assert auc["1"].summary.diffs == pytest.approx((0.0, 0.0, 0.0))  # equal curves: equal AUC


def test_split_task_named_and_halved(tmp_path):
  from oapl_jax.run import config_base
  from experiments import split_task
  data = "examples/sort_letters"
  records = config_base.records_task(train_path=f"{data}/train.jsonl", reward="examples.sort_letters.reward:score",
                                     eval_paths={"dev": f"{data}/dev.jsonl", "test": f"{data}/test.jsonl"})
  task, tests = split_task.build(dict(base=records, test_sets="auto"))
  assert list(task.eval_sets) == ["dev"] and list(tests) == ["test"]
  task2, tests2 = split_task.build(dict(base=records, test_sets="dev"))
  assert list(task2.eval_sets) == ["test"] and list(tests2) == ["dev"]
  with pytest.raises(ValueError, match="validation set"):
    split_task.build(dict(base=records, test_sets="dev,test"))
  arithmetic = config_base.arithmetic_task(2, 64, 40)
  task3, tests3 = split_task.build(dict(base=arithmetic, test_sets="auto", num_val=0, num_test=0))
  assert (len(task3.eval_sets["val"]), len(tests3["test"])) == (20, 20)
  assert not {p.prompt for p in task3.eval_sets["val"]} & {p.prompt for p in tests3["test"]}
  task4, tests4 = split_task.build(dict(base=arithmetic, num_val=8, num_test=16))
  assert (len(task4.eval_sets["val"]), len(tests4["test"])) == (8, 16)


def test_hard_tail_halves():
  from oapl_jax.run import config_base
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


def test_a_claim1_study_has_no_choice_for_claim5_so_no_multiplier():
  """Claim 5 takes OAPL's best arm and multiplies its p by the number it chose from; a claim-1 study has one OAPL
  arm, so its p is the plain sign-flip p (2 / 2^3 for three seeds, all the same sign)."""
  study = _study(claim1_only=True)
  assert set(study.arms()) == {"oapl_L50", "grpo_obo"}
  fast, slow = [(0, 0.2), (150, 0.6), (300, 0.7)], [(0, 0.2), (150, 0.3), (300, 0.7)]
  runs = {"oapl_L50": {s: _run(fast, 19200, 300) for s in range(3)},
          "grpo_obo": {s: _run(slow, 19200, 300) for s in range(3)}}
  c5 = {o.claim.key: o for o in claims_stats.evaluate_claims(study, runs)}["5"]
  assert all(d > 0 for d in c5.summary.diffs)
  assert c5.summary.p == pytest.approx(0.25)
  assert "no multiplier" in c5.claim.statistic
  full = {o.claim.key: o for o in claims_stats.evaluate_claims(_study(), runs)}["5"]
  assert "multiplied by 3" in full.claim.statistic
