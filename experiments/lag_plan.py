"""The lag curve's plan, declared before any run (issue 51): OAPL and GRPO against a sampler of the SAME lag.

Every arm is the study's 'fresh' shape (experiments/plan.py): each trainer step draws one chunk of B x G
generated for it by the window's snapshot, the snapshot refreshed every L steps and the buffer cleared then;
so both losses see the same generations per step and the same staleness (a step at position s of a window
trains on data from a policy s steps old). OAPL regresses on its log-ratio to the sampler; GRPO carries its
token-level importance weight min(pi_old / pi_sampler, tis_cap) against the same sampler (one update per chunk:
its PPO ratio is 1 and the clip is inert, so the weight is its only correction for the lag).

Rules fixed before the runs:
  lags        L in LAGS (and CODE_LAGS on a code task); S = STEPS trainer steps, so every L divides S
  seeds       5 paired seeds (0..4): every (loss, L) cell of a seed shares its prompt order and eval draws
  settings    OAPL at its L = 50 tuned point from round 3 (reports/claims_v3); GRPO's lr tuned at L = 50 on
              the two seeds TUNE_SEEDS over GRPO_LRS (largest mean validation AUC, ties to the smaller lr),
              its clip at round 3's off-by-one winner (inert here); each loss keeps its point at every L
              (added while the sort tuning ran, before any main cell: GRPO_LRS' winner at an edge extends the
              grid one half-decade past it, 1e-4 -> 3e-5, 1e-3 -> 3e-3, both tuning seeds, until the winner is
              inside or MAX_EXTENSIONS were added)
  collapse    a run whose final test pass@1 is below the warm start's
  order       round-robin by seed, within a seed L = 50 first, then 10, 200, 1 (the claim's lag first)
  code task   (added in round 4's fourth session, before any code lag cell ran) the sandbox-graded code task at
              round 4's B = 8 reshape, OAPL at its tuned point there (reports/claims_v4/code_b8: lr 3e-4, beta2
              0.32), GRPO's clip at its off-by-one winner (0.05); GRPO's grid half a decade lower than the other
              tasks' (CODE_GRPO_LRS), since its tuning there collapsed at lr 1e-3 at every clip (AUC 0.005-0.014);
              lags CODE_LAGS; order in two phases (CODE_PHASES): every seed of L = 400, 50, 1 (the paper's
              lag, the claim's lag, on-policy) before any of L = 200, 10, round-robin by seed within a phase, so
              that a session that ends early leaves the paper's question answered at full n
  evals       (set after the six sort tuning runs, before any main cell, for time: evals were 40-60% of a run)
              the tuning cells as the claims study: policy eval every 10 steps, the test eval 32 samples per
              prompt; the main cells: policy eval every MAIN_EVAL_EVERY steps, the test eval MAIN_FINAL_SAMPLES
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from experiments import plan

LAGS = (1, 10, 50, 200)
CODE_LAGS = LAGS + (400,)
STEPS = 400  # every lag divides it; L = 200 is two windows
SEEDS = tuple(range(5))
TUNE_SEEDS = (1000, 1001)  # never main seeds
GRPO_LRS = (1e-4, 3e-4, 1e-3)
TUNE_LAG = 50
MAX_EXTENSIONS = 2
ORDER = (50, 10, 200, 1, 400)  # within a seed
CODE_GRPO_LRS = (3e-5, 1e-4, 3e-4)
CODE_PHASES = ((400, 50, 1), (200, 10))
MAIN_EVAL_EVERY = 20
MAIN_FINAL_SAMPLES = (8, (1, 2, 4, 8))


@dataclasses.dataclass(frozen=True)
class LagTask:
  """One task of the lag curve: the study it runs in and each loss's fixed point."""
  name: str
  config: str  # FILE[:ARG] as experiments.study takes it
  sets: tuple[tuple[str, object], ...]  # the study's reshape (--set)
  oapl: plan.Setting  # (lr, beta2): round 3's L = 50 winner
  grpo_clip: float  # round 3's off-by-one winner's clip (inert at one update per chunk)
  lags: tuple[int, ...] = LAGS
  grpo_lrs: tuple[float, ...] = GRPO_LRS
  phases: Optional[tuple[tuple[int, ...], ...]] = None  # lag groups run one after another (None: one group, ORDER)


