"""Hugging Face config.json (model_type llama) <-> LlamaConfig. The weights map through models/decoder_hf.py
(HF's Llama names). Refused: biases (attention_bias, mlp_bias), an activation other than silu, and rope types
other than the default and llama3."""
from oapl_jax.models.safetensors_io import CheckpointError
from oapl_jax.models.llama.config import Llama3RopeScaling, LlamaConfig


def config_from_hf(hf: dict, path: str = "config.json", **overrides) -> LlamaConfig:
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type not in ("default", "llama3", None):
    raise CheckpointError(f"{path}: rope type {rope_type!r} is not supported (default or llama3)")
  for flag in ("attention_bias", "mlp_bias"):
    if hf.get(flag):
      raise CheckpointError(f"{path}: {flag}=true is not supported")
  if hf.get("hidden_act", "silu") != "silu":
    raise CheckpointError(f"{path}: hidden_act={hf['hidden_act']!r} is not supported (silu)")
  try:
    heads = hf["num_attention_heads"]
    scaling = None
    if rope_type == "llama3":
      scaling = Llama3RopeScaling(
          factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
          high_freq_factor=float(rope["high_freq_factor"]),
          original_max_position_embeddings=int(rope.get("original_max_position_embeddings",
                                                        hf["max_position_embeddings"])))
    return LlamaConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=hf.get("max_position_embeddings", 2048), rope_scaling=scaling).replace(**overrides)
  except KeyError as e:
    raise CheckpointError(f"{path}: missing required field {e.args[0]!r}") from None


def config_to_hf(config: LlamaConfig, torch_dtype: str) -> dict:
  """config.json's architecture fields (models/hf.py adds architectures and model_type)."""
  scaling = config.rope_scaling.as_hf() if config.rope_scaling else None
  return {
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim, "rope_theta": config.rope_theta,
      "rope_parameters": {"rope_type": "default", **(scaling or {}), "rope_theta": config.rope_theta},
      "rope_scaling": scaling,  # the field's name before transformers 5
      "rms_norm_eps": config.rms_norm_eps, "tie_word_embeddings": config.tie_word_embeddings,
      "max_position_embeddings": config.max_position_embeddings, "hidden_act": "silu",
      "attention_bias": False, "mlp_bias": False, "torch_dtype": torch_dtype, "dtype": torch_dtype,
  }
