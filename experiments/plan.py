"""The claims study's plan, declared before any run: its arms (a method as run), each loss's tuning grid (the
same budget for every method: 3 learning rates x 3 values of the method's own binding knob), cells (arm x
setting x seed), their configs and commands, and the priority order that lets a study cut short still cover
every claim at a lower n. One study is one task: any training config (experiments/task_config.py).

Arms. B = loop.batch_prompts, G = loop.group_size, S trainer steps, main lag L, long lag LL:
  fresh       sync_every=L, steps_per_rollout=1, prompts_per_rollout=B: each step draws one chunk of B x G
              generated for it by the window's snapshot (OAPL's Algorithm 1 at lag L)
  reuse2      as fresh, but steps_per_rollout=2: every group is trained on twice; half the generations
  off_by_one  sync_every=2, steps_per_rollout=2, prompts_per_rollout=2B, sampler_delay_windows=1: the paper's
              asynchronous off-by-one GRPO (one chunk from the previous window's params, 2 updates on it)
  on_policy   sync_every=1, steps_per_rollout=1, prompts_per_rollout=B: a fresh snapshot every step
Every shape but reuse2 generates B x G per step: the equal generation budget.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
from typing import Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLAIMS_CONFIG = os.path.join(REPO, "configs", "claims.py")
TASK_CONFIG = os.path.join(REPO, "experiments", "task_config.py")
NAMED_TASKS = ("arithmetic", "hard_tail")  # --task NAME: configs/claims.py:NAME
TUNE_SEED = 1000  # the tuning and pilot runs' seed; the main cells use 0..7, never this one
MAIN_SEEDS = tuple(range(8))
# the power rule, fixed before any run: 8 seeds for every arm a claim's test reads (the sign-flip p cannot
# fall below 2/2^n: 0.0625 at n = 5, under 0.05 / 5 = 0.01, Holm's first threshold, only from n = 8);
# 5 for the baselines and probes that are reported but take no part in the Holm family
PLANNED_N = {"claim": 8, "baseline": 5, "secondary": 5, "probe": 5}
SEED_ROUNDS = (2, 5, 8)  # round-robin: seeds [0, 2) of every arm, then [2, 5), then [5, 8)
LEARNING_RATES = (3e-5, 1e-4, 3e-4)  # every tuned loss alike
# each loss's own binding knob (the dotted field and 3 values, the middle one the default): OAPL's pace at a
# fixed lag is set by beta2 (one window moves a response's odds by about e^{A/beta2}), GRPO's by its clip
KNOBS = {"oapl": ("trainer.loss_settings.oapl.beta2", (0.1, 0.25, 0.5)),
         "grpo": ("trainer.loss_settings.grpo.clip_eps", (0.1, 0.2, 0.3)),
         "grpo_onpolicy": ("trainer.loss_settings.grpo_onpolicy.clip_eps", (0.1, 0.2, 0.3)),
         "opmd": ("trainer.loss_settings.opmd.tau", (0.5, 1.0, 2.0)),
         "asymre": ("trainer.loss_settings.asymre.shift", (-0.2, -0.1, 0.0))}
PRIMARY_LOSSES = ("oapl", "grpo", "grpo_onpolicy")  # tuned first; opmd and asymre only if the budget allows
SECONDARY_LOSSES = ("opmd", "asymre")
BETA1_PROBE = (0.5, 1.0, 4.0)  # OAPL at L = 1 (lowest priority)
METHOD_KEYS = ("trainer.loss", "trainer.loss_settings", "trainer.optim.lr", "loop.sync_every", "loop.num_syncs",
               "loop.steps_per_rollout", "loop.prompts_per_rollout", "loop.sampler_delay_windows",
               "checkpoint.every_syncs")  # what may differ between paired cells (with seed and task equal)


@dataclasses.dataclass(frozen=True)
class Arm:
  name: str  # e.g. 'oapl_L50', 'grpo_obo'
  loss: str  # its setting is the loss's tuned one
  shape: str  # 'fresh' | 'reuse2' | 'off_by_one' | 'on_policy'
  lag: int
  tier: str  # 'claim' | 'baseline' | 'secondary' | 'probe' (PLANNED_N)
  extra: tuple = ()  # further (dotted key, value) overrides: the beta1 probe's

  @property
  def planned_n(self) -> int:
    return PLANNED_N[self.tier]


Setting = tuple[float, float]  # (learning rate, the loss's knob value)


@dataclasses.dataclass(frozen=True)
class Cell:
  arm: Arm
  setting: Setting
  seed: int
  task: str = "task"  # the study's name (the run directory's first part)

  @property
  def lr(self) -> float:
    return self.setting[0]

  @property
  def name(self) -> str:
    """The run directory, relative to the study's runs directory."""
    knob = KNOBS[self.arm.loss][0].rsplit(".", 1)[1]
    return f"{self.task}/{self.arm.name}/lr{self.lr:g}_{knob}{self.setting[1]:g}/seed{self.seed}"


