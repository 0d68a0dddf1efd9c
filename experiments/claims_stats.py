"""The five claims as paired tests, each fixed before any run: which arms, which per-seed number, which
direction. Every claim is one paired difference per RL seed; the five sign-flip p-values are Holm-adjusted
together (experiments/paired_stats.py); the comparisons outside the family are reported unadjusted.

Matched progress. Entropy and pass@k are compared at matched validation pass@1 (claims 2 and 4), not only at
matched steps, where a slower method's higher entropy is its lower pass@1: for one seed the level is the highest
validation pass@1 both arms reached (min of their peaks); each arm's metric is read, linearly interpolated on
the eval grid, at the step where its pass@1 curve first reaches that level (also interpolated).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

import numpy as np

from experiments import paired_stats, plan
from experiments.results import RunResult

TARGETS = (0.5, 0.8)  # claim 5: validation pass@1 levels to reach
NONINFERIORITY = 0.05  # claim 3: L = LL no worse than L by more than this (pass@1 or AUC units)
CLAIM5_RULE = ("per seed, the mean over the targets the warm start is below of log2(generations GRPO / generations "
               "OAPL) to reach them (the crossing interpolated between grid steps); a target neither reaches counts "
               "0; one only OAPL reaches counts max(log2(GRPO's budget / OAPL's), 0), one only GRPO reaches "
               "min(log2(GRPO's / OAPL's budget), 0)")
Curve = Sequence[tuple[float, float]]


# ------------------------------------------------------------------------------ matched progress
def interpolate(curve: Curve, x: float) -> float:
  """The curve's value at x, linear between its points; nan outside its span or for an empty curve."""
  if not curve or not curve[0][0] <= x <= curve[-1][0]:
    return float("nan")
  xs, ys = zip(*curve)
  return float(np.interp(x, xs, ys))


def first_crossing(curve: Curve, level: float) -> float:
  """The step where the curve first reaches `level`, linear between the grid points around it (its first step
  when it starts there); nan if it never does."""
  if not curve:
    return float("nan")
  if curve[0][1] >= level:
    return float(curve[0][0])
  for (s0, v0), (s1, v1) in zip(curve, curve[1:]):
    if v1 >= level:
      return s0 + (level - v0) / (v1 - v0) * (s1 - s0)
  return float("nan")


@dataclasses.dataclass(frozen=True)
class Matched:
  level: float  # the validation pass@1 both reached
  step_a: float
  step_b: float
  value_a: float
  value_b: float

  @property
  def diff(self) -> float:
    return self.value_a - self.value_b


def matched_at_pass1(pass1_a: Curve, metric_a: Curve, pass1_b: Curve, metric_b: Curve) -> Matched:
  """Two runs' metric at matched validation pass@1 (the module docstring's rule); nan values when neither rose
  above the common start."""
  level = min(max(v for _, v in pass1_a), max(v for _, v in pass1_b))
  if level <= max(pass1_a[0][1], pass1_b[0][1]):  # no progress both made: nothing to match
    return Matched(level, float("nan"), float("nan"), float("nan"), float("nan"))
  sa, sb = first_crossing(pass1_a, level), first_crossing(pass1_b, level)
  return Matched(level, sa, sb, interpolate(metric_a, sa), interpolate(metric_b, sb))


def matched_pair(metric: Callable[[RunResult], Curve]) -> Callable[[RunResult, RunResult], float]:
  """Per seed: arm's metric minus comparator's at matched validation pass@1."""
  return lambda a, b: matched_at_pass1(a.curve(), metric(a), b.curve(), metric(b)).diff


def passk_gap_curve(r: RunResult) -> list[tuple[int, float]]:
  """Validation pass@k_max - pass@1 on the eval grid (k_max: the largest k the loop's eval logs)."""
  return [(s, v - p) for (s, v), (_, p) in zip(r.curve(f"pass@{r.val_kmax()}"), r.curve())]


# ------------------------------------------------------------------------------ per-run numbers
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


def test_pass1(r: RunResult) -> float:
  return r.test_mean("pass@1")


def test_passk_gap(r: RunResult) -> float:
  """Test pass@k_max - pass@1 of the final policy (mean over the test sets)."""
  return r.test_mean(f"pass@{r.test_kmax()}") - r.test_mean("pass@1")


def val_auc(r: RunResult) -> float:
  from experiments import tuning  # pylint: disable=import-outside-toplevel
  return tuning.auc(r.curve())


def late_entropy(r: RunResult) -> float:
  return r.late_mean("token_entropy")


def primary_value(metric: str) -> tuple[Callable[[RunResult], float], str]:
  """(per-run value, words) of the primary metric the pilot chose ('final' or 'auc')."""
  if metric == "auc":
    return val_auc, "the area under the validation pass@1 curve (mean level over the run)"
  return test_pass1, "test pass@1 of the final policy (T 0.6, top-p 0.95; mean over the test sets)"


