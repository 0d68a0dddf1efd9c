"""benchmarks/gpu_bench.py's decode floor against a hand count; its attention and train tables on CPU."""
import jax
import transformers

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


def test_the_train_table_gives_mfu_against_the_measured_rate_and_the_datasheet(capsys, monkeypatch):
  """On CPU, a tiny width, with the ceilings and a datasheet for this device stated: each MFU is the model FLOPs
  (a hand count) over the printed step time and that rate, within the rounding of what is printed."""
  tiny = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, tie_word_embeddings=True)
  monkeypatch.setattr(gpu_bench, "qwen3_config", lambda width, layers=None: transformers.Qwen3Config(
      num_hidden_layers=layers, rope_theta=1e6, **tiny))
  monkeypatch.setattr(gpu_bench, "ceilings", lambda: {"bandwidth": 1e8, "matmul": 2e8})
  monkeypatch.setitem(gpu_bench.DATASHEETS, jax.devices()[0].device_kind,
                      {"name": "a stated card", "matmul": 5e8, "bandwidth": 4e8})
  gpu_bench.main(["train", "--lengths", "32", "--tokens", "64", "--layers", "1", "--repeats", "1"])
  out = capsys.readouterr().out
  assert "datasheet: a stated card, HBM 0.00 TB/s" in out
  T, seqs, ours_ms, torch_ms, _, mfu, torch_mfu, sheet_mfu, torch_sheet_mfu = next(
      line.split() for line in out.splitlines() if line.split()[:1] == ["32"])[:9]
  assert (int(T), int(seqs)) == (32, 2)
  E, H, K, D, F, V = 64, 4, 2, 16, 128, 256  # one layer, tied embeddings
  flops = 6 * (E * D * (H + 2 * K) + H * D * E + 3 * E * F + V * E) * 64 + 12 * H * D * 32 ** 2 * 2
  for printed, ms, rate in ((mfu, ours_ms, 2e8), (torch_mfu, torch_ms, 2e8), (sheet_mfu, ours_ms, 5e8),
                            (torch_sheet_mfu, torch_ms, 5e8)):
    low, high = (100 * flops / ((float(ms) + d) / 1e3) / rate for d in (0.05, -0.05))  # ms printed to 0.1
    assert low - 0.05 <= float(printed[:-1]) <= high + 0.05, (printed, ms, rate)
