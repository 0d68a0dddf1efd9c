"""models/decoder.py's parameters under Hugging Face's names: the Llama layout, which Qwen2 and Qwen3 share
(plus q/k/v biases and q/k norms where a config has them). models/hf.py loads and saves through this table;
a family whose HF names differ registers its own in models/families.py."""
from typing import Callable

Transform = Callable  # one (per-layer) tensor, numpy or traced


def _same(w):
  return w


def param_map(config) -> dict[tuple[str, ...], tuple[str, Transform, Transform]]:
  """Our flat param path -> (HF name template, HF->ours, ours->HF). '{i}' marks stacked layers."""
  E, H, K, D = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
  a, m = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
  proj = lambda n: lambda w: w.T.reshape(E, n, D)  # [n*D, E] -> [E, n, D]
  proj_hf = lambda w: w.reshape(w.shape[0], -1).T  # [E, n, D] -> [n*D, E]
  matrix = (lambda w: w.T, lambda w: w.T)
  table = {
      ("embed", "embedding"): ("model.embed_tokens.weight", _same, _same),
      ("final_norm", "scale"): ("model.norm.weight", _same, _same),
      ("layers", "input_norm", "scale"): ("model.layers.{i}.input_layernorm.weight", _same, _same),
      ("layers", "post_attn_norm", "scale"): ("model.layers.{i}.post_attention_layernorm.weight", _same, _same),
      ("layers", "attn", "q_proj", "kernel"): (a + "q_proj.weight", proj(H), proj_hf),
      ("layers", "attn", "k_proj", "kernel"): (a + "k_proj.weight", proj(K), proj_hf),
      ("layers", "attn", "v_proj", "kernel"): (a + "v_proj.weight", proj(K), proj_hf),
      ("layers", "attn", "o_proj", "kernel"): (a + "o_proj.weight", lambda w: w.T.reshape(H, D, E),
                                               lambda w: w.reshape(-1, w.shape[-1]).T),
      ("layers", "mlp", "gate_proj", "kernel"): (m + "gate_proj.weight", *matrix),
      ("layers", "mlp", "up_proj", "kernel"): (m + "up_proj.weight", *matrix),
      ("layers", "mlp", "down_proj", "kernel"): (m + "down_proj.weight", *matrix),
  }
  if config.qkv_bias:
    for name, n in (("q_proj", H), ("k_proj", K), ("v_proj", K)):
      table[("layers", "attn", name, "bias")] = (a + f"{name}.bias", lambda w, n=n: w.reshape(n, D),
                                                 lambda w: w.reshape(-1))
  if config.qk_norm:
    table[("layers", "attn", "q_norm", "scale")] = (a + "q_norm.weight", _same, _same)
    table[("layers", "attn", "k_norm", "scale")] = (a + "k_norm.weight", _same, _same)
  if not config.tie_word_embeddings:
    table[("lm_head", "kernel")] = ("lm_head.weight", *matrix)
  return table
