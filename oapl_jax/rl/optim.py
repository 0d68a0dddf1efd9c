"""AdamW with optional global-norm clipping and a constant or warmup+cosine learning rate.

The cosine schedule is the one verl / HF use (linear warmup from 0, then cosine down to
min_ratio * lr at total_steps, constant after), e.g. the paper's code setting: lr 1e-6,
warmup_ratio 0.02, min_ratio 0.05.
"""
import dataclasses

import optax

from oapl_jax import sections


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """The trainer's optimizer (defaults: the paper's math setting); the warm start has its own defaults."""
  lr: float = sections.rule(1e-6, low=0, low_open=True)  # peak learning rate
  b1: float = sections.rule(0.9, low=0, high=1, high_open=True)  # Adam's first-moment decay
  b2: float = sections.rule(0.95, low=0, high=1, high_open=True)  # Adam's second-moment decay
  eps: float = sections.rule(1e-8, low=0, low_open=True)  # Adam's denominator epsilon
  weight_decay: float = sections.rule(0.0, low=0)  # decoupled (AdamW), on every parameter like torch.optim.AdamW
  max_grad_norm: float = sections.rule(1.0, low=0)  # global-norm clipping; 0 = off
  schedule: str = sections.rule("constant", choices=("constant", "cosine"))  # cosine: linear warmup, then cosine
  warmup_ratio: float = sections.rule(0.0, low=0, high=1, high_open=True)  # cosine: warmup = ratio * total_steps
  min_ratio: float = sections.rule(0.0, low=0, high=1)  # cosine: final lr = min_ratio * lr
  total_steps: int = sections.rule(0, low=0)  # cosine: steps to reach the final lr (0: the owner sets it)

  def __post_init__(self):
    sections.enforce(self)


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
  if cfg.schedule == "cosine" and cfg.total_steps < 1:
    raise ValueError("OptimConfig.schedule='cosine' needs total_steps >= 1")
  if cfg.schedule == "constant":
    return optax.constant_schedule(cfg.lr)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.lr, warmup_steps=round(cfg.warmup_ratio * cfg.total_steps),
      decay_steps=cfg.total_steps, end_value=cfg.min_ratio * cfg.lr)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
  adamw = optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
  if cfg.max_grad_norm > 0:
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)
  return adamw
