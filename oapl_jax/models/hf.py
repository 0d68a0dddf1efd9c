"""Hugging Face Qwen checkpoint directories <-> our Flax params.

    config, params = hf.load("/ckpt/Qwen3-4B", mesh=mesh, dtype="bfloat16")
    hf.save("/out/dir", config, params)   # loads back with transformers.AutoModelForCausalLM
    hf.save("/out/dir", config, params, token_ids=hf.TokenIds(eos=151645, pad=151643),
            generation={"temperature": 0.6, "top_p": 0.95, "do_sample": True}, tokenizer_from="/ckpt/Qwen3-4B")

`load` builds each parameter with `jax.make_array_from_callback`, so every device reads only its
own block straight from the memory-mapped safetensors files; the full model never sits on one
device or in one host buffer.
"""
import dataclasses
import glob
import json
import os
import shutil
from typing import Any, Mapping, Optional

import jax
import numpy as np
from flax import traverse_util

from oapl_jax import parallel
from oapl_jax.models import qwen
from oapl_jax.models.config import QwenConfig
from oapl_jax.models.safetensors_io import SafetensorsFile, save_file

_ARCHS = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# The files an HF tokenizer directory may hold (any subset); `save(tokenizer_from=...)` copies those present.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")


class CheckpointError(ValueError):
  """A checkpoint directory that cannot be loaded; the message names the file and tensor."""


# ---------------------------------------------------------------- config.json <-> QwenConfig
def config_from_hf(hf: dict, path: str = "config.json", **overrides) -> QwenConfig:
  model_type = hf.get("model_type")
  if model_type not in _ARCHS:
    raise CheckpointError(f"{path}: model_type={model_type!r} (architectures={hf.get('architectures')}) "
                          f"is not a dense Qwen model; supported: {sorted(_ARCHS)}")
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
  out = {
      "architectures": [_ARCHS[config.family]], "model_type": config.family,
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim, "rope_theta": config.rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
      "rms_norm_eps": config.rms_norm_eps, "tie_word_embeddings": config.tie_word_embeddings,
      "max_position_embeddings": config.max_position_embeddings, "hidden_act": "silu",
      "use_sliding_window": False, "torch_dtype": torch_dtype, "dtype": torch_dtype,
  }
  if config.family == "qwen3":
    out["attention_bias"] = config.qkv_bias
  return out


# ---------------------------------------------------------------- name/layout mapping
def _param_map(config: QwenConfig):
  """Our flat param path -> (HF name template, HF->ours transform). '{i}' marks stacked layers."""
  E, H, K, D = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
  a, m = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
  proj = lambda n: lambda w: w.T.reshape(E, n, D)  # [n*D, E] -> [E, n, D]
  table = {
      ("embed", "embedding"): ("model.embed_tokens.weight", None),
      ("final_norm", "scale"): ("model.norm.weight", None),
      ("layers", "input_norm", "scale"): ("model.layers.{i}.input_layernorm.weight", None),
      ("layers", "post_attn_norm", "scale"): ("model.layers.{i}.post_attention_layernorm.weight", None),
      ("layers", "attn", "q_proj", "kernel"): (a + "q_proj.weight", proj(H)),
      ("layers", "attn", "k_proj", "kernel"): (a + "k_proj.weight", proj(K)),
      ("layers", "attn", "v_proj", "kernel"): (a + "v_proj.weight", proj(K)),
      ("layers", "attn", "o_proj", "kernel"): (a + "o_proj.weight", lambda w: w.T.reshape(H, D, E)),
      ("layers", "mlp", "gate_proj", "kernel"): (m + "gate_proj.weight", lambda w: w.T),
      ("layers", "mlp", "up_proj", "kernel"): (m + "up_proj.weight", lambda w: w.T),
      ("layers", "mlp", "down_proj", "kernel"): (m + "down_proj.weight", lambda w: w.T),
  }
  if config.qkv_bias:
    for name, n in (("q_proj", H), ("k_proj", K), ("v_proj", K)):
      table[("layers", "attn", name, "bias")] = (a + f"{name}.bias", lambda w, n=n: w.reshape(n, D))
  if config.qk_norm:
    table[("layers", "attn", "q_norm", "scale")] = (a + "q_norm.weight", None)
    table[("layers", "attn", "k_norm", "scale")] = (a + "k_norm.weight", None)
  if not config.tie_word_embeddings:
    table[("lm_head", "kernel")] = ("lm_head.weight", lambda w: w.T)
  return table


