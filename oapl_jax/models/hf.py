"""Hugging Face checkpoint directories <-> our Flax params, for every family in models/families.py.

    config, params = hf.load("/ckpt/Qwen3-4B", mesh=mesh, dtype="bfloat16")   # the family from config.json
    hf.save("/out/dir", config, params)   # loads back with transformers.AutoModelForCausalLM
    hf.save("/out/dir", config, params, token_ids=hf.TokenIds(eos=151645, pad=151643),
            generation={"temperature": 0.6, "top_p": 0.95, "do_sample": True}, tokenizer_from="/ckpt/Qwen3-4B")

This file is the generic part (config.json, safetensors shards, the index, tokenizer files); a family's
config mapping and tensor names come from its registry entry. `load` builds each parameter with
`jax.make_array_from_callback`, so every device reads only its own block straight from the memory-mapped
safetensors files; the full model never sits on one device or in one host buffer.
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
from oapl_jax.models import families
from oapl_jax.models.safetensors_io import CheckpointError, SafetensorsFile, save_file

# The files an HF tokenizer directory may hold (any subset); `save(tokenizer_from=...)` copies those present.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")


# ---------------------------------------------------------------- config.json <-> a family's config
def config_from_hf(hf: dict, path: str = "config.json", **overrides):
  """config.json's dict -> the config of the family its model_type names."""
  model_type = hf.get("model_type")
  if model_type not in families.FAMILIES:
    raise CheckpointError(f"{path}: model_type={model_type!r} (architectures={hf.get('architectures')}) "
                          f"is not a model family we support; supported: {sorted(families.FAMILIES)}")
  return families.FAMILIES[model_type].config_from_hf(hf, path, **overrides)


def config_to_hf(config, torch_dtype: str) -> dict:
  family = families.of_config(config)
  return {"architectures": [family.hf_architecture], "model_type": config.model_type,
          **family.config_to_hf(config, torch_dtype)}


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


def read_config(path: str, **overrides):
  """The config of the checkpoint directory at `path` (its family from config.json's model_type)."""
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
  """Load an HF directory of any registered family -> (its config, params sharded over `mesh`).

  dtype: parameter dtype; compute_dtype: activation dtype (defaults to dtype).
  mesh=None uses a one-device mesh. rules: logical axis rules (parallel.DEFAULT_RULES).
  """
  path = os.path.expanduser(path)
  config = read_config(path, param_dtype=dtype, dtype=compute_dtype or dtype, **config_overrides)
  mesh = mesh or parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  rules = rules or parallel.DEFAULT_RULES
  family = families.FAMILIES[config.model_type]
  model = family.causal_lm(config)
  abstract = jax.eval_shape(lambda: model.init_params(jax.random.PRNGKey(0)))
  shardings = parallel.logical_to_sharding(model.param_logical_axes(), mesh, rules)
  flat_abstract = traverse_util.flatten_dict(abstract)
  flat_shardings = traverse_util.flatten_dict(shardings)
  table = family.param_map(config)
  index = _TensorIndex(path)
  target_dtype = config.jnp_param_dtype

  flat = {}
  for key, boxed in flat_abstract.items():
    if key not in table:
      raise CheckpointError(f"internal: no HF name for parameter {'/'.join(key)}")
    shape = boxed.value.shape if hasattr(boxed, "value") else boxed.shape
    template, transform, to_hf = table[key]
    stacked = "{i}" in template
    hf_shape = _hf_shape(to_hf, shape[1:] if stacked else shape)

    def block(idx, template=template, transform=transform, stacked=stacked, hf_shape=hf_shape):
      if not stacked:
        return np.asarray(transform(index.get(template, hf_shape))[idx], target_dtype)
      layers = range(config.num_layers)[idx[0]]
      return np.stack([np.asarray(transform(index.get(template.format(i=i), hf_shape))[idx[1:]], target_dtype)
                       for i in layers])

    flat[key] = jax.make_array_from_callback(shape, flat_shardings[key], block)
  return config, traverse_util.unflatten_dict(flat)


def _hf_shape(to_hf, ours_shape):
  """The HF tensor shape that maps onto our (per-layer) shape: the ours->HF transform applied abstractly."""
  return jax.eval_shape(to_hf, jax.ShapeDtypeStruct(ours_shape, np.float32)).shape


# ---------------------------------------------------------------- save
@dataclasses.dataclass(frozen=True)
class TokenIds:
  """The special token ids generation needs: where to stop (eos) and what fills a batch (pad)."""
  eos: int
  pad: int
  bos: Optional[int] = None

  def as_hf(self) -> dict[str, Any]:
    return {"bos_token_id": self.bos, "eos_token_id": self.eos, "pad_token_id": self.pad}


def save(path: str, config, params, max_shard_bytes: int = 4 << 30, *, token_ids: Optional[TokenIds] = None,
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
  table = families.of_config(config).param_map(config)
  flat = traverse_util.flatten_dict(params)
  tensors = {}
  for key, value in flat.items():
    template, _, to_hf = table[key]
    host = np.asarray(jax.device_get(value))
    if "{i}" in template:
      for i in range(config.num_layers):
        tensors[template.format(i=i)] = to_hf(host[i])
    else:
      tensors[template] = to_hf(host)
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