@dataclasses.dataclass(frozen=True)
class Claim:
  key: str  # '1'..'5'
  title: str
  arm: str  # the claimed-better arm (Study.arms key)
  comparator: str  # an arm
  statistic: str  # what one seed contributes, in words
  value: Optional[Callable[[RunResult], float]] = None  # per-run number (the difference is arm - comparator)
  pair: Optional[Callable[[RunResult, RunResult], float]] = None  # or a per-seed number of the pair itself
  shift: float = 0.0  # added to every difference before the test (claim 3's non-inferiority margin)
  candidates: tuple[str, ...] = ()  # claim 5: the arm is the best of these the study has (its p times their number)
  units: str = ""


def _claim5_choice(study: plan.Study) -> tuple[tuple[str, ...], str]:
  """Claim 5's OAPL candidates that the study has, and the words for the choice: the p is multiplied by their
  number (a claim-1 study has one OAPL arm, so no choice and no multiplier)."""
  L, LL = study.lag, study.long_lag
  arms = study.arms()
  candidates = tuple(a for a in (f"oapl_L{L}", f"oapl_L{L}_reuse2", f"oapl_L{LL}") if a in arms)
  if len(candidates) <= 1:
    return candidates, f"OAPL's arm is oapl_L{L}, the study's only OAPL arm (no choice, no multiplier)"
  return candidates, (f"OAPL's arm is the best (largest mean) of {', '.join(candidates[:-1])} and {candidates[-1]}, "
                      f"its p multiplied by {len(candidates)} for that choice")


def claims(study: plan.Study, primary: str = "final") -> list[Claim]:
  L, LL = study.lag, study.long_lag
  value, words = primary_value(primary)
  candidates, choice = _claim5_choice(study)
  return [
      Claim("1", "OAPL beats GRPO (off-by-one) on pass@1", f"oapl_L{L}", "grpo_obo", words, value),
      Claim("2", "OAPL keeps a higher entropy (at matched validation pass@1)", f"oapl_L{L}", "grpo_obo",
            "the current policy's own per-token entropy on its T = 1 samples (policy_eval/<val>/token_entropy) at "
            "matched validation pass@1", pair=matched_pair(lambda r: r.curve("token_entropy")), units="nats/token"),
      Claim("3", f"OAPL at L = {LL} about as good as L = {L} ({study.steps // LL} windows)", f"oapl_L{LL}",
            f"oapl_L{L}", f"{words}, L = {LL} minus L = {L}, tested with the non-inferiority margin {NONINFERIORITY} "
            f"added: supported when L = {LL} is shown no worse than L = {L} by more than {NONINFERIORITY}", value,
            shift=NONINFERIORITY),
      Claim("4", "OAPL scales better under pass@k (pass@k - pass@1 at matched validation pass@1)", f"oapl_L{L}",
            "grpo_obo", "validation pass@k_max - pass@1 (k_max: the loop eval's largest k) at matched validation "
            "pass@1", pair=matched_pair(passk_gap_curve)),
      Claim("5", "OAPL at its best needs fewer generations", f"oapl_L{L}", "grpo_obo",
            f"{CLAIM5_RULE}; {choice}", pair=claim5_log_ratio, candidates=candidates, units="log2 ratio"),
  ]


@dataclasses.dataclass
class Outcome:
  claim: Claim
  arm: str
  seeds: list[int]
  summary: paired_stats.Paired
  planned_n: int
  holm_p: float = float("nan")
  verdict: str = "missing"

  def measured(self) -> paired_stats.Paired:
    """The differences as measured (arm minus comparator): a non-inferiority margin (Claim.shift) is added for the
    test only, so two arms at 0 show +0.0000, not the margin; p is the test's."""
    s, shift = self.summary, self.claim.shift
    if not shift:
      return s
    return dataclasses.replace(s, diffs=tuple(d - shift for d in s.diffs), mean=s.mean - shift,
                               ci_low=s.ci_low - shift, ci_high=s.ci_high - shift)


def per_seed(runs: dict[str, dict[int, RunResult]], arm: str, value: Callable) -> dict[int, float]:
  return {seed: value(r) for seed, r in runs.get(arm, {}).items()}


def pair_diffs(runs, arm: str, comparator: str, pair: Callable) -> tuple[list[int], list[float]]:
  a, b = runs.get(arm, {}), runs.get(comparator, {})
  values = {s: pair(a[s], b[s]) for s in sorted(set(a) & set(b))}
  seeds = [s for s, v in values.items() if np.isfinite(v)]
  return seeds, [values[s] for s in seeds]


