"""One side of benchmarks/tunix_bench.py in its own process: ours (oapl_jax, our venv) or Tunix (its venv).

    python -m benchmarks.tunix_worker --side ours --job sample --checkpoint DIR --batch 16
    benchmarks/.tunix_venv/bin/python -m benchmarks.tunix_worker --side tunix --job train --checkpoint DIR --data B.npz

Each side loads the HF checkpoint with its own loader, builds its own sampler or GRPO train step, warms it up
(compile + one run) and prints one JSON line {"ready": ...}. Then each stdin line "run SEED" times one run
(a whole generation, or one train step) and prints {"seconds": ...}; "stats" prints the peak resident memory.
Job "logps" writes the per-token log-probs of --data's completions to --out and exits (the parity test).
Top-level imports are numpy and oapl_jax.host_memory (ctypes only), so the Tunix venv runs this file
without our package's dependencies; --data is an .npz made by tunix_bench.grpo_batch.
"""
import argparse
import functools
import json
import resource
import sys
import time
import warnings

import numpy as np

from oapl_jax import host_memory

TEMPERATURE, TOP_P = 1.0, 1.0
LR, CLIP_EPS, MAX_GRAD_NORM = 1e-5, 0.2, 1.0


def peak_rss_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def read_batch(path: str) -> dict:
  with np.load(path) as f:
    return {k: f[k] for k in f.files}


def ours_train_batch(data: dict) -> dict:
  """tunix_bench.grpo_batch's prompt/completion rows as our [B, G, T] batch (T = prompt + completion):
  position t predicts token t + 1; the sampler's log-probs equal the old policy's, so our TIS weight is 1."""
  B, G = data["rewards"].shape
  prompt_NxP, completion_NxC = data["prompt_ids"], data["completion_ids"]
  N, P = prompt_NxP.shape
  seq_NxT = np.concatenate([prompt_NxP, completion_NxC], 1)
  place = lambda x_NxC: np.pad(x_NxC, ((0, 0), (P - 1, 1))).astype(np.float32)  # noqa: E731
  old_NxT = place(data["old_logp"])
  batch = {"tokens": seq_NxT, "targets": np.pad(seq_NxT[:, 1:], ((0, 0), (0, 1))),
           "positions": np.broadcast_to(np.arange(seq_NxT.shape[1]), seq_NxT.shape),
           "response_mask": place(data["completion_mask"]), "old_policy_token_logp": old_NxT,
           "sampler_token_logp": old_NxT}
  batch = {k: np.ascontiguousarray(v.reshape(B, G, -1)).astype(v.dtype if k != "positions" else np.int32)
           for k, v in batch.items()}
  return {**batch, "rewards": data["rewards"].astype(np.float32)}


# ------------------------------------------------------------------------------ ours
def ours_model(checkpoint, dtype="float32"):
  from oapl_jax import parallel
  from oapl_jax.models import factory
  return factory.load_pretrained(checkpoint, parallel.Layout.single_device(), param_dtype=dtype, dtype=dtype)


def ours_sample(args, prompts):
  from benchmarks import sampler_bench
  from oapl_jax.sampler import core
  model, params = ours_model(args.checkpoint, args.dtype)  # weights and compute (the KV cache too) in args.dtype
  sampler = core.Sampler(model, num_slots=len(prompts), max_prefill_length=max(16, len(prompts[0])),
                         max_new_tokens=args.new_tokens)
  sampler.refresh(params)
  return sampler_bench.ours_runner(sampler, prompts, args.new_tokens, args.steps_per_sync)  # temperature 1, top-p 1


def ours_train(args, data):
  import jax
  from oapl_jax import objectives, parallel
  from oapl_jax.models import factory
  from oapl_jax.rl import trainer
  from oapl_jax.rl.optim import OptimConfig
  layout = parallel.Layout(parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1]))
  model, params = factory.load_pretrained(args.checkpoint, layout, logprob_recompute=not args.keep_logits,
                                          **({"logprob_keep_bytes": 0} if args.recompute_logits else {}))
  config = trainer.TrainConfig(
      loss="grpo", loss_settings=objectives.GRPOSettings(clip_eps=CLIP_EPS), temperature=TEMPERATURE,
      optim=OptimConfig(lr=LR, b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=MAX_GRAD_NORM))
  state = trainer.create_train_state(config, model, params, layout)
  del params
  step = trainer.make_train_step(config, model, layout)
  batch = jax.device_put(ours_train_batch(data), trainer.batch_sharding(layout))
  rng = jax.random.PRNGKey(0)

  def run(seed):
    nonlocal state
    start = time.perf_counter()
    state, metrics = step(state, batch, rng)
    jax.block_until_ready(state)
    return time.perf_counter() - start, float(metrics["loss"]), float(metrics["grad_norm"])
  return run


