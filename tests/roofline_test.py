"""benchmarks/roofline's arithmetic on hand-made numbers: bytes a decode step reads, and which floor binds."""
import dataclasses

import pytest

from benchmarks import roofline
from oapl_jax.models.qwen.config import QwenConfig


def test_decode_bytes_are_the_matmul_weights_once_and_each_rows_cache():
  c = dataclasses.replace(QwenConfig.tiny(), hidden_size=4, num_heads=2, num_kv_heads=1, head_dim=2,
                          intermediate_size=8, num_layers=1, vocab_size=10)
  weights = 4 * 2 * (2 + 2) + 2 * 2 * 4 + 3 * 4 * 8 + 10 * 4  # q, k, v; o; gate, up, down; vocabulary table
  cache = 2 * 1 * 2 * 1 * 2 * 3  # batch 2 x layers x (K, V) x kv heads x head_dim x context 3
  assert roofline.decode_bytes(c, batch=2, context=3) == (weights + cache) * 4
  assert roofline.decode_bytes(c, batch=2, context=3, weight_bytes=2) == weights * 2 + cache * 4


def test_the_bound_is_the_slower_floor():
  memory = roofline.floors(step_bytes=2e9, step_flops=1e9, batch=1, gbps=20.0, gflops=100.0)  # 0.1 s vs 0.01 s
  assert memory["bound"] == "memory" and memory["bound_tps"] == pytest.approx(10.0)
  assert memory["compute_tps"] == pytest.approx(100.0)
  compute = roofline.floors(step_bytes=2e9, step_flops=64e9, batch=64, gbps=20.0, gflops=100.0)  # 0.1 s vs 0.64 s
  assert compute["bound"] == "compute" and compute["bound_tps"] == pytest.approx(100.0)
  assert "| 64 | 640 | 100 | compute | 90 | 90% | 45 | 45% |" in roofline.markdown([(64, compute, 90.0, 45.0)])
