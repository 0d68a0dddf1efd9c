"""The paper's math setting (OAPL §5.1): Qwen3-4B-Thinking-2507 on DeepScaleR, eval on AIME 25,
HMMT 25 (Feb, Nov) and BRUMO 25.

  oapl-prepare model Qwen/Qwen3-4B-Thinking-2507 --out ~/models/Qwen3-4B-Thinking-2507
  for d in deepscaler aime25 hmmt25_feb hmmt25_nov brumo25; do oapl-prepare data $d --out ~/data/$d; done
  oapl-train --config configs/math.py --workdir /runs/oapl-math
  oapl-train --config configs/math.py:smoke ...   # same pipeline, shrunk to run on CPU

Paper: beta1 = 1, beta2 = 1e-3, L = 50, G = 8, global batch 128, 2 batches per update, AdamW
(0.9, 0.95), lr 1e-6, generation temperature 1.0, top-p 1.0, max 16384 tokens; eval temperature
0.6, top-p 0.95, 16384 tokens, 10 samples per prompt, pass@{1,5,10}. We read "global batch 128,
2 batches per update" as 128 prompts (x 8 samples) per rollout round feeding two optimizer steps
of 64 prompts each (steps_per_rollout=2), as verl's train/mini-batch sizes do.
The data files hold {"problem", "answer"} records (JSONL or Parquet), as oapl-prepare writes them:
~/data/deepscaler/{train,dev}.jsonl and ~/data/{aime25,hmmt25_feb,hmmt25_nov,brumo25}/test.jsonl.
"""
from ml_collections import ConfigDict

from oapl_jax.run import config_base

DATA = "~/data"  # edit, or override each path on the command line


def get_config(arg: str = "") -> ConfigDict:
  c = config_base.base_config()
  # Each layer rematerialised, its input kept in HBM (remat_policy "full"): with 4 micro-batches that stack is
  # [36 layers, 4 sequences, T, 2560] bf16 = 12.7 GiB per v5p-64 chip (micro_batches below says why this setting).
  c.model.update(checkpoint="~/models/Qwen3-4B-Thinking-2507", param_dtype="float32", dtype="bfloat16", remat=True,
                 remat_policy="full")
  c.task = config_base.chat_task(
      tokenizer_dir="~/models/Qwen3-4B-Thinking-2507", train_path=f"{DATA}/deepscaler/train.jsonl",
      eval_paths={name: f"{DATA}/{name}/test.jsonl" for name in ("aime25", "hmmt25_feb", "hmmt25_nov", "brumo25")})
  c.trainer.loss_settings.oapl.update(beta1=1.0, beta2=1e-3)
  c.trainer.optim.update(lr=1e-6, b1=0.9, b2=0.95, max_grad_norm=1.0)
  # 64 prompts x 8 samples per step in 4 micro-batches of 128 sequences (4 per v5p-64 chip): the fastest setting the
  # compile check (v5p-64, splash attention, 2026-11-27) finds to fit with the sampler resident. Per chip; the time
  # estimated at 40% of peak for the 7.14e17 FLOPs a step executes (121.5 s) plus host transfers at an assumed 15 GB/s:
  #   remat "full", 4 micro-batches:                37.4 GiB, ~58.6 with the sampler, no host transfers: 121.5 s
  #   "offload_layer_input", 2 micro-batches:       35.8 GiB, 25.3 GiB of layer inputs in pinned host memory, moved
  #                                                 out and back each micro-batch (101.2 GiB a step): 128.8 s
  #   "save_dots_no_batch", 2 micro-batches:        asks 321.1 GiB of temporaries: no fit (109.9 s if it did)
  #   "full", 2 micro-batches:                      77.0 GiB: no room for the sampler's 21.2 GiB
  # (the sampler's share is the decode program's arguments, snapshot + KV cache, at d0d808e).
  # The offload policy saves HBM, not time: pick it (with micro_batches=2) where HBM is short; model.mlp_chunks=4
  # cuts the peak further for one more MLP forward per layer.
  c.trainer.micro_batches = 4
  c.sampler.update(num_slots=256, max_prefill_length=2048, max_new_tokens=16384, temperature=1.0, top_p=1.0,
                   dtype="bfloat16", steps_per_sync=64)
  c.loop.update(sync_every=50, num_syncs=20, batch_prompts=64, prompts_per_rollout=128, group_size=8,
                steps_per_rollout=2, eval_every_syncs=2)
  c.eval.update(samples=10, ks=(1, 5, 10), temperature=0.6, top_p=0.95, max_new_tokens=16384)
  # The sampler splits its 8 KV heads over 8-way tensor parallelism, its slots over the rest (v5p-64: 4 x 8).
  c.mesh.update(trainer_ici=(1, -1, 1), sampler_ici=(-1, 1, 8), sampler_devices=0)
  if arg == "smoke":
    config_base.shrink_for_cpu(c)
  elif arg == "sweep":  # get_hyper's points, each a shorter run (eval at the end only)
    c.loop.update(num_syncs=6, eval_every_syncs=6)
  elif arg:
    raise ValueError(f"unknown variant {arg!r}; known: '' (paper), 'smoke', 'sweep'")
  return c


def get_hyper(h):
  """The KL strength to the sampler against the lag (python -m oapl_jax.apps.sweep --config configs/math.py:sweep ...)."""
  return h.product([h.sweep("config.trainer.loss_settings.oapl.beta2", [1e-3, 3e-3]),
                    h.sweep("config.loop.sync_every", [50, 100, 200])])