def ours_logps(args, data):
  model, params = ours_model(args.checkpoint)
  batch = ours_train_batch(data)
  flat = lambda x: x.reshape(-1, x.shape[-1])  # noqa: E731
  logp_NxT = np.asarray(model.token_logprobs(params, flat(batch["tokens"]), flat(batch["targets"]),
                                             flat(batch["positions"]), temperature=TEMPERATURE))
  P, C = data["prompt_ids"].shape[1], data["completion_ids"].shape[1]
  return logp_NxT[:, P - 1:P - 1 + C]


# ------------------------------------------------------------------------------ Tunix
class IdsTokenizer:
  """Tunix's Sampler takes strings: prompts go in as space-separated token ids (pad 0, no BOS)."""
  def encode(self, text, **_):
    return [int(t) for t in text.split()]

  def decode(self, ids, **_):
    return " ".join(str(int(t)) for t in ids)

  def bos_id(self):
    return None

  def eos_id(self):
    return 0

  def pad_id(self):
    return 0


def honour_rope_theta(qwen3_model, rope_theta):
  """Tunix 0.1.7's Qwen3 attention calls `apply_rope(x, positions, head_dim=...)` without its config's rope_theta,
  so it applies the function's default (1e6) whatever the checkpoint says. Pass the checkpoint's theta instead: the
  one change made to Tunix's code here (the module global the attention looks up); a no-op at 1e6."""
  original = getattr(qwen3_model.apply_rope, "tunix_original", qwen3_model.apply_rope)
  patched = functools.partial(original, rope_theta=rope_theta)
  patched.tunix_original = original
  qwen3_model.apply_rope = patched


def tunix_model(checkpoint, dtype="float32"):
  """(Tunix Qwen3 loaded by its safetensors loader, its config, a 1x1 (fsdp, tp) mesh), at the checkpoint's
  rope_theta (`honour_rope_theta`)."""
  import jax
  import jax.numpy as jnp
  from tunix.models.qwen3 import model as qwen3_model
  from tunix.models.qwen3 import params as qwen3_params
  with open(f"{checkpoint}/config.json") as f:
    hf = json.load(f)
  rope = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta")
  honour_rope_theta(qwen3_model, float(rope))
  config = qwen3_model.ModelConfig(
      num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
      hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"], head_dim=hf["head_dim"],
      num_kv_heads=hf["num_key_value_heads"], rope_theta=int(rope), norm_eps=hf["rms_norm_eps"],
      use_tied_embedding=hf.get("tie_word_embeddings", False), dtype=jnp.dtype(dtype), param_dtype=jnp.dtype(dtype))
  # compute and KV cache (its sampler's cache takes config.dtype) in `dtype` too, as ours
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                       devices=jax.devices()[:1])
  with mesh:
    model = qwen3_params.create_model_from_safe_tensors(checkpoint, config, mesh, dtype=jnp.dtype(dtype))
  return model, config, mesh


def tunix_sample(args, prompts):
  from tunix.generate import sampler as sampler_lib
  model, config, mesh = tunix_model(args.checkpoint, args.dtype)
  P, N = len(prompts[0]), args.new_tokens
  sampler = sampler_lib.Sampler(model, IdsTokenizer(), sampler_lib.CacheConfig(
      cache_size=P + N, num_layers=config.num_layers, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim))
  texts = [" ".join(map(str, p)) for p in prompts]

  def run(seed):
    start = time.perf_counter()
    with mesh:
      out = sampler(texts, max_generation_steps=N, max_prompt_length=P, temperature=TEMPERATURE, top_p=TOP_P,
                    seed=seed, eos_tokens=[-1], return_logprobs=True)  # eos -1: never stops early
    assert all(len(t) == N for t in out.tokens), [len(t) for t in out.tokens]
    return time.perf_counter() - start
  return run


def tunix_example(data):
  import jax.numpy as jnp
  from tunix.rl import algo_core, common
  B, G = data["rewards"].shape
  advantages = algo_core.compute_advantages(data["rewards"].reshape(-1), G)  # Tunix does this on the host too
  return common.TrainExample(
      prompt_ids=jnp.asarray(data["prompt_ids"]), prompt_mask=jnp.asarray(data["prompt_ids"] != 0),
      completion_ids=jnp.asarray(data["completion_ids"]), completion_mask=jnp.asarray(data["completion_mask"]),
      advantages=jnp.asarray(advantages, jnp.float32), ref_per_token_logps=None,
      old_per_token_logps=jnp.asarray(data["old_logp"]))


