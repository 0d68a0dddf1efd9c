"""The model families, keyed by Hugging Face model_type: what models/api.for_config, models/hf (read, load,
save), models/factory (presets) and the sampler dispatch through.

A family is one folder (models/<name>/: its config with presets, its HF config mapping) and one line in
FAMILIES. Families built on the shared decoder (models/decoder.py) bind it with DecoderLM and map weights with
decoder_hf.param_map; another network brings its own CausalLM and param map.
"""
import dataclasses
from typing import Any, Callable, Mapping

from oapl_jax.models import decoder_hf
from oapl_jax.models.decoder_lm import DecoderLM
from oapl_jax.models.llama import hf as llama_hf
from oapl_jax.models.llama.config import LLAMA_PRESETS, LlamaConfig
from oapl_jax.models.qwen import hf as qwen_hf
from oapl_jax.models.qwen.config import QWEN2_PRESETS, QWEN3_PRESETS, QwenConfig


@dataclasses.dataclass(frozen=True)
class Family:
  config_class: type  # the typed config: architecture + execution (its `model_type` is this entry's key)
  causal_lm: Callable[[Any], Any]  # config -> models.api.CausalLM
  hf_architecture: str  # config.json's "architectures"
  config_from_hf: Callable[..., Any]  # (config.json dict, its path, **overrides) -> config
  config_to_hf: Callable[[Any, str], dict]  # (config, torch dtype name) -> config.json's architecture fields
  param_map: Callable[[Any], dict]  # config -> {our param path: (HF tensor name, HF->ours, ours->HF)}
  presets: Mapping[str, Callable[[], Any]]  # name -> the published architecture (weights come from a checkpoint)


FAMILIES: dict[str, Family] = {
    "qwen2": Family(QwenConfig, DecoderLM, "Qwen2ForCausalLM", qwen_hf.config_from_hf, qwen_hf.config_to_hf,
                    decoder_hf.param_map, QWEN2_PRESETS),
    "qwen3": Family(QwenConfig, DecoderLM, "Qwen3ForCausalLM", qwen_hf.config_from_hf, qwen_hf.config_to_hf,
                    decoder_hf.param_map, QWEN3_PRESETS),
    "llama": Family(LlamaConfig, DecoderLM, "LlamaForCausalLM", llama_hf.config_from_hf, llama_hf.config_to_hf,
                    decoder_hf.param_map, LLAMA_PRESETS),
}

PRESETS: dict[str, Callable[[], Any]] = {name: make for f in FAMILIES.values() for name, make in f.presets.items()}
assert len(PRESETS) == sum(len(f.presets) for f in FAMILIES.values()), "two families name the same preset"


def of_config(config) -> Family:
  """The family a config belongs to (by its model_type); TypeError for anything else."""
  family = FAMILIES.get(getattr(config, "model_type", None))
  if family is None or not isinstance(config, family.config_class):
    raise TypeError(f"no model family for config type {type(config).__name__}; families: {sorted(FAMILIES)}")
  return family


def preset(name: str, **overrides):
  """A preset's config with architecture and execution overrides (replace(num_layers=4, dtype="bfloat16"))."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; known: {sorted(PRESETS)}")
  return PRESETS[name]().replace(**overrides)