def _inverse(path, config, ours: np.ndarray) -> np.ndarray:
  """Our layout -> HF layout for one (per-layer) tensor."""
  name = path[-2] if path[-1] in ("kernel", "bias") else None
  if path[-1] == "bias":
    return ours.reshape(-1)
  if name in ("q_proj", "k_proj", "v_proj"):
    return ours.reshape(ours.shape[0], -1).T
  if name == "o_proj":
    return ours.reshape(-1, ours.shape[-1]).T
  if path[-1] == "kernel":
    return ours.T
  return ours


# ---------------------------------------------------------------- load
class _TensorIndex:
  """HF tensor name -> lazily opened safetensors file, with or without an index json."""

  def __init__(self, path: str):
    index_path = os.path.join(path, "model.safetensors.index.json")
    self.files: dict[str, SafetensorsFile] = {}
    if os.path.exists(index_path):
      with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
      self.where = {k: os.path.join(path, v) for k, v in weight_map.items()}
      for file in set(self.where.values()):
        if not os.path.exists(file):
          raise CheckpointError(f"{index_path} lists {os.path.basename(file)}, which is not in {path}")
    else:
      files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
      if not files:
        raise CheckpointError(f"{path}: no *.safetensors files (and no model.safetensors.index.json)")
      self.where = {}
      for file in files:
        for k in self._open(file).keys():
          self.where[k] = file

  def _open(self, file):
    if file not in self.files:
      self.files[file] = SafetensorsFile(file)
    return self.files[file]

  def get(self, name: str, expected_shape) -> np.ndarray:
    if name not in self.where:
      raise CheckpointError(f"tensor {name!r} is missing from the checkpoint "
                            f"(looked in {sorted({os.path.basename(f) for f in self.where.values()})})")
    file = self.where[name]
    sf = self._open(file)
    if name not in sf.header:
      raise CheckpointError(f"{file}: the index says it holds {name!r}, but it does not")
    array = sf.get(name)
    if tuple(array.shape) != tuple(expected_shape):
      raise CheckpointError(f"{file}: tensor {name!r} has shape {tuple(array.shape)}, "
                            f"expected {tuple(expected_shape)} from config.json")
    return array


def read_config(path: str, **overrides) -> QwenConfig:
  path = os.path.expanduser(path)
  config_path = os.path.join(path, "config.json")
  if not os.path.isdir(path):
    raise CheckpointError(f"checkpoint directory {path} does not exist")
  if not os.path.exists(config_path):
    raise CheckpointError(f"{path}: no config.json in this checkpoint directory")
  with open(config_path) as f:
    return config_from_hf(json.load(f), config_path, **overrides)


def load(path: str, mesh: Optional[jax.sharding.Mesh] = None, dtype: str = "float32",
         compute_dtype: Optional[str] = None, rules=None, **config_overrides):
  """Load an HF Qwen2/2.5/3 directory -> (QwenConfig, params sharded over `mesh`).

  dtype: parameter dtype; compute_dtype: activation dtype (defaults to dtype).
  mesh=None uses a one-device mesh. rules: logical axis rules (parallel.DEFAULT_RULES).
  """
  path = os.path.expanduser(path)
  config = read_config(path, param_dtype=dtype, dtype=compute_dtype or dtype, **config_overrides)
  mesh = mesh or parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  rules = rules or parallel.DEFAULT_RULES
  abstract = jax.eval_shape(lambda: qwen.init_params(config, jax.random.PRNGKey(0)))
  shardings = parallel.logical_to_sharding(qwen.param_logical_axes(config), mesh, rules)
  flat_abstract = traverse_util.flatten_dict(abstract)
  flat_shardings = traverse_util.flatten_dict(shardings)
  table = _param_map(config)
  index = _TensorIndex(path)
  target_dtype = config.jnp_param_dtype

  flat = {}
  for key, boxed in flat_abstract.items():
    if key not in table:
      raise CheckpointError(f"internal: no HF name for parameter {'/'.join(key)}")
    shape = boxed.value.shape if hasattr(boxed, "value") else boxed.shape
    template, transform = table[key]
    transform = transform or (lambda w: w)
    stacked = "{i}" in template
    hf_shape = _hf_shape(key, config, shape[1:] if stacked else shape)

    def block(idx, template=template, transform=transform, stacked=stacked, hf_shape=hf_shape):
      if not stacked:
        return np.asarray(transform(index.get(template, hf_shape))[idx], target_dtype)
      layers = range(config.num_layers)[idx[0]]
      return np.stack([np.asarray(transform(index.get(template.format(i=i), hf_shape))[idx[1:]], target_dtype)
                       for i in layers])

    flat[key] = jax.make_array_from_callback(shape, flat_shardings[key], block)
  return config, traverse_util.unflatten_dict(flat)


