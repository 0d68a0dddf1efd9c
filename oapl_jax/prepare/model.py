"""A checkpoint of a registered family (Qwen2/2.5/3, Llama 3: models/families.py) by hub id (or local
directory) -> a checkpoint directory our loader has read.

    path = fetch("Qwen/Qwen3-0.6B", "~/models/Qwen3-0.6B", revision=None)
    print(describe(verify(path)))

`fetch` reads config.json first and refuses a model_type no family reads before downloading weights; the
weights go through the hub cache (so HF_HUB_OFFLINE=1 resolves from it) and are copied to `out`.
`verify` loads the directory with models/factory.build_model, the call every config's run makes.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import shutil

from oapl_jax.models import hf
from oapl_jax.prepare.hub import PrepareError, errors_explained

# What a run reads from a checkpoint: the config, the weights and the tokenizer (with its chat template).
FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
         *hf.TOKENIZER_FILES)


def _wanted(name: str) -> bool:
  return any(fnmatch.fnmatch(name, pattern) for pattern in FILES)


def _check_architecture(config_path: str) -> None:
  with open(config_path) as f:
    hf.config_from_hf(json.load(f), config_path)  # CheckpointError names the supported families


def _download(repo_id: str, revision: str | None) -> str:
  # snapshot_download, not hf_hub_download, for config.json too: with the hub unreachable it falls back to the
  # cache at once, where hf_hub_download retries for ~25 s.
  from huggingface_hub import snapshot_download  # pylint: disable=import-outside-toplevel
  with errors_explained(repo_id, revision):
    print(f"reading {repo_id}/config.json (revision {revision or 'main'})", flush=True)
    _check_architecture(os.path.join(snapshot_download(repo_id, revision=revision, allow_patterns=["config.json"]),
                                     "config.json"))
    print(f"fetching {repo_id}: {', '.join(FILES[:4])} and the tokenizer", flush=True)
    return snapshot_download(repo_id, revision=revision, allow_patterns=list(FILES))


def _copy(src: str, out: str) -> None:
  os.makedirs(out, exist_ok=True)
  names = sorted(n for n in os.listdir(src) if _wanted(n) and os.path.isfile(os.path.join(src, n)))
  for name in names:
    print(f"  {name} -> {out}", flush=True)
    shutil.copyfile(os.path.join(src, name), os.path.join(out, name))  # follows the cache's symlinks


def fetch(source: str, out: str | None = None, revision: str | None = None) -> str:
  """The checkpoint directory at `out` (absolute): `source` is a local directory (copied to `out` if given,
  else used in place) or a hub repo id ('Qwen/Qwen3-0.6B'; `out` defaults to ~/models/<name>)."""
  local = os.path.abspath(os.path.expanduser(source))
  if os.path.isdir(local):
    if revision:
      raise PrepareError(f"--revision {revision} names a hub revision, but {source} is a local directory")
    hf.read_config(local)  # CheckpointError: no config.json, or a model_type of no registered family
    src = local
  else:
    if source.count("/") != 1 or source.startswith((".", "/", "~")):
      raise PrepareError(f"{source!r} is neither a local directory nor a hub repo id such as Qwen/Qwen3-0.6B")
    src = _download(source, revision)
  if out is None:
    out = src if os.path.isdir(local) else os.path.join("~/models", source.split("/")[-1])
  out = os.path.abspath(os.path.expanduser(out))
  if os.path.realpath(out) != os.path.realpath(src):
    _copy(src, out)
  return out


@dataclasses.dataclass(frozen=True)
class Summary:
  path: str
  family: str
  layers: int
  width: int
  heads: int
  kv_heads: int
  head_dim: int
  vocab: int
  tied: bool
  parameters: int
  tokenizer: str  # the chat tokenizer's eos token, or why there is none


def verify(path: str) -> Summary:
  """Loads `path` as a run would (models/factory.build_model on one device, bfloat16 weights) and its
  tokenizer as the chat tasks do; raises hf.CheckpointError on a directory our loader cannot read."""
  import jax  # pylint: disable=import-outside-toplevel
  from oapl_jax import parallel  # pylint: disable=import-outside-toplevel
  from oapl_jax.models import factory  # pylint: disable=import-outside-toplevel
  spec = factory.ModelSpec(checkpoint=path, param_dtype="bfloat16", dtype="bfloat16")
  print(f"loading {path} through models/factory.build_model", flush=True)
  model, params = factory.build_model(spec, parallel.Layout.single_device(), seed=0)
  with open(os.path.join(path, "config.json")) as f:
    family = json.load(f)["model_type"]
  c = model.config
  return Summary(path=path, family=family, layers=c.num_layers, width=c.hidden_size, heads=c.num_heads,
                 kv_heads=c.num_kv_heads, head_dim=c.head_dim, vocab=c.vocab_size, tied=c.tie_word_embeddings,
                 parameters=sum(int(x.size) for x in jax.tree_util.tree_leaves(params)), tokenizer=_tokenizer(path))


def _tokenizer(path: str) -> str:
  from oapl_jax.tasks.templates import ChatTokenizer  # pylint: disable=import-outside-toplevel
  if not hf.tokenizer_files(path):
    return "none (no tokenizer files: chat tasks need one; set task.tokenizer_dir to a directory that has it)"
  try:
    return f"eos id {ChatTokenizer(path).eos_id}, with a chat template"
  except ValueError as e:  # no chat template or no eos token
    return f"unusable by the chat tasks ({e})"


def describe(s: Summary) -> str:
  return (f"{s.path}: {s.family}, {s.layers} layers, width {s.width}, {s.heads} heads "
          f"({s.kv_heads} kv, head_dim {s.head_dim}), vocab {s.vocab}, tied embeddings {s.tied}; "
          f"{s.parameters:,} parameters ({s.parameters / 1e6:,.1f}M); tokenizer: {s.tokenizer}")
