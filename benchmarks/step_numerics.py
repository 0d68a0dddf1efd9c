"""Per-step OAPL losses of a tiny model on fixed batches: run it on two commits and compare (a numerics check).

    python -m benchmarks.step_numerics --devices 1 > after.json      # then the same in a worktree of the other commit
    python -m benchmarks.step_numerics --devices 8 > after8.json     # with XLA_FLAGS=--xla_force_host_platform_device_count=8
    python -m benchmarks.step_numerics --keep_logits > after_keep.json

Four train steps at lr 3e-3 (so the updates matter), the tiny Qwen3 config with the vocabulary projection in
chunks of 48 tokens, fixed random batches (benchmarks/train_bench.make_batch); prints one JSON list of per-step
loss, grad_norm, entropy and seq_log_ratio_mean. A check to run by hand, not a test.
"""
import argparse
import json

import jax

from benchmarks import train_bench
from oapl_jax import objectives, parallel
from oapl_jax.models import api, decoder
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.rl import trainer
from oapl_jax.rl.optim import OptimConfig


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--devices", type=int, default=1, help="devices on the fsdp axis")
  ap.add_argument("--steps", type=int, default=4)
  ap.add_argument("--keep_logits", action="store_true", help="logprob_recompute=False (the backward reuses a kept block)")
  args = ap.parse_args()
  config = QwenConfig.tiny(logprob_chunk_tokens=48, logprob_recompute=not args.keep_logits)
  mesh = parallel.make_mesh((1, args.devices, 1), devices=jax.devices()[:args.devices])
  layout, model = parallel.Layout(mesh), api.for_config(config)
  params, _ = parallel.init_sharded(lambda: decoder.init_params(config, jax.random.PRNGKey(0)), mesh, layout.rules)
  cfg = trainer.TrainConfig(loss="oapl", loss_settings=objectives.OAPLSettings(beta1=0.5, beta2=0.5), temperature=0.9,
                            optim=OptimConfig(lr=3e-3, b1=0.9, b2=0.95, eps=1e-8, max_grad_norm=1.0))
  state = trainer.create_train_state(cfg, model, params, layout)
  step = trainer.make_train_step(cfg, model, layout)
  out = []
  for i in range(args.steps):
    batch = train_bench.make_batch(8, 4, 32, config.vocab_size, seed=i, prompt_len=8, min_response=4)
    state, metrics = step(state, jax.device_put(batch, trainer.batch_sharding(layout)), jax.random.PRNGKey(0))
    out.append({k: float(metrics[k]) for k in ("loss", "grad_norm", "entropy", "seq_log_ratio_mean")})
  print(json.dumps(out))


if __name__ == "__main__":
  main()