def _hf_shape(key, config, ours_shape):
  """The HF tensor shape that maps onto our (per-layer) shape: `_inverse` applied abstractly."""
  return jax.eval_shape(lambda x: _inverse(key, config, x), jax.ShapeDtypeStruct(ours_shape, np.float32)).shape


# ---------------------------------------------------------------- save
@dataclasses.dataclass(frozen=True)
class TokenIds:
  """The special token ids generation needs: where to stop (eos) and what fills a batch (pad)."""
  eos: int
  pad: int
  bos: Optional[int] = None

  def as_hf(self) -> dict[str, Any]:
    return {"bos_token_id": self.bos, "eos_token_id": self.eos, "pad_token_id": self.pad}


def save(path: str, config: QwenConfig, params, max_shard_bytes: int = 4 << 30, *, token_ids: Optional[TokenIds] = None,
         generation: Optional[Mapping[str, Any]] = None, tokenizer_from: Optional[str] = None) -> None:
  """Write params as an HF directory (config.json + safetensors shards + index when sharded).

  token_ids: written into config.json and generation_config.json (without them transformers' generate
  neither stops nor pads right). generation: generation_config.json fields (temperature, top_p, ...;
  its eos_token_id, e.g. a list, wins over token_ids.eos). tokenizer_from: a directory whose tokenizer
  files (TOKENIZER_FILES) are copied; it must hold at least one.

  Tensors are fetched to host one at a time. Multi-host: call on every process; only process 0
  writes (arrays must be fully addressable or gathered first).
  """
  if tokenizer_from is not None and not tokenizer_files(tokenizer_from):
    raise CheckpointError(f"tokenizer_from={tokenizer_from}: no tokenizer files there (looked for {TOKENIZER_FILES})")
  table = _param_map(config)
  flat = traverse_util.flatten_dict(params)
  tensors = {}
  for key, value in flat.items():
    template, _ = table[key]
    host = np.asarray(jax.device_get(value))
    if "{i}" in template:
      for i in range(config.num_layers):
        tensors[template.format(i=i)] = _inverse(key, config, host[i])
    else:
      tensors[template] = _inverse(key, config, host)
  if jax.process_index() != 0:
    return
  os.makedirs(path, exist_ok=True)
  dtype_name = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}[config.param_dtype]
  hf_config = config_to_hf(config, dtype_name)
  if token_ids is not None:
    hf_config.update({k: v for k, v in token_ids.as_hf().items() if v is not None})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  if token_ids is not None or generation:
    ids = {k: v for k, v in (token_ids.as_hf() if token_ids else {}).items() if v is not None}
    with open(os.path.join(path, "generation_config.json"), "w") as f:
      json.dump({**ids, **(generation or {})}, f, indent=2)
  for name in tokenizer_files(tokenizer_from) if tokenizer_from else ():
    shutil.copyfile(os.path.join(tokenizer_from, name), os.path.join(path, name))
  shards, current, size = [], {}, 0
  for name, array in tensors.items():
    if current and size + array.nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = array
    size += array.nbytes
  shards.append(current)
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, "model.safetensors"))
    return
  weight_map = {}
  for n, shard in enumerate(shards):
    file = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(path, file))
    weight_map.update({name: file for name in shard})
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map}, f)


def tokenizer_files(directory: str) -> list[str]:
  """The TOKENIZER_FILES present in `directory`."""
  return [name for name in TOKENIZER_FILES if os.path.isfile(os.path.join(directory, name))]
