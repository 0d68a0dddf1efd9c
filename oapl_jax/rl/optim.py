"""AdamW with optional global-norm clipping and a constant or warmup+cosine learning rate.

The cosine schedule is the one verl / HF use (linear warmup from 0, then cosine down to
min_ratio * lr at total_steps, constant after), e.g. the paper's code setting: lr 1e-6,
warmup_ratio 0.02, min_ratio 0.05.
"""
import dataclasses

import optax


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  lr: float = 1e-6
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.0  # decoupled (AdamW), applied to every parameter like torch.optim.AdamW
  max_grad_norm: float = 0.0  # global-norm clipping; 0 = off
  schedule: str = "constant"  # 'constant' | 'cosine'
  warmup_ratio: float = 0.0  # cosine: warmup steps = round(warmup_ratio * total_steps)
  min_ratio: float = 0.0  # cosine: final lr = min_ratio * lr
  total_steps: int = 0  # cosine: steps to reach the final lr

  def __post_init__(self):
    if self.schedule not in ("constant", "cosine"):
      raise ValueError(f"OptimConfig.schedule={self.schedule!r}; expected 'constant' or 'cosine'")
    if self.schedule == "cosine" and self.total_steps <= 0:
      raise ValueError("OptimConfig.schedule='cosine' needs total_steps > 0")
    if not 0.0 <= self.warmup_ratio < 1.0:
      raise ValueError(f"OptimConfig.warmup_ratio={self.warmup_ratio} must be in [0, 1)")
    if self.max_grad_norm < 0:
      raise ValueError(f"OptimConfig.max_grad_norm={self.max_grad_norm} must be >= 0 (0 = off)")


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
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
