"""Hugging Face config.json (model_type qwen2 / qwen3) <-> QwenConfig. The weights map through
models/decoder_hf.py (the Llama layout both Qwen generations keep)."""
from oapl_jax.models.safetensors_io import CheckpointError
from oapl_jax.models.qwen.config import QwenConfig


def config_from_hf(hf: dict, path: str = "config.json", **overrides) -> QwenConfig:
  model_type = hf["model_type"]  # qwen2 or qwen3: models/hf.py chose this family by it
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
    raise CheckpointError(f"{path}: rope type {rope.get('rope_type', rope.get('type'))!r} is not supported")
  if hf.get("use_sliding_window"):
    raise CheckpointError(f"{path}: use_sliding_window=true is not supported")
  try:
    heads = hf["num_attention_heads"]
    return QwenConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
        max_position_embeddings=hf.get("max_position_embeddings", 32768)).replace(**overrides)
  except KeyError as e:
    raise CheckpointError(f"{path}: missing required field {e.args[0]!r}") from None


def config_to_hf(config: QwenConfig, torch_dtype: str) -> dict:
  """config.json's architecture fields (models/hf.py adds architectures and model_type)."""
  out = {
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim, "rope_theta": config.rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
      "rms_norm_eps": config.rms_norm_eps, "tie_word_embeddings": config.tie_word_embeddings,
      "max_position_embeddings": config.max_position_embeddings, "hidden_act": "silu",
      "use_sliding_window": False, "torch_dtype": torch_dtype, "dtype": torch_dtype,
  }
  if config.model_type == "qwen3":
    out["attention_bias"] = config.qkv_bias
  return out