@dataclasses.dataclass(frozen=True)
class Study:
  name: str  # the task's name in directories and the report
  config: str  # the cells' config spec (FILE[:ARG]; experiments/task_config.py:USER_SPEC for a user's config)
  smoke: bool
  steps: int  # S
  lag: int  # the main lag L
  long_lag: int  # claim 3's LL (S / LL windows: several)
  batch: int  # B (the config's loop.batch_prompts)
  every_steps: int  # the policy-eval grid
  shared: tuple[tuple[str, object], ...] = ()  # overrides for every cell and the warm start (the smoke's sizes)
  seeds: tuple[int, ...] = MAIN_SEEDS
  seed_rounds: tuple[int, ...] = SEED_ROUNDS
  learning_rates: tuple[float, ...] = LEARNING_RATES
  knob_points: Optional[int] = None  # the smoke's 1: the middle knob value only
  secondary: bool = True  # run the secondary baselines and the beta1 probe after the claims' cells
  final_samples: Optional[tuple[int, tuple[int, ...]]] = None  # the end-of-run test eval's (samples, ks), if not
  # the harness's default (experiments/claims.FINAL_SAMPLES)
  tune_seeds: tuple[int, ...] = (TUNE_SEED,)  # a tuning point's AUC is its mean over these seeds
  claim1_only: bool = False  # only claim 1's arms (the main OAPL arm, off-by-one GRPO): pilot, tuning, main
  knob_values: tuple[tuple[str, tuple[float, ...]], ...] = ()  # (loss, values): a knob grid other than KNOBS'
  # (the strength rule sets OAPL's after the pilot: tuning.beta2_by_strength)
  beta2_by_strength: bool = False  # set OAPL's beta2 grid from the pilot's measured beta2 share

  def arms(self) -> dict[str, Arm]:
    """name -> arm, in priority order within a seed."""
    L, LL = self.lag, self.long_lag
    out = [Arm(f"oapl_L{L}", "oapl", "fresh", L, "claim"),
           Arm("grpo_obo", "grpo", "off_by_one", 2, "claim"),
           *(() if self.claim1_only else (Arm(f"oapl_L{LL}", "oapl", "fresh", LL, "claim"),)),
           Arm(f"oapl_L{L}_reuse2", "oapl", "reuse2", L, "claim"),
           Arm("grpo_onpolicy", "grpo_onpolicy", "on_policy", 1, "baseline")]
    if self.claim1_only:
      out = out[:2]
    elif self.secondary:
      out += [Arm(f"{loss}_L{L}", loss, "fresh", L, "secondary") for loss in SECONDARY_LOSSES]
      out += [Arm(f"oapl_L1_beta1_{b:g}", "oapl", "on_policy", 1, "probe",
                  (("trainer.loss_settings.oapl.beta1", b),)) for b in BETA1_PROBE]
    return {a.name: a for a in out}

  def primary_arms(self) -> list[Arm]:
    """The arms the pilot's headroom rule checks: every arm a claim reads, and the on-policy baseline."""
    return [a for a in self.arms().values() if a.tier in ("claim", "baseline")]

  def tuning_arm(self, loss: str) -> Arm:
    """The arm a loss is tuned in (its main cell); its setting then serves every arm of that loss."""
    return self.arms()[{"grpo": "grpo_obo", "grpo_onpolicy": "grpo_onpolicy"}.get(loss, f"{loss}_L{self.lag}")]

  def knob_grid(self, loss: str) -> tuple[float, ...]:
    """The values of the loss's knob that its tuning grid crosses with the learning rates."""
    return dict(self.knob_values).get(loss, KNOBS[loss][1])

  def grid(self, loss: str) -> list[Setting]:
    """The loss's tuning grid: every learning rate x every value of its knob (the same size for every loss)."""
    values = self.knob_grid(loss)
    if self.knob_points == 1:
      values = (values[len(values) // 2],)
    return [(lr, v) for lr in self.learning_rates for v in values]

  def middle(self, loss: str) -> Setting:
    """The grid's middle point (the middle lr, the knob's middle value): the pilot's setting."""
    lrs, values = self.learning_rates, KNOBS[loss][1]
    return lrs[len(lrs) // 2], values[len(values) // 2]

  def primary_losses(self) -> tuple[str, ...]:
    """The losses tuned before the main cells (claim 1's two only, in a claim-1 study)."""
    return PRIMARY_LOSSES[:2] if self.claim1_only else PRIMARY_LOSSES

  def losses(self) -> tuple[str, ...]:
    return self.primary_losses() + (SECONDARY_LOSSES if self.secondary and not self.claim1_only else ())

  def cell(self, arm: Arm, setting: Setting, seed: int) -> Cell:
    return Cell(arm, tuple(setting), seed, self.name)


def study_config(task: Optional[str], config: Optional[str]) -> tuple[str, str]:
  """(study name, the cells' config spec) from --task NAME or --config FILE[:ARG]."""
  if config:
    path, _, arg = config.partition(":")
    name = os.path.splitext(os.path.basename(path))[0] + (f"_{arg.replace(',', '_').replace('=', '')}" if arg else "")
    if os.path.abspath(path) == CLAIMS_CONFIG:
      return name, config
    return name, f"{os.path.relpath(TASK_CONFIG, REPO)}:{config}"
  task = task or "arithmetic"
  if task not in NAMED_TASKS:
    raise ValueError(f"--task {task!r}: known {NAMED_TASKS}; any other task comes by --config FILE[:ARG]")
  return task, f"{os.path.relpath(CLAIMS_CONFIG, REPO)}:{task}"


def make_study(task: Optional[str] = None, config: Optional[str] = None, smoke: bool = False, secondary: bool = True,
               steps: Optional[int] = None, seeds: Optional[Sequence[int]] = None,
               sets: Optional[dict] = None, **rules) -> Study:
  """The study of a named task (configs/claims.py) or of any config; the smoke: S = 4, lags 2 and 4, 2 seeds,
  one tuning point per loss, a 5-step warm start, 8 validation prompts. `sets` (dotted field -> value) reshape
  the task for the study in every cell and the warm start (e.g. a smaller batch); they name the study's
  directory too, so a reshaped study never resumes another's runs. `rules`: the Study's tune_seeds, claim1_only,
  beta2_by_strength."""
  from oapl_jax.run import files  # pylint: disable=import-outside-toplevel
  name, spec = study_config(task, config)
  if smoke and spec.startswith(os.path.relpath(CLAIMS_CONFIG, REPO)):
    spec += ",smoke"
  sets = dict(sets or {})
  if sets:
    name += "_" + "_".join(f"{key.rsplit('.', 1)[-1]}{value:g}" if isinstance(value, float) else
                           f"{key.rsplit('.', 1)[-1]}{value}" for key, value in sets.items())
  cfg = files.load(spec, sets)
  batch = 4 if smoke else int(cfg.loop.batch_prompts)
  if smoke:
    shared = (*sets.items(), ("warmstart.steps", min(int(cfg.warmstart.steps), 5)), ("eval.num_prompts", 8),
              ("loop.batch_prompts", batch))
    return Study(name, spec, True, steps=4, lag=2, long_lag=4, batch=batch, every_steps=2, shared=shared,
                 seeds=(0, 1), seed_rounds=(1, 2), learning_rates=(1e-4,), knob_points=1, secondary=False, **rules)
  from configs import claims as c  # pylint: disable=import-outside-toplevel
  every = int(cfg.eval.every_steps) or c.EVAL_EVERY_STEPS
  study = Study(name, spec, False, steps or c.STEPS, c.LAG, c.LONG_LAG, batch, every, shared=tuple(sets.items()),
                secondary=secondary, **rules)
  return dataclasses.replace(study, seeds=tuple(seeds)) if seeds else study


def loop_overrides(study: Study, arm: Arm) -> dict:
  B, S = study.batch, study.steps
  if S % arm.lag:
    raise ValueError(f"arm {arm.name}: lag {arm.lag} does not divide the run's {S} steps")
  shape = {"fresh": (1, B, 0), "reuse2": (2, B, 0), "off_by_one": (2, 2 * B, 1), "on_policy": (1, B, 0)}[arm.shape]
  return {"loop.sync_every": arm.lag, "loop.num_syncs": S // arm.lag, "loop.steps_per_rollout": shape[0],
          "loop.prompts_per_rollout": shape[1], "loop.sampler_delay_windows": shape[2],
          "checkpoint.every_syncs": max(1, min(S, 50) // arm.lag)}  # a save about every 50 steps


def shape_overrides(study: Study) -> dict:
  """The run's shape, equal in every cell: the shared sizes, B, the policy-eval grid."""
  return {**dict(study.shared), "loop.batch_prompts": study.batch, "eval.every_steps": study.every_steps}


def overrides(study: Study, cell: Cell, warm_dir: str) -> dict:
  """Every field the cell sets on the study's config (the command's --config.* flags, in order)."""
  return {**shape_overrides(study), "seed": cell.seed, "model.checkpoint": os.path.abspath(warm_dir),
          "warmstart.steps": 0, "trainer.loss": cell.arm.loss, "trainer.optim.lr": cell.lr,
          KNOBS[cell.arm.loss][0]: cell.setting[1], **loop_overrides(study, cell.arm), **dict(cell.arm.extra)}


def warm_key(study: Study) -> str:
  """What the warm start is made from (the config's warmstart/model/task sections and seed, with the shared
  overrides, and the devices it is computed on: the same seed on 1 and on 8 CPU devices gives other params,
  every tensor differing after 30 steps), hashed: a study reuses a warm start only when these are equal."""
  import jax  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import files, shared_warmstart  # pylint: disable=import-outside-toplevel
  made_from = shared_warmstart.fields(files.load(study.config, dict(study.shared)))
  made_from["devices"] = f"{jax.default_backend()} x {jax.device_count()}, jax {jax.__version__}"
  return hashlib.sha256(json.dumps(made_from, sort_keys=True).encode()).hexdigest()[:12]


def command(study: Study, cell: Cell, warm_dir: str, workdir: str) -> str:
  """The `python -m oapl_jax.main` line that trains this cell alone (the harness adds the test-split eval)."""
  flags = [f"--config.{k}={v}" for k, v in overrides(study, cell, warm_dir).items()]
  return shlex.join(["python", "-m", "oapl_jax.main", "--config", study.config, "--workdir", workdir]) + " " + \
      " ".join(shlex.quote(f) for f in flags)


# ------------------------------------------------------------------------------ the order of the cells
def tuning_cells(study: Study, loss: str, settings: Optional[Sequence[Setting]] = None) -> list[Cell]:
  """The loss's grid (or `settings`) on every tuning seed: the first seed's whole grid, then the next's."""
  arm = study.tuning_arm(loss)
  return [study.cell(arm, s, seed) for seed in study.tune_seeds
          for s in (study.grid(loss) if settings is None else settings)]


def pilot_cells(study: Study) -> list[Cell]:
  """Every primary arm at its loss's middle grid point on the tuning seed (the tuning arms' are tuning runs too)."""
  return [study.cell(a, study.middle(a.loss), study.tune_seeds[0]) for a in study.primary_arms()]


def main_cells(study: Study, chosen: dict[str, Setting], tiers: Sequence[str] = ("claim", "baseline")) -> list[Cell]:
  """Round-robin by seed: each round's seeds for every arm (of `tiers`, with a chosen setting) before the next
  round's; within a seed the arms in `Study.arms` order. An arm stops at its planned n."""
  arms = [a for a in study.arms().values() if a.tier in tiers and a.loss in chosen]
  cells, start = [], 0
  for end in study.seed_rounds:
    for seed in study.seeds[start:end]:
      cells += [study.cell(a, chosen[a.loss], seed) for a in arms if study.seeds.index(seed) < planned(study, a)]
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
