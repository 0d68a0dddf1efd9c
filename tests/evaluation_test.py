"""Tests for the pass@k math in oapl_jax.evaluation, against hand values and math.comb."""
import math

import numpy as np
import pytest

from oapl_jax import evaluation


def test_pass_at_k_hand_values():
  assert evaluation.pass_at_k(10, 0, 1) == 0.0
  assert evaluation.pass_at_k(10, 0, 10) == 0.0
  assert evaluation.pass_at_k(10, 10, 1) == 1.0
  assert evaluation.pass_at_k(10, 1, 10) == 1.0  # k = n: any correct sample counts
  assert evaluation.pass_at_k(10, 9, 2) == 1.0  # n - c < k
  assert evaluation.pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-12)  # 1 - C(3,2)/C(5,2)
  assert evaluation.pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-12)  # pass@1 = c / n


def test_pass_at_k_matches_comb():
  rng = np.random.RandomState(0)
  for _ in range(200):
    n = int(rng.randint(1, 60))
    c = int(rng.randint(0, n + 1))
    k = int(rng.randint(1, n + 1))
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert evaluation.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)


def test_pass_at_k_mean():
  counts = [0, 2, 5, 1]
  out = evaluation.pass_at_k_mean(np.array(counts), 5, [1, 2, 5])
  assert set(out) == {"pass@1", "pass@2", "pass@5"}
  assert out["pass@1"] == pytest.approx(np.mean([0.0, 0.4, 1.0, 0.2]), abs=1e-12)
  assert out["pass@2"] == pytest.approx(np.mean([0.0, 0.7, 1.0, 0.4]), abs=1e-12)  # 1 - C(4,2)/10
  assert out["pass@5"] == pytest.approx(0.75, abs=1e-12)
  assert all(isinstance(v, float) for v in out.values())


@pytest.mark.parametrize("n,counts,k", [
    (5, [1], 6),  # k > n
    (5, [6], 1),  # c > n
    (5, [-1], 1),  # c < 0
    (5, [1], 0),  # k < 1
    (5, [1], -2),
    (5, [1.5], 1),  # not an integer count
])
def test_pass_at_k_errors(n, counts, k):
  with pytest.raises(ValueError):
    evaluation.pass_at_k_mean(counts, n, [k])
  if float(counts[0]).is_integer():
    with pytest.raises(ValueError):
      evaluation.pass_at_k(n, counts[0], k)