def tunix_train(args, data):
  """Tunix's RL actor trainer (rl.trainer.Trainer, a PeftTrainer) with its registered "grpo" policy loss, as
  GRPOLearner sets it up (beta 0: no reference model), and the jitted step its train loop calls."""
  import jax
  import optax
  from flax import nnx
  from tunix.rl import function_registry
  from tunix.rl import trainer as rl_trainer
  from tunix.rl.grpo import grpo_learner
  from tunix.sft import peft_trainer
  model, _, mesh = tunix_model(args.checkpoint)
  algo = grpo_learner.GRPOConfig(num_generations=data["rewards"].shape[1], num_iterations=1, beta=0.0,
                                 epsilon=CLIP_EPS, loss_agg_mode="sequence-mean-token-mean")
  algo.temperature = TEMPERATURE
  loss_fn = function_registry.get_policy_loss_fn(algo.policy_loss_fn)
  optimizer = optax.chain(optax.clip_by_global_norm(MAX_GRAD_NORM),
                          optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0))
  with mesh:
    learner = rl_trainer.Trainer(model, optimizer, peft_trainer.TrainingConfig(eval_every_n_steps=10**9),
                                 custom_checkpoint_metadata_fn=dict)
    learner.with_loss_fn(lambda m, train_example, algo_config: loss_fn(
        m, train_example, algo_config=algo_config, pad_id=0, eos_id=-1), has_aux=True)
    learner.with_gen_model_input_fn(lambda x: {"train_example": x, "algo_config": algo})
    step, _ = learner.jit_train_and_eval_step(cache_nnx_graph=True)
  example = tunix_example(data)

  def run(seed):
    start = time.perf_counter()
    with mesh:
      loss, _, grad_norm = step(example)
    jax.block_until_ready(nnx.state(model))
    return time.perf_counter() - start, float(loss), float(grad_norm)
  return run


def tunix_logps(args, data):
  from flax import nnx
  from tunix.rl import common
  model, _, mesh = tunix_model(args.checkpoint)
  graphdef, state = nnx.split(model)
  with mesh:
    logp = common.compute_per_token_logps(graphdef, state, prompt_tokens=data["prompt_ids"],
                                          completion_tokens=data["completion_ids"], pad_id=0, eos_id=-1,
                                          temperature=TEMPERATURE)
  return np.asarray(logp)


# ------------------------------------------------------------------------------ protocol
def _say(**fields):
  print(json.dumps(fields), flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--side", choices=["ours", "tunix"], required=True)
  ap.add_argument("--job", choices=["sample", "train", "logps"], required=True)
  ap.add_argument("--checkpoint", required=True)
  ap.add_argument("--data", help="train/logps: tunix_bench.grpo_batch's .npz; sample: its prompts")
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="sample: the weights' dtype")
  ap.add_argument("--steps_per_sync", type=int, default=16)
  ap.add_argument("--out", help="logps: where the .npy goes")
  ap.add_argument("--keep_logits", action="store_true",
                  help="ours, train: model.logprob_recompute=False (the backward reuses the forward's vocabulary "
                       "block, as Tunix keeps its logits)")
  ap.add_argument("--recompute_logits", action="store_true",
                  help="ours, train: model.logprob_keep_bytes=0 (the backward projects the logits again)")
  ap.add_argument("--malloc", choices=["keep", "default"], default="keep",
                  help="keep: glibc keeps freed memory (oapl_jax/host_memory.py, as our CPU entry points run); "
                       "default: glibc's defaults. Either way, both sides get the same")
  args = ap.parse_args(argv)
  warnings.filterwarnings("ignore", category=DeprecationWarning)  # Tunix's `with mesh:` and Variable.value
  kept = args.malloc == "keep" and host_memory.keep_freed_memory()  # before JAX starts its threads
  data = read_batch(args.data)
  if args.job == "logps":
    np.save(args.out, (ours_logps if args.side == "ours" else tunix_logps)(args, data))
    return
  start = time.perf_counter()
  if args.job == "sample":
    prompts = data["prompts"].tolist()
    run = (ours_sample if args.side == "ours" else tunix_sample)(args, prompts)
    first = run(0)
  else:
    run = (ours_train if args.side == "ours" else tunix_train)(args, data)
    first = run(0)  # (seconds, loss, grad norm) at the initial params
  _say(ready=True, setup_and_first_s=time.perf_counter() - start, first=first, kept_freed_memory=bool(kept),
       peak_rss_gb=peak_rss_gb())
  for line in sys.stdin:
    if line.startswith("run"):
      out = run(int(line.split()[1]))
      _say(**({"seconds": out} if args.job == "sample" else dict(zip(("seconds", "loss", "grad_norm"), out))))
    elif line.startswith("stats"):
      _say(peak_rss_gb=peak_rss_gb())


if __name__ == "__main__":
  main()
