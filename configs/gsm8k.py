"""A GSM8K-sized OAPL run for a small model: Qwen3-0.6B (default) or Qwen2.5-0.5B-Instruct.

  oapl-prepare model Qwen/Qwen3-0.6B --out ~/models/Qwen3-0.6B
  oapl-prepare data gsm8k --out ~/data/gsm8k
  oapl-train --config configs/gsm8k.py --workdir runs/gsm8k

  oapl-train --config configs/gsm8k.py:qwen2.5 ...   # Qwen2.5-0.5B-Instruct (prepare Qwen/Qwen2.5-0.5B-Instruct)
  oapl-train --config configs/gsm8k.py:smoke ...     # shrunk to run on CPU
  elsewhere: --config.model.checkpoint=DIR --config.task.tokenizer_dir=DIR --config.task.train_path=FILE ...

GSM8K JSONL as distributed ({"question", "answer"} with the final answer after '####'), as oapl-prepare
writes it: train.jsonl, dev.jsonl (carved from train) and test.jsonl, the eval set.
Responses are short, so L is shorter than the paper's 50 and beta2 larger than its 1e-3.
"""
from ml_collections import ConfigDict

from oapl_jax.run import config_base

DATA = "~/data/gsm8k"  # what `oapl-prepare data gsm8k --out ~/data/gsm8k` writes


def get_config(arg: str = "") -> ConfigDict:
  variant, _, size = arg.partition(",")
  model = {"": "Qwen3-0.6B", "qwen3": "Qwen3-0.6B", "qwen2.5": "Qwen2.5-0.5B-Instruct", "smoke": "Qwen3-0.6B"}
  if variant not in model:
    raise ValueError(f"unknown variant {arg!r}; known: {sorted(model)}")
  c = config_base.base_config()
  c.model.update(checkpoint=f"~/models/{model[variant]}", dtype="bfloat16", remat=True)
  c.task = config_base.chat_task(tokenizer_dir=f"~/models/{model[variant]}", train_path=f"{DATA}/train.jsonl",
                            eval_paths={"gsm8k_test": f"{DATA}/test.jsonl"})
  c.task.update(problem_key="question", answer_key="answer", answer_after="####")
  c.trainer.loss_settings.oapl.update(beta1=1.0, beta2=1e-2)
  c.trainer.optim.update(lr=1e-6, b1=0.9, b2=0.95, max_grad_norm=1.0)
  c.trainer.micro_batches = 8
  # 128 slots so one 80 GB GPU holds it: the compile check for one v5p chip (c9cde7f) puts the decode at 43.4 GiB
  # with 128 slots and 85.5 GiB with 256 (a KV cache of 1,536 positions per slot, and a second copy inside the step);
  # the train step at 31.9 GiB. On a slice, raise it: --config.sampler.num_slots=256.
  c.sampler.update(num_slots=128, max_prefill_length=512, max_new_tokens=1024, dtype="bfloat16")
  c.loop.update(sync_every=20, num_syncs=25, batch_prompts=64, prompts_per_rollout=64, group_size=8,
                steps_per_rollout=1, eval_every_syncs=5)
  c.eval.update(num_prompts=1319, samples=4, ks=(1, 4), max_new_tokens=1024)
  if variant == "smoke":
    config_base.shrink_for_cpu(c)
  return c