def _one(c: Claim, arm: str, runs) -> tuple[list[int], list[float]]:
  if c.pair is not None:
    seeds, diffs = pair_diffs(runs, arm, c.comparator, c.pair)
  else:
    seeds, diffs = paired_stats.differences(per_seed(runs, arm, c.value), per_seed(runs, c.comparator, c.value))
  return seeds, [d + c.shift for d in diffs]


def evaluate_claims(study: plan.Study, runs: dict[str, dict[int, RunResult]], primary: str = "final") -> list[Outcome]:
  """runs: arm key -> seed -> result (main seeds only)."""
  arms = study.arms()
  out = []
  for c in claims(study, primary):
    arm = c.arm
    if arm not in arms or c.comparator not in arms:  # a claim-1 study has no L = 100 arm: claim 3 is not in it
      continue
    if c.candidates:  # the best candidate by mean; its p then carries the choice (x the number of candidates)
      scored = {a: _one(c, a, runs) for a in c.candidates}  # claims() kept only the study's arms
      scored = {a: sd for a, sd in scored.items() if sd[1]}
      if scored:
        arm = max(scored, key=lambda a: (np.mean(scored[a][1]), -c.candidates.index(a)))
    seeds, diffs = _one(c, arm, runs)
    summary = paired_stats.paired(diffs)
    if c.candidates and np.isfinite(summary.p):
      summary = dataclasses.replace(summary, p=min(1.0, summary.p * len(c.candidates)))
    planned_n = min(plan.planned(study, arms[arm]), plan.planned(study, arms[c.comparator]))
    out.append(Outcome(c, arm, seeds, summary, planned_n))
  adjusted = paired_stats.holm({o.claim.key: o.summary.p for o in out})
  for o in out:
    o.holm_p = adjusted[o.claim.key]
    o.verdict = paired_stats.verdict(o.summary, o.holm_p, planned_n=o.planned_n)
  return out


def secondary_pairs(study: plan.Study, primary: str = "final") -> list[tuple[str, str, str, Callable, bool]]:
  """(label, arm, comparator, per-run value or per-seed pair value, is_pair): the comparisons outside the Holm
  family (unadjusted p), the matched-steps forms of claims 2 and 4 among them."""
  L, LL = study.lag, study.long_lag
  value, _ = primary_value(primary)
  p1 = test_pass1
  rows = [(f"claim 2 at matched steps: late entropy (second half's grid mean), OAPL L={L} vs GRPO off-by-one",
           f"oapl_L{L}", "grpo_obo", late_entropy, False),
          (f"claim 4 at matched steps: test pass@k_max - pass@1 at the end, OAPL L={L} vs GRPO off-by-one",
           f"oapl_L{L}", "grpo_obo", test_passk_gap, False),
          (f"claim 1 on the other metric: {'val AUC' if primary == 'final' else 'final test pass@1'}, OAPL L={L} "
           "vs GRPO off-by-one", f"oapl_L{L}", "grpo_obo", val_auc if primary == "final" else p1, False),
          (f"OAPL L={L} vs on-policy GRPO, primary metric", f"oapl_L{L}", "grpo_onpolicy", value, False),
          ("GRPO off-by-one vs on-policy GRPO, primary metric", "grpo_obo", "grpo_onpolicy", value, False),
          (f"OAPL L={LL} vs L={L}, primary metric (no margin)", f"oapl_L{LL}", f"oapl_L{L}", value, False),
          (f"OAPL L={L} reuse-2 vs fresh, primary metric (half the generations)", f"oapl_L{L}_reuse2",
           f"oapl_L{L}", value, False),
          (f"claim 5 per arm: OAPL L={L} fresh vs GRPO off-by-one, log2 generations ratio", f"oapl_L{L}",
           "grpo_obo", claim5_log_ratio, True),
          (f"claim 5 per arm: OAPL L={L} reuse-2 vs GRPO off-by-one, log2 generations ratio", f"oapl_L{L}_reuse2",
           "grpo_obo", claim5_log_ratio, True),
          (f"claim 5 per arm: OAPL L={LL} vs GRPO off-by-one, log2 generations ratio", f"oapl_L{LL}",
           "grpo_obo", claim5_log_ratio, True)]
  rows += [(f"OAPL L={L} vs {loss.upper()} L={L}, primary metric", f"oapl_L{L}", f"{loss}_L{L}", value, False)
           for loss in plan.SECONDARY_LOSSES]
  rows += [(f"OAPL L=1 beta1={b:g} vs beta1=1, primary metric", f"oapl_L1_beta1_{b:g}", "oapl_L1_beta1_1", value,
            False) for b in plan.BETA1_PROBE if b != 1.0]
  return rows


def secondary_diffs(runs, row) -> tuple[list[int], list[float]]:
  _, arm, comparator, fn, is_pair = row
  if is_pair:
    return pair_diffs(runs, arm, comparator, fn)
  return paired_stats.differences(per_seed(runs, arm, fn), per_seed(runs, comparator, fn))
