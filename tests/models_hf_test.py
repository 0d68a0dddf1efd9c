"""Checkpoint directories: export round trip, sharded index files, and clear errors for bad input."""
import json
import os
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers

from oapl_jax.models import decoder, hf
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.models.safetensors_io import SafetensorsFile, save_file
from tests.hf_fixtures import make_chat_tokenizer, make_hf_checkpoint


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("qwen3")
  make_hf_checkpoint(path, "qwen3", tie=False, seed=1)
  return str(path)


def _copy(src, dst):
  shutil.copytree(src, dst)
  return str(dst)


@pytest.mark.parametrize("family,tie", [("qwen3", False), ("qwen2", True)])
def test_export_round_trip_loads_in_transformers(tmp_path, family, tie):
  config = QwenConfig.tiny(qk_norm=family == "qwen3", qkv_bias=family == "qwen2", tie_word_embeddings=tie)
  params = nn.unbox(decoder.init_params(config, jax.random.PRNGKey(4)))
  # Make norms and biases non-trivial so a dropped tensor would show up in the logits.
  params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(5), x.shape), params)
  hf.save(str(tmp_path), config, params)
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
  tokens = np.random.RandomState(0).randint(0, config.vocab_size, (2, 10))
  with torch.no_grad():
    ref = torch_model(torch.tensor(tokens)).logits.numpy()
  ours = np.asarray(decoder.logits(params, config, tokens))
  assert np.max(np.abs(ours - ref)) / np.max(np.abs(ref)) < 1e-4
  config2, params2 = hf.load(str(tmp_path))
  assert config2 == config
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)


def test_many_shards_with_index_and_bf16(tmp_path, qwen3_dir):
  config, params = hf.load(qwen3_dir)
  hf.save(str(tmp_path / "f32"), config, params, max_shard_bytes=100_000)
  files = sorted(os.listdir(tmp_path / "f32"))
  assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 2
  config2, params2 = hf.load(str(tmp_path / "f32"))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)
  # bf16 params: stored as BF16, read back exactly, and transformers reads the same values.
  config_bf16, params_bf16 = hf.load(qwen3_dir, dtype="bfloat16")
  assert params_bf16["embed"]["embedding"].dtype == jax.numpy.bfloat16
  hf.save(str(tmp_path / "bf16"), config_bf16, params_bf16)
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16"), dtype=torch.bfloat16)
  want = torch_model.model.embed_tokens.weight.float().detach().numpy()
  np.testing.assert_array_equal(np.asarray(params_bf16["embed"]["embedding"], np.float32), want)


def test_no_config_json(tmp_path):
  with pytest.raises(hf.CheckpointError, match="no config.json"):
    hf.load(str(tmp_path))


def test_missing_directory(tmp_path):
  with pytest.raises(hf.CheckpointError, match="does not exist"):
    hf.load(str(tmp_path / "nope"))


def test_other_architecture(tmp_path, qwen3_dir):
  path = _copy(qwen3_dir, tmp_path / "gemma")
  cfg_path = os.path.join(path, "config.json")
  cfg = json.load(open(cfg_path))
  cfg.update(model_type="gemma", architectures=["GemmaForCausalLM"])
  json.dump(cfg, open(cfg_path, "w"))
  with pytest.raises(hf.CheckpointError, match=r"config.json.*'gemma'.*GemmaForCausalLM.*\['llama', 'qwen2', 'qwen3'\]"):
    hf.load(path)


def _rewrite(path, edit):
  file = os.path.join(path, "model.safetensors")
  sf = SafetensorsFile(file)
  tensors = {k: np.array(sf.get(k)) for k in sf.keys()}
  del sf
  edit(tensors)
  save_file(tensors, file)


def test_missing_tensor_is_named(tmp_path, qwen3_dir):
  path = _copy(qwen3_dir, tmp_path / "missing")
  _rewrite(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(hf.CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*missing.*model.safetensors"):
    hf.load(path)


def test_shape_mismatch_names_file_and_tensor(tmp_path, qwen3_dir):
  path = _copy(qwen3_dir, tmp_path / "shape")
  def shrink(t):
    t["model.layers.0.self_attn.k_proj.weight"] = t["model.layers.0.self_attn.k_proj.weight"][:16]
  _rewrite(path, shrink)
  with pytest.raises(hf.CheckpointError, match=r"model\.safetensors: tensor 'model\.layers\.0\.self_attn\.k_proj\.weight' "
                                               r"has shape \(16, 64\), expected \(32, 64\)"):
    hf.load(path)


def test_save_writes_token_ids_generation_config_and_tokenizer_files(tmp_path):
  source = tmp_path / "source"
  tokenizer = make_chat_tokenizer(source)
  config = QwenConfig.tiny(vocab_size=320)
  params = nn.unbox(decoder.init_params(config, jax.random.PRNGKey(0)))
  ids = hf.TokenIds(eos=tokenizer.eos_token_id, pad=tokenizer.pad_token_id)
  out = str(tmp_path / "out")
  hf.save(out, config, params, token_ids=ids, generation={"do_sample": True, "temperature": 0.6, "top_p": 0.95},
          tokenizer_from=str(source))
  loaded = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
  text = "What is 1+1? The answer is \\boxed{2}. <|im_start|> unseen words, é"
  assert loaded.encode(text) == tokenizer.encode(text) and loaded.decode(loaded.encode(text)) == text
  assert len(loaded) == len(tokenizer) > 256 and loaded.chat_template == tokenizer.chat_template
  hf_config = transformers.AutoConfig.from_pretrained(out)
  assert (hf_config.eos_token_id, hf_config.pad_token_id) == (ids.eos, ids.pad) == (loaded.eos_token_id, loaded.pad_token_id)
  generation = transformers.GenerationConfig.from_pretrained(out)
  assert (generation.eos_token_id, generation.pad_token_id, generation.temperature, generation.top_p,
          generation.do_sample) == (ids.eos, ids.pad, 0.6, 0.95, True)
  # The weights are unchanged by the extras: the same logits as a plain save.
  plain = str(tmp_path / "plain")
  hf.save(plain, config, params)
  assert not os.path.exists(os.path.join(plain, "generation_config.json"))
  assert "eos_token_id" not in json.load(open(os.path.join(plain, "config.json")))
  tokens = torch.tensor([[1, 5, 9, 300]])
  with torch.no_grad():
    a = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(tokens).logits
    b = transformers.AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32)(tokens).logits
  torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_save_refuses_a_tokenizer_source_without_tokenizer_files(tmp_path):
  config = QwenConfig.tiny()
  params = nn.unbox(decoder.init_params(config, jax.random.PRNGKey(0)))
  (tmp_path / "empty").mkdir()
  with pytest.raises(hf.CheckpointError, match=r"empty: no tokenizer files there"):
    hf.save(str(tmp_path / "out"), config, params, tokenizer_from=str(tmp_path / "empty"))
  assert not os.path.exists(tmp_path / "out")  # checked before anything is written
