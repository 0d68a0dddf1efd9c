"""The random Qwen3 checkpoints the benchmarks build with transformers: the tiny default or a published width
(vocab 151,936) cut to a number of layers. The benchmarks that time these models (train_bench, sampler_bench,
matmul_floor, decode_profile, tunix_bench) import them from here, and none of them from another benchmark.
"""
import torch
import transformers

# --width: the tiny default, or a published width (vocab 151,936) cut to --layers layers.
WIDTHS = {
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, tie_word_embeddings=False),
    "qwen3_0p6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
}
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rope_theta=10000.0)  # sampler_bench's default checkpoint


def hf_config(width: str, layers: int) -> transformers.Qwen3Config:
  return transformers.Qwen3Config(num_hidden_layers=layers, rope_theta=10000.0, **WIDTHS[width])


def make_checkpoint(path: str, seed: int = 0, hf_config=None, device: str = "cpu",
                    dtype=torch.float32) -> transformers.PreTrainedModel:
  """A random checkpoint (the tiny default, or `hf_config`), its weights spread so sampling is not uniform.
  The model is built on `device` in `dtype` and saved in that dtype."""
  torch.manual_seed(seed)
  with torch.device(device):
    model = transformers.Qwen3ForCausalLM(hf_config or transformers.Qwen3Config(**TINY)).to(dtype)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  model.save_pretrained(path)
  return model.eval()