# Round 3's tuned points (reports/claims_v3/README.md): 3-digit addition after the second extension
# (lr 1e-4, beta2 0.025; GRPO clip 0.1), sorting at the grid's winner (lr 1e-4, beta2 0.1; GRPO clip 0.2).
TASKS = {
    "digits3": LagTask("digits3", "configs/claims.py:arithmetic,digits3", (), (1e-4, 0.025), 0.1),
    "sort": LagTask("sort", "configs/own_task.py", (("loop.batch_prompts", 4), ("warmstart.steps", 500)),
                    (1e-4, 0.1), 0.2),
    "code": LagTask("code", "configs/claims.py:code", (("loop.batch_prompts", 8), ("loop.prompts_per_rollout", 8)),
                    (3e-4, 0.32), 0.05, lags=CODE_LAGS, grpo_lrs=CODE_GRPO_LRS, phases=CODE_PHASES),
}


def study_of(task: LagTask, smoke: bool = False) -> plan.Study:
  """The claims study of the task with S = STEPS (its warm start and run directories are the study's); the
  tuning cells run in it."""
  return plan.make_study(config=task.config, smoke=smoke, sets=dict(task.sets), secondary=False,
                         steps=None if smoke else STEPS)


def main_study(study: plan.Study) -> plan.Study:
  """The main cells' study: the same task, warm start and directories, the coarser eval (rules: evals)."""
  if study.smoke:
    return study
  return dataclasses.replace(study, every_steps=MAIN_EVAL_EVERY, final_samples=MAIN_FINAL_SAMPLES)


def arm(loss: str, lag: int) -> plan.Arm:
  return plan.Arm(f"lag{lag}_{loss}", loss, "fresh", lag, "claim")


def lags_of(task: LagTask, study: plan.Study) -> tuple[int, ...]:
  """The task's lags that divide the study's S (the smoke's S = 4: lags 1, 2, 4)."""
  return tuple(L for L in task.lags if study.steps % L == 0) if not study.smoke else (1, 2, 4)


def tuning_cells(task: LagTask, study: plan.Study, lrs: Optional[Sequence[float]] = None,
                 seeds: Sequence[int] = TUNE_SEEDS) -> list[plan.Cell]:
  lrs = task.grpo_lrs if lrs is None else lrs
  lag = TUNE_LAG if study.steps % TUNE_LAG == 0 else max(lags_of(task, study))
  return [study.cell(arm("grpo", lag), (lr, task.grpo_clip), s) for s in seeds for lr in lrs]


def main_cells(task: LagTask, study: plan.Study, grpo_lr: float, seeds: Sequence[int] = SEEDS) -> list[plan.Cell]:
  lags = lags_of(task, study)
  phases = [[L for L in phase if L in lags] for phase in task.phases] if task.phases and not study.smoke else \
      [sorted(lags, key=lambda L: ORDER.index(L) if L in ORDER else L)]
  points = {"oapl": task.oapl, "grpo": (grpo_lr, task.grpo_clip)}
  return [study.cell(arm(loss, L), points[loss], s)
          for phase in phases for s in seeds for L in phase for loss in ("oapl", "grpo")]


def extend(lrs: Sequence[float], winner: float) -> Optional[float]:
  """The next half-decade past an edge winner (1e-4 -> 3e-5 below, 1e-3 -> 3e-3 above), None inside the grid."""
  ordered = sorted(lrs)
  if len(ordered) < 2 or ordered[0] < winner < ordered[-1]:
    return None
  mantissa = round(winner / 10 ** math.floor(math.log10(winner) + 1e-9))
  if winner == ordered[0]:
    return float(f"{winner / 10 * 3:.0e}") if mantissa == 1 else float(f"{winner / 3:.0e}")
  return float(f"{winner * 3:.0e}") if mantissa == 1 else float(f"{winner / 3 * 10:.0e}")


def choose_lr(aucs: dict[float, list[Optional[float]]]) -> Optional[float]:
  """The lr with the largest mean validation AUC over the tuning seeds that finished (ties: the smaller lr);
  None when no lr has all its seeds."""
  complete = {lr: sum(v) / len(v) for lr, v in aucs.items() if v and all(x is not None for x in v)}
  if not complete:
    return None
  return min(complete, key=lambda lr: (-complete[lr], lr))
