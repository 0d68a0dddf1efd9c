"""The claims study's plan: its arms (a method as run), cells (arm x learning rate x seed), their configs and
commands, and the priority order that lets a study cut short still cover every claim at a lower n.

Arms. B = loop.batch_prompts, G = loop.group_size, S trainer steps, main lag L (configs/claims.py):
  fresh       sync_every=L, steps_per_rollout=1, prompts_per_rollout=B: each step draws one chunk of B x G
              generated for it by the window's snapshot (OAPL's Algorithm 1 at lag L)
  reuse2      as fresh, but steps_per_rollout=2: a chunk of B x G every 2 steps and each step draws B least-used
              groups, so every group is trained on twice and a run generates half (the paper's fewer
              generations: each rollout reused for 2 steps); equal steps, half the generations
  off_by_one  sync_every=2, steps_per_rollout=2, prompts_per_rollout=2B, sampler_delay_windows=1: a window's
              one chunk of 2B x G comes from the params at the start of the previous window and is split into
              2 mini-batches (2 updates), so GRPO's ratio to pi_old (the round's first params) moves and the
              clip acts (the paper's asynchronous off-by-one baseline)
  on_policy   sync_every=1, steps_per_rollout=1, prompts_per_rollout=B: a fresh snapshot every step
Every shape but reuse2 generates B x G per step: the equal generation budget.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILE = os.path.join(REPO, "configs", "claims.py")
TASKS = ("arithmetic", "hard_tail")  # task A (pass@1, entropy, lags, generations), task B (pass@k per half)
TUNE_SEED = 1000  # the tuning runs' seed; the main cells use 0..7, never this one
MAIN_SEEDS = tuple(range(8))
# the power rule, fixed before any run: 8 seeds for every arm a claim's test reads (the sign-flip p cannot
# fall below 2/2^n: 0.0625 at n = 5, under 0.05 / 5 = 0.01, Holm's first threshold, only from n = 8);
# 5 for the baselines and probes that are reported but take no part in the Holm family
PLANNED_N = {"claim": 8, "baseline": 5, "secondary": 5, "probe": 5}
SEED_ROUNDS = (2, 5, 8)  # round-robin: seeds [0, 2) of every arm, then [2, 5), then [5, 8)
LEARNING_RATES = (3e-5, 1e-4, 3e-4)  # every tuned loss; the demo's OAPL lr 1e-4 in the middle
EXTENSION = {"low": 1e-5, "high": 1e-3}  # one point beyond an edge winner, added for every loss alike
PRIMARY_LOSSES = ("oapl", "grpo", "grpo_onpolicy")  # tuned first; opmd and asymre only if the budget allows
SECONDARY_LOSSES = ("opmd", "asymre")
BETA1_PROBE = (0.5, 1.0, 4.0)  # OAPL at L = 1 (lowest priority)
METHOD_KEYS = ("trainer.loss", "trainer.loss_settings", "trainer.optim.lr", "loop.sync_every", "loop.num_syncs",
               "loop.steps_per_rollout", "loop.prompts_per_rollout", "loop.sampler_delay_windows",
               "checkpoint.every_syncs")  # what may differ between paired cells (with seed and task equal)


@dataclasses.dataclass(frozen=True)
class Arm:
  name: str  # e.g. 'oapl_L50', 'grpo_obo'
  task: str  # 'arithmetic' | 'hard_tail'
  loss: str  # its learning rate is the loss's tuned one
  shape: str  # 'fresh' | 'reuse2' | 'off_by_one' | 'on_policy'
  lag: int
  tier: str  # 'claim' | 'baseline' | 'secondary' | 'probe' (PLANNED_N)
  extra: tuple = ()  # further (dotted key, value) overrides: the beta1 probe's

  @property
  def planned_n(self) -> int:
    return PLANNED_N[self.tier]


@dataclasses.dataclass(frozen=True)
class Cell:
  arm: Arm
  lr: float
  seed: int

  @property
  def name(self) -> str:
    """The run directory, relative to the study's runs directory."""
    return f"{self.arm.task}/{self.arm.name}/lr{self.lr:g}/seed{self.seed}"


