"""Evaluation: the unbiased pass@k estimator (Chen et al. 2021, arXiv 2107.03374)."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def _pass_at_k_P(n: int, c_P: np.ndarray, k: int) -> np.ndarray:
  """1 - C(n-c, k) / C(n, k) per prompt, as 1 - prod_{i=n-c+1}^{n} (1 - k/i)."""
  c_P = np.asarray(c_P)
  if not np.issubdtype(c_P.dtype, np.integer):
    if not np.all(c_P == np.round(c_P)):
      raise ValueError(f"correct counts must be integers, got {c_P}")
    c_P = c_P.astype(np.int64)
  if n < 1:
    raise ValueError(f"n must be >= 1, got {n}")
  if not 1 <= k <= n:
    raise ValueError(f"k must be in [1, n={n}], got {k}")
  if c_P.size and (c_P.min() < 0 or c_P.max() > n):
    raise ValueError(f"correct counts must be in [0, n={n}], got min {c_P.min()} max {c_P.max()}")
  i_N = np.arange(1, n + 1, dtype=np.float64)
  # Factor (1 - k/i) for i > n - c, else 1; shape [P, n].
  in_range_PxN = i_N[None, :] > (n - c_P)[:, None]
  factors_PxN = np.where(in_range_PxN, 1.0 - k / i_N[None, :], 1.0)
  return np.where(n - c_P < k, 1.0, 1.0 - np.prod(factors_PxN, axis=-1))


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples of which c are correct."""
  return float(_pass_at_k_P(n, np.array([c]), k)[0])


def pass_at_k_mean(correct_counts_P: Sequence[int] | np.ndarray, n: int,
                   ks: Sequence[int]) -> dict[str, float]:
  """pass@k averaged over prompts, for each k in ks: {"pass@k": value}."""
  c_P = np.asarray(correct_counts_P).reshape(-1)
  if c_P.size == 0:
    raise ValueError("correct_counts_P is empty")
  return {f"pass@{k}": float(np.mean(_pass_at_k_P(n, c_P, k))) for k in ks}
