"""Your own task from a config and JSONL files alone: sort four letters (data and reward: examples/sort_letters/).
  python -m oapl_jax.main --config configs/own_task.py --workdir runs/own_task"""
from oapl_jax.run import config_base


def get_config(arg: str = ""):
  c = config_base.base_config()
  data = "examples/sort_letters"
  c.task = config_base.records_task(train_path=f"{data}/train.jsonl", reward="examples.sort_letters.reward:score",
                                    eval_paths={"dev": f"{data}/dev.jsonl", "test": f"{data}/test.jsonl"},
                                    demonstrations_path=f"{data}/demos.jsonl")
  c.model.update(attention="reference", overrides=dict(vocab_size=128, hidden_size=128, intermediate_size=512,
                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=32))
  c.warmstart.update(steps=600, batch_size=128, optim=dict(lr=3e-3))
  c.trainer.loss_settings.oapl.update(beta1=0.5, beta2=0.5)
  c.trainer.optim.lr = 1e-4
  c.sampler.update(num_slots=128, max_prefill_length=16, max_new_tokens=6)
  c.loop.update(sync_every=10, num_syncs=8, batch_prompts=16, prompts_per_rollout=32, eval_every_syncs=2)
  c.eval.update(samples=4, ks=(1, 4), max_new_tokens=6)
  if arg not in ("", "smoke"):
    raise ValueError(f"unknown variant {arg!r}; known: '' and 'smoke' (one window of two steps)")
  if arg == "smoke":
    c.warmstart.steps, c.eval.num_prompts = 2, 8
    c.loop.update(sync_every=2, num_syncs=1, eval_every_syncs=1)
  return c
