"""Tiny random Hugging Face Qwen and Llama checkpoints written with `transformers`, for parity tests."""
import os

import torch
import transformers

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-6)


def make_hf_model(family: str = "qwen3", tie: bool = False, seed: int = 0, **overrides):
  """A random HF model (qwen3, qwen2 or llama) whose weights are perturbed away from the init (norms != 1,
  biases != 0). Llama takes its rope scaling as `rope_scaling={"rope_type": "llama3", ...}`."""
  kw = dict(TINY, tie_word_embeddings=tie, **overrides)
  if family == "qwen3":
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=kw["hidden_size"] // kw["num_attention_heads"], **kw))
  elif family == "qwen2":
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
  elif family == "llama":
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
  else:
    raise ValueError(family)
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn(p.shape, generator=gen))
  return model.eval()


def make_hf_checkpoint(path, family: str = "qwen3", tie: bool = False, seed: int = 0, **overrides):
  """Write a tiny checkpoint directory (config.json + safetensors) and return the torch model."""
  model = make_hf_model(family, tie, seed, **overrides)
  model.save_pretrained(str(path))
  assert os.path.exists(os.path.join(path, "config.json")), f"transformers wrote no config.json in {path}"
  return model


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_chat_tokenizer(path, corpus=("What is 1+1? The answer is \\boxed{2}.",)):
  """A byte-level BPE tokenizer (any text encodes) with a Qwen-style chat template, saved to `path`.

  Its vocabulary is 256 bytes + a few merges + 3 specials (< 300 ids).
  """
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  tok.train_from_iterator(list(corpus) * 4, trainers.BpeTrainer(
      vocab_size=290, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                            additional_special_tokens=["<|im_start|>"])
  hf.chat_template = CHAT_TEMPLATE
  hf.save_pretrained(str(path))
  return hf
