"""benchmarks/gpu_bench.py's decode floor against a hand count, and its attention table on CPU."""
from benchmarks import gpu_bench
from oapl_jax.models.qwen.config import QwenConfig


def test_decode_floor_is_the_larger_of_bytes_and_flops():
  c = QwenConfig.tiny()
  E, H, K, D, F, L, V = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.num_layers, \
      c.vocab_size
  weights = L * (E * D * (H + 2 * K) + H * D * E + 3 * E * F) + V * E  # q, k, v, o, the MLP's three; the head
  kv_per_row = 2 * 2 * L * K * D * 10.0  # bf16 keys and values of 10 positions
  peak = {"bandwidth": 1e9, "matmul": 1e12}
  assert gpu_bench.decode_floor_seconds(c, 4, 10.0, peak) == (2 * weights + 4 * kv_per_row) / 1e9  # bytes bound
  peak = {"bandwidth": 1e15, "matmul": 1e9}
  assert gpu_bench.decode_floor_seconds(c, 4, 10.0, peak) == 2 * weights * 4 / 1e9  # FLOPs bound


def test_attention_table_runs_and_every_kernel_agrees_with_float32(capsys):
  gpu_bench.main(["attention", "--lengths", "128", "--repeats", "1"])
  rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("128")]
  kernels = {" ".join(r[1:-7]) for r in rows}
  assert kernels == {"cudnn", "blockwise", "reference", "torch sdpa"}
  for r in rows:  # bf16 inputs against the float32 blockwise kernel: errors of bf16 rounding, never more
    assert all(0 < float(e) < 2e-2 for e in r[-4:]), r