@dataclasses.dataclass(frozen=True)
class Study:
  smoke: bool
  steps: int  # S
  lag: int  # the main lag (50)
  long_lag: int  # claim 3's (100): half the run on the warm start's snapshot
  batch: int  # B
  every_steps: int  # the policy-eval grid
  seeds: tuple[int, ...] = MAIN_SEEDS
  seed_rounds: tuple[int, ...] = SEED_ROUNDS
  learning_rates: tuple[float, ...] = LEARNING_RATES
  extension: tuple[tuple[str, float], ...] = tuple(EXTENSION.items())
  secondary: bool = True  # run the secondary baselines and the beta1 probe after the claims' cells

  def config_spec(self, task: str) -> str:
    return f"{CONFIG_FILE}:{task}{',smoke' if self.smoke else ''}"

  def arms(self) -> dict[str, Arm]:
    """name -> arm, in priority order within a seed (task B's arms are named 'hard_tail/<name>')."""
    L, LL = self.lag, self.long_lag
    out = [Arm(f"oapl_L{L}", "arithmetic", "oapl", "fresh", L, "claim"),
           Arm("grpo_obo", "arithmetic", "grpo", "off_by_one", 2, "claim"),
           Arm(f"oapl_L{LL}", "arithmetic", "oapl", "fresh", LL, "claim"),
           Arm(f"oapl_L{L}_reuse2", "arithmetic", "oapl", "reuse2", L, "claim"),
           Arm(f"oapl_L{L}", "hard_tail", "oapl", "fresh", L, "claim"),
           Arm("grpo_obo", "hard_tail", "grpo", "off_by_one", 2, "claim"),
           Arm("grpo_onpolicy", "arithmetic", "grpo_onpolicy", "on_policy", 1, "baseline")]
    if self.secondary:
      out += [Arm(f"{loss}_L{L}", "arithmetic", loss, "fresh", L, "secondary") for loss in SECONDARY_LOSSES]
      out += [Arm(f"oapl_L1_beta1_{b:g}", "arithmetic", "oapl", "on_policy", 1, "probe",
                  (("trainer.loss_settings.oapl.beta1", b),)) for b in BETA1_PROBE]
    return {f"{a.task}/{a.name}" if a.task != "arithmetic" else a.name: a for a in out}

  def tuning_arm(self, loss: str) -> Arm:
    """The arm a loss is tuned in (task A, its main cell); its lr then serves every arm of that loss."""
    return self.arms()[{"grpo": "grpo_obo", "grpo_onpolicy": "grpo_onpolicy"}.get(loss, f"{loss}_L{self.lag}")]

  def losses(self) -> tuple[str, ...]:
    return PRIMARY_LOSSES + (SECONDARY_LOSSES if self.secondary else ())


def make_study(smoke: bool = False, secondary: bool = True) -> Study:
  if smoke:  # configs/claims.py:*,smoke: S = 4, lags 2 and 4, B = 4; 2 seeds, one tuning point, no extras
    return Study(True, steps=4, lag=2, long_lag=4, batch=4, every_steps=2, seeds=(0, 1), seed_rounds=(1, 2),
                 learning_rates=(1e-4,), secondary=False)
  from configs import claims as cfg  # pylint: disable=import-outside-toplevel
  return Study(False, cfg.STEPS, cfg.LAG, cfg.LONG_LAG, cfg.BATCH_PROMPTS, cfg.EVAL_EVERY_STEPS,
               secondary=secondary)


