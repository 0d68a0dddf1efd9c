"""Paired statistics for the claims study: one number per RL seed and method, differences paired by seed.

  s = paired([0.1, 0.2, -0.05, 0.15])     # mean, sd, 95% t-interval, exact sign-flip p, n
  adjusted = holm({"1": 0.01, "2": 0.04})  # Holm's step-down adjustment over the claims
  verdict(s, adjusted["1"], direction=+1)  # the rule stated in advance (VERDICT_RULE)

The sign-flip test is exact: under H0 (no method effect) each seed's difference is as likely to have
either sign, so the 2^n sign patterns are equally likely; the two-sided p is the fraction of them whose
mean is at least as far from 0 as the observed one. Its smallest value is 2 / 2^n (0.0625 at n = 5,
0.0078 at n = 8): `min_p`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

ALPHA = 0.05  # family-wise error rate over the claims (Holm)
MAX_EXACT_N = 20  # 2^20 sign patterns; the study has at most 8 seeds per cell
# t_{0.975, df} for df = 1..30 (the fallback when scipy is absent; scipy.stats.t.ppf agrees to 6 digits)
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
         2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
         2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)

VERDICT_RULE = (
    "Each claim is one paired difference d (method minus comparator, one value per RL seed) with a claimed "
    "direction. supported: Holm-adjusted sign-flip p < 0.05 and mean d in the claimed direction (and, where a "
    "claim names a margin, the 95% t-interval's near end beyond it); contradicted: Holm-adjusted p < 0.05 with "
    "mean d against the claimed direction (or, with a margin, the whole interval short of it); inconclusive "
    "otherwise. A claim below its planned n is marked interim.")


def t_quantile_975(df: int) -> float:
  """The 0.975 quantile of Student's t with `df` degrees of freedom."""
  if df < 1:
    raise ValueError(f"t quantile: df must be >= 1, got {df}")
  try:
    from scipy import stats  # pylint: disable=import-outside-toplevel
    return float(stats.t.ppf(0.975, df))
  except ImportError:
    if df <= len(_T975):
      return _T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion around the normal quantile: < 1e-5 off for df > 30
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def sign_flip_p(diffs: Sequence[float]) -> float:
  """Exact two-sided sign-flip permutation p-value of the mean of `diffs` (all 2^n sign patterns)."""
  d = np.asarray(diffs, np.float64)
  n = len(d)
  if n == 0:
    return float("nan")
  if n > MAX_EXACT_N:
    raise ValueError(f"sign_flip_p: {n} differences; exact enumeration is capped at {MAX_EXACT_N}")
  bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
  means = (1 - 2 * bits) @ d / n
  observed = abs(d.mean())
  return float(np.mean(np.abs(means) >= observed - 1e-12 * max(1.0, observed)))


def min_p(n: int) -> float:
  """The smallest two-sided sign-flip p that n paired seeds can give."""
  return 2.0 / 2**n if n else 1.0


@dataclasses.dataclass(frozen=True)
class Paired:
  """The summary of per-seed differences."""
  diffs: tuple[float, ...]
  n: int
  mean: float
  sd: float  # over seeds, ddof 1 (nan for one seed)
  ci_low: float  # 95% t-interval of the mean (nan below two seeds)
  ci_high: float
  p: float  # exact two-sided sign-flip p


def paired(diffs: Sequence[float]) -> Paired:
  d = np.asarray([float(x) for x in diffs], np.float64)
  n = len(d)
  if n == 0:
    nan = float("nan")
    return Paired((), 0, nan, nan, nan, nan, nan)
  if not np.all(np.isfinite(d)):
    raise ValueError(f"paired differences must be finite, got {d.tolist()}")
  mean = float(d.mean())
  if n < 2:
    return Paired(tuple(d.tolist()), n, mean, float("nan"), float("nan"), float("nan"), sign_flip_p(d))
  sd = float(d.std(ddof=1))
  half = t_quantile_975(n - 1) * sd / math.sqrt(n)
  return Paired(tuple(d.tolist()), n, mean, sd, mean - half, mean + half, sign_flip_p(d))


def differences(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[list[int], list[float]]:
  """(seeds both have, a[seed] - b[seed] for each), seeds in order: only complete pairs count."""
  seeds = sorted(set(a) & set(b))
  return seeds, [a[s] - b[s] for s in seeds]


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
  """Holm-adjusted p-values: sort ascending, p_(j) * (m - j + 1) (j from 1), running maximum, capped at 1.
  A missing test (nan) takes no part and stays nan; m counts the tests with a p."""
  present = sorted(((p, name) for name, p in pvalues.items() if np.isfinite(p)), key=lambda t: (t[0], t[1]))
  m, running, out = len(present), 0.0, {name: float("nan") for name in pvalues}
  for j, (p, name) in enumerate(present):
    running = max(running, min(1.0, (m - j) * p))
    out[name] = running
  return out


def verdict(s: Paired, adjusted_p: float, direction: int = 1, margin: float | None = None,
            planned_n: int | None = None, alpha: float = ALPHA) -> str:
  """VERDICT_RULE for one claim: 'supported' | 'contradicted' | 'inconclusive', '(interim: n=5 < 8)'
  appended below the planned n. `margin` (in the claimed direction's units): the interval's near end
  must clear it (e.g. claim 3: OAPL at L = 100 above the warm start by at least the pilot's gain)."""
  if s.n == 0:
    return "missing"
  significant = np.isfinite(adjusted_p) and adjusted_p < alpha
  signed_mean = direction * s.mean
  near, far = (s.ci_low, s.ci_high) if direction > 0 else (-s.ci_high, -s.ci_low)
  if significant and signed_mean > 0 and (margin is None or (np.isfinite(near) and near >= margin)):
    out = "supported"
  elif significant and signed_mean < 0:
    out = "contradicted"
  elif margin is not None and np.isfinite(far) and far < margin:
    out = "contradicted"
  else:
    out = "inconclusive"
  if planned_n is not None and s.n < planned_n:
    out += f" (interim: n={s.n} < planned {planned_n})"
  return out
