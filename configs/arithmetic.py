"""The CPU default: a tiny Qwen3-architecture model learns 2-digit addition with OAPL.

  python -m oapl_jax.main --config configs/arithmetic.py --workdir runs/demo      (make demo)
  python -m oapl_jax.main --config configs/arithmetic.py:smoke --workdir /tmp/smoke
  python -m oapl_jax.main --config configs/arithmetic.py:grpo --workdir runs/grpo   # the GRPO baseline
  python -m oapl_jax.apps.sweep --config configs/arithmetic.py:sweep --workdir runs/sweep --parallel 2  # get_hyper
  python -m oapl_jax.main --config configs/arithmetic.py:rope1e6 ...   # the demo at Qwen3's rope_theta, 1e6

The model is warm-started by a short supervised phase on an imperfect teacher: 70% of the
demonstrations slip on the last digit. It learns addition, and the slip, so held-out pass@1 at
the eval settings starts low; OAPL with the exact-match reward then has a habit to unlearn.
Toy-task betas: see docs/DESIGN.md (one update moves log pi by about A*/beta2; 1e-3 is for 16K tokens).

The sweep (:sweep with get_hyper): the lag L in SWEEP_LAGS at SWEEP_STEPS = 60 trainer steps each, seeds 0 and 1,
8 runs from one shared warm start (made once). 16.6 min on 2 CPU cores under heavy sharing (load 6-14), warm
start 4.9 of it; pass@1 0.21 -> 0.93 (L = 1, 5), 0.85-0.88 (L = 20), 0.63-0.72 (L = 60): reports/sweep_arithmetic.
"""
from ml_collections import ConfigDict

from oapl_jax.run import config_base

SWEEP_STEPS = 60  # T: trainer steps of every point of the example sweep, whatever its lag
SWEEP_LAGS = (1, 5, 20, 60)  # L: num_syncs = T / L windows


def get_config(arg: str = "") -> ConfigDict:
  c = config_base.base_config()
  c.model.preset = "tiny"
  c.model.attention = "reference"  # sequences of ~10 tokens: the exact full-scores path is also the cheapest
  c.mesh.cpu_compile = "fast_start"  # compiling is most of this CPU run: programs compile ~2x faster, step ~30% slower
  # A 32-word vocabulary: a step's 1,664 positions of logits are 213 KB, so one chunk, and every position projected
  # (no skipped chunks or tails to compile): the train step compiles in 2.8 s instead of 3.6, the same step time
  # (docs/benchmarks.md, "The demo's train step projects every position")
  c.model.update(logprob_chunk_tokens=4096, logprob_skip_unread=False)
  c.model.overrides = dict(vocab_size=32, hidden_size=128, intermediate_size=512, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=32, max_position_embeddings=64)
  c.task = config_base.arithmetic_task(num_digits=2, num_train=4096, num_held_out=256)
  c.task.teacher_slip_rate = 0.7
  c.warmstart.update(steps=1000, batch_size=128)
  c.warmstart.optim.lr = 3e-3

  c.trainer.loss_settings.oapl.update(beta1=0.5, beta2=0.5)
  c.trainer.optim.update(lr=1e-4, b1=0.9, b2=0.95, weight_decay=0.0, max_grad_norm=1.0)
  # a group's 8 rows share a prompt of up to 7 tokens: packed, a group is 62 positions instead of 104; in the loop a
  # step computes in ~24 ms instead of ~40 and compiles ~0.3 s longer (docs/benchmarks.md, "Each group's prompt")
  c.trainer.share_prompts = True
  # clu's TensorBoard writer spends ~0.11 ms a scalar in TensorFlow ops, ~4 ms of this loop's ~60 ms step, and 2.4 s
  # importing TensorFlow: the same events files are written by tensorboard's protos here (event_writers.py)
  c.report.events = "tensorboard"

  c.sampler.update(num_slots=128, max_prefill_length=8, max_new_tokens=6, temperature=1.0, top_p=1.0,
                   steps_per_sync=8)
  c.loop.update(sync_every=10, num_syncs=12, batch_prompts=16, prompts_per_rollout=32, group_size=8,
                steps_per_rollout=4, eval_every_syncs=2)
  c.eval.update(num_prompts=256, samples=4, ks=(1, 4), temperature=0.6, top_p=0.95, max_new_tokens=6)
  c.checkpoint.every_syncs = 2

  parts = set(arg.split(",")) - {""}
  if parts - {"grpo", "smoke", "sweep", "rope1e6"}:
    raise ValueError(f"unknown variant {arg!r}; known: '' (OAPL), 'grpo', 'smoke', 'sweep', 'rope1e6' (combinable)")
  if "rope1e6" in parts:  # Qwen3's rope_theta, which Tunix 0.1.7's Qwen3 applies whatever a checkpoint says
    c.model.overrides["rope_theta"] = 1_000_000.0
  if "grpo" in parts:  # the paper's baseline on the same task: token-level IS, clip 0.2, TIS cap 2
    c.trainer.loss = "grpo"
  if "smoke" in parts:  # seconds on CPU: one window of two steps
    c.warmstart.steps = 2
    c.loop.update(sync_every=2, num_syncs=1, batch_prompts=8, prompts_per_rollout=8, group_size=4, steps_per_rollout=1)
    c.eval.num_prompts = 4
  if "sweep" in parts:  # get_hyper's points: T trainer steps of a fresh chunk of 8 prompts x 8 each, at any lag
    c.loop.update(sync_every=SWEEP_STEPS, num_syncs=1, batch_prompts=8, prompts_per_rollout=8, steps_per_rollout=1,
                  eval_every_syncs=1_000_000)  # the snapshot eval at step 0 and the end; the policy's every 10 steps
    c.eval.every_steps = 10
    c.checkpoint.every_syncs = 1_000_000  # a point saves at its end only (L = 1 would save every step)
  return c


def get_hyper(h):
  """The example sweep (use with :sweep): the lag L at an equal T = SWEEP_STEPS trainer steps (num_syncs = T / L),
  two RL seeds per lag, every point loading one shared warm start (apps/sweep.py makes it once)."""
  lags = h.zip([h.sweep("config.loop.sync_every", list(SWEEP_LAGS)),
                h.sweep("config.loop.num_syncs", [SWEEP_STEPS // lag for lag in SWEEP_LAGS])])
  return h.product([lags, h.sweep("config.seed", [0, 1])])