def loop_overrides(study: Study, arm: Arm) -> dict:
  B, S = study.batch, study.steps
  if S % arm.lag:
    raise ValueError(f"arm {arm.name}: lag {arm.lag} does not divide the run's {S} steps")
  shape = {"fresh": (1, B, 0), "reuse2": (2, B, 0), "off_by_one": (2, 2 * B, 1), "on_policy": (1, B, 0)}[arm.shape]
  return {"loop.sync_every": arm.lag, "loop.num_syncs": S // arm.lag, "loop.steps_per_rollout": shape[0],
          "loop.prompts_per_rollout": shape[1], "loop.sampler_delay_windows": shape[2],
          "checkpoint.every_syncs": max(1, min(S, 50) // arm.lag)}  # a save about every 50 steps


def overrides(study: Study, cell: Cell, warm_dir: str) -> dict:
  """Every field the cell sets on configs/claims.py:<task> (the command's --config.* flags, in order)."""
  return {"seed": cell.seed, "model.checkpoint": os.path.abspath(warm_dir), "warmstart.steps": 0,
          "trainer.loss": cell.arm.loss, "trainer.optim.lr": cell.lr, **loop_overrides(study, cell.arm),
          **dict(cell.arm.extra)}


def command(study: Study, cell: Cell, warm_dir: str, workdir: str) -> str:
  """The `python -m oapl_jax.main` line that trains this cell alone (the harness adds the test-split eval)."""
  spec = os.path.relpath(study.config_spec(cell.arm.task), REPO)
  flags = [f"--config.{k}={v}" for k, v in overrides(study, cell, warm_dir).items()]
  return shlex.join(["python", "-m", "oapl_jax.main", "--config", spec, "--workdir", workdir]) + " " + \
      " ".join(shlex.quote(f) for f in flags)


# ------------------------------------------------------------------------------ the order of the cells
def tuning_cells(study: Study, loss: str, lrs: Sequence[float]) -> list[Cell]:
  arm = study.tuning_arm(loss)
  return [Cell(arm, lr, TUNE_SEED) for lr in lrs]


def pilot_cell(study: Study) -> Cell:
  """OAPL at its main lag, the grid's middle learning rate, the tuning seed: also one of OAPL's tuning runs."""
  lrs = study.learning_rates
  return tuning_cells(study, "oapl", [lrs[len(lrs) // 2]])[0]


def main_cells(study: Study, chosen_lr: dict[str, float], tiers: Sequence[str] = ("claim", "baseline"),
               hard_tail: bool = True) -> list[Cell]:
  """Round-robin by seed: each round's seeds for every arm (of `tiers`, with a chosen lr) before the next
  round's; within a seed the arms in `Study.arms` order. An arm stops at its planned n."""
  arms = [a for a in study.arms().values() if a.tier in tiers and a.loss in chosen_lr
          and (hard_tail or a.task != "hard_tail")]
  cells, start = [], 0
  for end in study.seed_rounds:
    for seed in study.seeds[start:end]:
      cells += [Cell(a, chosen_lr[a.loss], seed) for a in arms if study.seeds.index(seed) < planned(study, a)]
    start = end
  return cells


def planned(study: Study, arm: Arm) -> int:
  """The arm's planned n (PLANNED_N), capped by the seeds this study has (the smoke's 2)."""
  return min(arm.planned_n, len(study.seeds))


# ------------------------------------------------------------------------------ pairing
def flatten(record: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in record.items():
    path = f"{prefix}{key}"
    out.update(flatten(value, path + ".") if isinstance(value, dict) else {path: value})
  return out


def config_differences(a: dict, b: dict) -> list[str]:
  """Fields two recorded configs (run/schema.to_mapping) differ in beyond METHOD_KEYS: what would break a pair."""
  fa, fb = flatten(a), flatten(b)
  method = lambda key: any(key == m or key.startswith(m + ".") for m in METHOD_KEYS)  # noqa: E731
  return sorted(k for k in set(fa) | set(fb) if not method(k) and fa.get(k, "<absent>") != fb.get(k, "<absent>"))
