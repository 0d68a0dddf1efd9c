"""One run of the claims study (experiments/claims.py): a task, its model and the RL budget.

  python -m experiments.study --task arithmetic --out reports/claims_arithmetic   # the whole study
  python -m oapl_jax.main --config configs/claims.py:arithmetic --workdir runs/x \
      --config.model.checkpoint=runs/claims_arithmetic/warmstart --config.warmstart.steps=0 \
      --config.trainer.loss=grpo --config.loop.sync_every=10 --config.loop.num_syncs=20     # one of its runs

Every run of a task has the same trainer-step count S and samples one fresh chunk of P = B prompts
x G responses per step (steps_per_rollout 1), so every loss and lag draws S * B * G responses: the
equal generation budget. The lag L only decides how many of those steps share one sampler snapshot
(num_syncs = S / L). The eval sets are a validation split (in-loop curve, hyperparameter choice)
and a test split the harness scores at the end (experiments/split_task.py).
"""
import os
import importlib.util

from ml_collections import ConfigDict

from oapl_jax import config_base

STEPS = {"arithmetic": 100, "chain": 100}  # S: trainer steps per run (>= the largest lag)
EVAL_EVERY_STEPS = 20  # in-loop validation pass@1 every this many steps (at window starts)


def _arithmetic_demo_config() -> ConfigDict:
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "arithmetic.py")
  spec = importlib.util.spec_from_file_location("_claims_arithmetic", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _split(base: ConfigDict, num_val: int, num_test: int) -> ConfigDict:
  """The task section of experiments/split_task.py around a base task section."""
  return ConfigDict(dict(name="experiments.split_task:from_config", base=base, num_val=num_val,
                         num_test=num_test))


def get_config(arg: str = "arithmetic") -> ConfigDict:
  parts = set(arg.split(",")) - {""}
  tasks = (parts & {"arithmetic", "chain"}) or {"arithmetic"}
  if len(tasks) != 1 or parts - {"arithmetic", "chain", "smoke"}:
    raise ValueError(f"configs/claims.py: unknown variant {arg!r}; expected 'arithmetic' (the default) or "
                     f"'chain', optionally ',smoke'")
  task = tasks.pop()
  if task == "arithmetic":  # the demo's tiny model, task and warm start (configs/arithmetic.py)
    c = _arithmetic_demo_config()
    base = c.task
    base.update(num_held_out=192)
    c.task = _split(base, num_val=64, num_test=128)
    c.warmstart.steps = 300
    c.sampler.update(num_slots=32, max_new_tokens=6)
    c.eval.update(max_new_tokens=6)
  else:  # chain: running sums of 8 one-digit terms written out step by step, 37-59 response tokens
    c = config_base.base_config()
    c.model.preset = "tiny"
    c.model.attention = "reference"
    c.model.overrides = dict(vocab_size=32, hidden_size=128, intermediate_size=512, num_layers=2, num_heads=4,
                             num_kv_heads=2, head_dim=32, max_position_embeddings=128)
    base = ConfigDict(dict(name="oapl_jax.tasks.chain_task:from_config", num_terms=8, num_digits=1, num_train=4096,
                           num_held_out=96, seed=0, teacher_slip_rate=0.5))
    c.task = _split(base, num_val=32, num_test=64)
    c.warmstart.update(steps=250, batch_size=64)  # calibrated: 200 steps left test pass@1 0.07, 600 left 0.94
    c.warmstart.optim.lr = 3e-3
    c.trainer.loss_settings.oapl.update(beta1=0.5, beta2=0.5)
    c.trainer.optim.update(lr=1e-4, b1=0.9, b2=0.95, weight_decay=0.0, max_grad_norm=1.0)
    # rollouts at temperature 0.7: at 1.0 they scored ~5%, most groups of 8 had no reward signal
    c.sampler.update(num_slots=32, max_prefill_length=24, max_new_tokens=64, temperature=0.7, top_p=1.0,
                     steps_per_sync=16)
    c.eval.update(temperature=0.6, top_p=0.95, max_new_tokens=64)
  c.loop.update(batch_prompts=4, prompts_per_rollout=4, group_size=8, steps_per_rollout=1,
                sync_every=10, num_syncs=STEPS[task] // 10, eval_every_syncs=EVAL_EVERY_STEPS // 10)
  c.eval.update(num_prompts=1_000_000, samples=4, ks=(1, 4))  # the whole validation split, in the loop
  c.checkpoint.update(every_syncs=1_000_000, max_to_keep=1)  # the loop always saves the last window
  c.monitors.no_signal_steps = 1_000_000  # all-equal groups are common on a hard task; not an alarm here
  if "smoke" in parts:  # CI: seconds per run
    c.warmstart.update(steps=5, batch_size=32)
    c.sampler.grow_cache = False  # one decode compile instead of one per cache length
    c.task.update(num_val=8, num_test=8)
    c.task.base.update(num_train=64, num_held_out=16)
    c.loop.update(sync_every=2, num_syncs=2, eval_every_syncs=1)
    if task == "chain":
      c.task.base.num_terms = 3
  return c
