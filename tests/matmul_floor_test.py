"""benchmarks/matmul_floor lists the matmuls a step cannot skip: their FLOPs must equal the analytic count that
compile_check derives on its own (attention aside), and the floor must be the faster library's time per shape."""
import pytest

from benchmarks import matmul_floor
from oapl_jax.run import compile_check
from oapl_jax.models.qwen.config import QwenConfig


def _flops(shapes):
  return sum(2 * m * k * n * count for (m, k, n), count in shapes.items())


@pytest.fixture
def config():
  return QwenConfig(vocab_size=1000, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=4,
                    num_kv_heads=2, head_dim=24).replace(remat=False)


def test_decode_shapes_are_every_weight_once_per_row(config):
  weights = compile_check.train_flops(config, 1, 1)["matmul_weights"]
  assert _flops(matmul_floor.decode_shapes(config, rows=64)) == 2 * 64 * weights


def test_train_shapes_are_the_model_flops_without_attention(config):
  sequences, T = 6, 32
  flops = compile_check.train_flops(config, sequences, T)
  attention_fwd = 4 * config.num_layers * config.num_heads * config.head_dim * T * T * sequences
  assert _flops(matmul_floor.train_shapes(config, sequences * T, sequences * T)) == flops["model"] - 3 * attention_fwd
  fewer_scored = matmul_floor.train_shapes(config, sequences * T, 50)
  assert _flops(fewer_scored) == flops["model"] - 3 * attention_fwd - 6 * config.vocab_size * config.hidden_size * (
      sequences * T - 50)


def test_the_floor_takes_the_faster_library_per_shape(monkeypatch):
  times = {(1, 2, 3): {"jax": 0.5, "torch": 0.25}, (4, 5, 6): {"jax": 1.0, "torch": 2.0}}
  monkeypatch.setattr(matmul_floor, "time_shape", lambda *shape, repeats: times[shape])
  assert matmul_floor.floor_seconds({(1, 2, 3): 4, (4, 5, 6): 2}) == 4 * 0.25 + 2 * 1.0


def test_time_shape_times_both_libraries():
  t = matmul_floor.time_shape(8, 16, 32, repeats=1)
  assert set(t) == {"jax", "torch"} and all(s > 0 for s in t.values())
