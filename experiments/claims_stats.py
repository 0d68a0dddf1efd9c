"""The five claims as paired tests, each fixed before any run: which arms, which per-seed number, which
direction. Every claim is one paired difference per RL seed; the five sign-flip p-values are Holm-adjusted
together (experiments/paired_stats.py); the comparisons outside the family are reported unadjusted.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import numpy as np

from experiments import paired_stats, plan, tuning
from experiments.results import RunResult

TARGETS = (0.5, 0.8)  # claim 5: validation pass@1 levels to reach
CLAIM5_RULE = ("per seed, the mean over the targets the warm start is below of log2(generations GRPO / generations "
               "OAPL) to reach them (the crossing interpolated between grid steps); a target neither reaches counts "
               "0; one only OAPL reaches counts max(log2(GRPO's budget / OAPL's), 0), one only GRPO reaches "
               "min(log2(GRPO's / OAPL's budget), 0)")


def claim5_log_ratio(oapl: RunResult, grpo: RunResult, targets=TARGETS) -> float:
  """CLAIM5_RULE for one seed (nan when the warm start is at or above every target)."""
  parts = []
  for target in targets:
    o, g = oapl.generations_to(target), grpo.generations_to(target)
    if math.isnan(o) or math.isnan(g):
      continue
    if math.isinf(o) and math.isinf(g):
      parts.append(0.0)
    elif math.isinf(g):
      parts.append(max(math.log2(grpo.final["generations"] / o), 0.0))
    elif math.isinf(o):
      parts.append(min(math.log2(g / oapl.final["generations"]), 0.0))
    else:
      parts.append(math.log2(max(g, 1e-9) / max(o, 1e-9)))
  return float(np.mean(parts)) if parts else float("nan")


def test_pass(split: str, k: int) -> Callable[[RunResult], float]:
  return lambda r: r.test(split, f"pass@{k}")


def late_entropy(r: RunResult) -> float:
  return r.late_mean("token_entropy")


@dataclasses.dataclass(frozen=True)
class Claim:
  key: str  # '1'..'5'
  title: str
  arm: str  # the claimed-better arm (Study.arms key)
  comparator: str  # an arm, or 'warm start'
  statistic: str  # what one seed contributes, in words
  value: Optional[Callable[[RunResult], float]] = None  # per-run number (the difference is arm - comparator)
  pair: Optional[Callable[[RunResult, RunResult], float]] = None  # or a per-seed number of the pair itself
  margin: Optional[float] = None
  units: str = ""


def claims(study: plan.Study) -> list[Claim]:
  L, LL = study.lag, study.long_lag
  kmax = 8 if study.smoke else 256
  return [
      Claim("1", "OAPL beats GRPO (off-by-one) on pass@1", f"oapl_L{L}", "grpo_obo",
            "task A test pass@1 of the final policy (T 0.6, top-p 0.95)", test_pass("test", 1)),
      Claim("2", "OAPL keeps a higher entropy", f"oapl_L{L}", "grpo_obo",
            "the current policy's own per-token entropy on its T = 1 samples (policy_eval/val/token_entropy), "
            "mean over the grid steps of the run's second half", late_entropy, units="nats/token"),
      Claim("3", f"OAPL at L = {LL} still learns", f"oapl_L{LL}", "warm start",
            f"task A test pass@1 at the end minus the warm start's; supported only if the interval's lower end "
            f"clears +{tuning.PILOT_GAIN}", test_pass("test", 1), margin=tuning.PILOT_GAIN),
      Claim("4", f"OAPL scales better under pass@k (k = {kmax}, hard half)", f"hard_tail/oapl_L{L}",
            "hard_tail/grpo_obo", f"task B test pass@{kmax} on the hard half (the teacher always wrong there)",
            test_pass("test_hard", kmax)),
      Claim("5", "OAPL needs fewer generations (each rollout used twice)", f"oapl_L{L}_reuse2", "grpo_obo",
            CLAIM5_RULE, pair=lambda a, b: claim5_log_ratio(a, b), units="log2 ratio"),
  ]


@dataclasses.dataclass
class Outcome:
  claim: Claim
  seeds: list[int]
  summary: paired_stats.Paired
  planned_n: int
  holm_p: float = float("nan")
  verdict: str = "missing"


def per_seed(runs: dict[str, dict[int, RunResult]], arm: str, value: Callable) -> dict[int, float]:
  return {seed: value(r) for seed, r in runs.get(arm, {}).items()}


def evaluate_claims(study: plan.Study, runs: dict[str, dict[int, RunResult]], warm: dict) -> list[Outcome]:
  """runs: arm key -> seed -> result (main seeds only). warm: task -> warm start eval.json (claim 3)."""
  arms = study.arms()
  out = []
  for c in claims(study):
    if c.pair is not None:
      a, b = runs.get(c.arm, {}), runs.get(c.comparator, {})
      values = {s: c.pair(a[s], b[s]) for s in sorted(set(a) & set(b))}
      seeds = [s for s, v in values.items() if np.isfinite(v)]
      diffs = [values[s] for s in seeds]
    elif c.comparator == "warm start":
      start = (warm.get(arms[c.arm].task) or {}).get("test", {}).get("test", {}).get("pass@1")
      mine = per_seed(runs, c.arm, c.value)
      seeds = sorted(mine) if start is not None else []
      diffs = [mine[s] - start for s in seeds]
    else:
      seeds, diffs = paired_stats.differences(per_seed(runs, c.arm, c.value), per_seed(runs, c.comparator, c.value))
    planned_n = min(plan.planned(study, arms[c.arm]),
                    plan.planned(study, arms[c.comparator]) if c.comparator in arms else 99)
    out.append(Outcome(c, seeds, paired_stats.paired(diffs), planned_n))
  adjusted = paired_stats.holm({o.claim.key: o.summary.p for o in out})
  for o in out:
    o.holm_p = adjusted[o.claim.key]
    o.verdict = paired_stats.verdict(o.summary, o.holm_p, margin=o.claim.margin, planned_n=o.planned_n)
  return out


def secondary_pairs(study: plan.Study) -> list[tuple[str, str, str, Callable]]:
  """(label, arm, comparator, per-run value): the comparisons outside the Holm family (unadjusted p)."""
  L, LL = study.lag, study.long_lag
  p1 = test_pass("test", 1)
  rows = [("OAPL L=%d vs on-policy GRPO, test pass@1" % L, f"oapl_L{L}", "grpo_onpolicy", p1),
          ("GRPO off-by-one vs on-policy GRPO, test pass@1", "grpo_obo", "grpo_onpolicy", p1),
          (f"OAPL L={LL} vs L={L}, test pass@1", f"oapl_L{LL}", f"oapl_L{L}", p1),
          (f"OAPL L={L} reuse-2 vs fresh, test pass@1 (half the generations)", f"oapl_L{L}_reuse2", f"oapl_L{L}", p1),
          ("task B easy half: OAPL vs GRPO off-by-one, test pass@1", f"hard_tail/oapl_L{L}", "hard_tail/grpo_obo",
           test_pass("test_easy", 1)),
          ("task B hard half: OAPL vs GRPO off-by-one, test pass@1", f"hard_tail/oapl_L{L}", "hard_tail/grpo_obo",
           test_pass("test_hard", 1))]
  rows += [(f"OAPL L={L} vs {loss.upper()} L={L}, test pass@1", f"oapl_L{L}", f"{loss}_L{L}", p1)
           for loss in plan.SECONDARY_LOSSES]
  rows += [(f"OAPL L=1 beta1={b:g} vs beta1=1, test pass@1", f"oapl_L1_beta1_{b:g}", "oapl_L1_beta1_1", p1)
           for b in plan.BETA1_PROBE if b != 1.0]
  return rows
