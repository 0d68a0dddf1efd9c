"""The paper's five claims in miniature: losses x lags x seeds at equal generation and tuning budgets.

  python -m experiments.study --task arithmetic --out reports/claims_arithmetic
  python -m experiments.study --task chain --out reports/claims_chain
  python -m experiments.study --task arithmetic --out /tmp/claims --smoke     # CI: ~1-2 min
  ... --collect        # only rebuild the report from the run directories that exist

Losses: oapl, grpo (token IS + clip, pi_old per rollout chunk), grpo_onpolicy (lag 1 only: sync_every=1
with steps_per_rollout=1 refreshes the sampler before every rollout round and takes one optimizer step
on it), opmd, asymre. Lags L in {1, 10, 50, 100}; seeds {0, 1, 2}. The issue asks for L up to 200; at
this machine's speed a run is S = 100 steps, so the longest lag, 100, is the whole run on the warm
start's snapshot (the most off-policy a run of this budget can be).

Equal generation budget: every run takes S = 100 trainer steps and each step samples one fresh chunk
of B = 4 prompts x G = 8 responses (configs/claims.py), so every run draws S*B*G = 3200 responses
whatever its loss and lag; the lag only sets how many steps share a sampler snapshot (S / L windows).
Equal tuning budget: each loss gets the same 2 points (tuning_grid: the learning rate, the one knob every
loss has whose right value depends on the loss's own scale), run at the tuning lag (10; grpo_onpolicy:
1) with seed 0; the point with the best final validation pass@1 is then run at every lag and seed, and
everything the report states comes from the held-out test split (experiments/split_task.py).
Every run starts from ONE warm-start checkpoint per task (an imperfect teacher; docs/DESIGN.md: the seed
spread is mostly the warm start's, so it is held fixed and the RL seed varies).

Budget (arithmetic). 17 (loss, lag) cells x 3 seeds + 5 unchosen tuning points = 56 runs. Measured
on this 2-core machine at a load average of ~10 (other sessions' jobs): a 200-step run took 160-180 s,
~0.7 s per step of which the sampler is ~0.15 s (it runs beside the trainer), the rest the trainer
step and its per-step bookkeeping; hence S = 100: ~80 s a run + ~10 s of evals (validation every 20
steps: 64 prompts x 4 samples; at the end 64 val prompts x 16 and 128 test prompts x 64 samples) +
~2 s setup (one process, the persistent compile cache) = ~90 s, so ~85 min for 56 runs, plus the warm
start (300 steps, ~4 min) once. On an idle machine it is about half. Runs go in the order tuning,
then seed 0 of every cell, then seeds 1 and 2, so a study cut short still reports every cell.
Budget (chain): the same 56 runs with 50-59-token responses took 78-208 s each here (~85 s alone on the
machine, more beside other jobs): 6150 s in all, including a 238 s warm start (250 steps).
Resumable: a run with final_eval.json is skipped; an unfinished one resumes from its last checkpoint.
"""
from __future__ import annotations


import dataclasses
import json
import os
import sys
import time
from typing import Any, Sequence

STUDIED_LOSSES = ("oapl", "grpo", "grpo_onpolicy", "opmd", "asymre")
LAGS = (1, 10, 50, 100)  # 100 = the whole run on one sampler snapshot (S = 100)
SEEDS = (0, 1, 2)
LEARNING_RATES = {"arithmetic": (1e-4, 3e-4), "chain": (3e-5, 1e-4)}  # chain: at 3e-4 every loss fell (seed-0 probe)


def tuning_grid(task: str) -> dict:
  """loss -> its tuning points (the same learning rates for every loss of a task)."""
  return {loss: [{"config.trainer.optim.lr": lr} for lr in LEARNING_RATES[task]] for loss in STUDIED_LOSSES}

PASS_KS = (1, 2, 4, 5, 8, 10, 16, 32, 64)
FINAL_EVAL = "final_eval.json"
# experiments/ sits beside configs/ at the repository root (neither is installed with the package)
CONFIG_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "claims.py")


@dataclasses.dataclass(frozen=True)
class Study:
  task: str  # 'arithmetic' | 'chain'
  losses: tuple[str, ...]
  lags: tuple[int, ...]
  seeds: tuple[int, ...]
  tuning: dict  # loss -> list of override dicts, all the same length
  tune_lag: int = 10
  tune_seed: int = 0
  final_samples: int = 64  # per test prompt at the end (pass@k up to this k)
  val_samples: int = 16  # per validation prompt at the end (the tuning choice reads pass@1)
  smoke: bool = False

  def __post_init__(self):
    sizes = {len(self.tuning[loss]) for loss in self.losses}
    if len(sizes) != 1:
      raise ValueError(f"unequal tuning budgets: {({loss: len(self.tuning[loss]) for loss in self.losses})}")

  @property
  def config_spec(self) -> str:
    return f"{os.path.normpath(CONFIG_FILE)}:{self.task}{',smoke' if self.smoke else ''}"

  @property
  def ks(self) -> tuple[int, ...]:
    return tuple(k for k in PASS_KS if k <= self.final_samples)

  def lags_of(self, loss: str) -> tuple[int, ...]:
    return (1,) if loss == "grpo_onpolicy" else self.lags

  def tune_lag_of(self, loss: str) -> int:
    return 1 if loss == "grpo_onpolicy" else self.tune_lag


def make_study(task: str, smoke: bool = False) -> Study:
  if task not in ("arithmetic", "chain"):
    raise ValueError(f"--task must be 'arithmetic' or 'chain', got {task!r}")
  if smoke:  # 2 losses x 2 lags x 1 seed, one tuning point each
    grid = tuning_grid(task)
    return Study(task, ("oapl", "grpo"), (1, 2), (0,), {l: grid[l][:1] for l in ("oapl", "grpo")},
                 tune_lag=2, final_samples=8, val_samples=4, smoke=True)
  return Study(task, STUDIED_LOSSES, LAGS, SEEDS, tuning_grid(task))


# ------------------------------------------------------------------------------ the runs
@dataclasses.dataclass(frozen=True)
class Cell:
  """One run's identity: loss, tuning point, lag, seed."""
  loss: str
  point: int
  lag: int
  seed: int

  def overrides(self, study: Study) -> dict:
    return {"config.trainer.loss": self.loss, **study.tuning[self.loss][self.point],
            "config.loop.sync_every": self.lag, "config.seed": self.seed}


def tuning_cells(study: Study) -> list[Cell]:
  return [Cell(loss, p, study.tune_lag_of(loss), study.tune_seed)
          for loss in study.losses for p in range(len(study.tuning[loss]))]


def main_cells(study: Study, best_point: dict[str, int]) -> list[Cell]:
  """Seed-major order: every (loss, lag) with the first seed before any second seed."""
  return [Cell(loss, best_point[loss], lag, seed) for seed in study.seeds
          for loss in study.losses for lag in study.lags_of(loss)]


def run_dir_name(study: Study, cell: Cell) -> str:
  from oapl_jax.apps import sweep  # pylint: disable=import-outside-toplevel
  every = [c.overrides(study) for c in _all_cells(study)]
  names = dict(zip(map(_key, every), sweep.run_names(every)))
  return names[_key(cell.overrides(study))]


def _all_cells(study: Study) -> list[Cell]:
  return [Cell(loss, p, lag, seed) for loss in study.losses for p in range(len(study.tuning[loss]))
          for lag in study.lags_of(loss) for seed in study.seeds]


def _key(overrides: dict) -> str:
  return json.dumps(overrides, sort_keys=True)


def run_config(study: Study, cell: Cell, warm_start_dir: str):
  """configs/claims.py:<task> with the cell's overrides and the derived loop fields."""
  from oapl_jax.run import files  # pylint: disable=import-outside-toplevel
  cfg = files.load(study.config_spec)
  steps = cfg.loop.sync_every * cfg.loop.num_syncs
  eval_every = cfg.loop.sync_every * cfg.loop.eval_every_syncs
  if steps % cell.lag:
    raise ValueError(f"lag {cell.lag} does not divide the {steps} trainer steps of a {study.task} run")
  overrides = {**cell.overrides(study), "config.loop.num_syncs": steps // cell.lag,
               "config.loop.eval_every_syncs": max(1, eval_every // cell.lag),
               "config.model.checkpoint": os.path.abspath(warm_start_dir), "config.warmstart.steps": 0}
  for key, value in overrides.items():
    files.override(cfg, key, value)
  return cfg


def is_done(workdir: str) -> bool:
  return os.path.exists(os.path.join(workdir, FINAL_EVAL))


def execute(study: Study, cell: Cell, workdir: str, warm_start_dir: str) -> None:
  """One run in this process (loop.setup + loop.train, resuming if its directory holds a checkpoint),
  then pass@k of the final policy on val and test with `final_samples` samples per prompt."""
  from oapl_jax import evaluation  # pylint: disable=import-outside-toplevel
  from experiments import split_task  # pylint: disable=import-outside-toplevel
  from oapl_jax.rl import loop  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import assemble  # pylint: disable=import-outside-toplevel
  start = time.time()
  run = assemble.setup(run_config(study, cell, warm_start_dir), workdir)
  cfg = run.cfg
  summary = loop.train(run)
  if not summary["finished"]:
    raise RuntimeError(f"{workdir}: the run stopped before its last window ({summary})")
  _, test = split_task.build(cfg.task)
  final = {"cell": dataclasses.asdict(cell), "trainer_steps": summary["trainer_steps"],
           "generations": summary["trainer_steps"] * cfg.loop.prompts_per_rollout * cfg.loop.group_size
           // cfg.loop.steps_per_rollout}
  for name, problems, samples in (("val", run.task.eval_sets["val"], study.val_samples),
                                  ("test", test, study.final_samples)):
    final[name] = evaluation.evaluate(run.sampler, run.sampler.params, run.task, problems, samples=samples,
                                      ks=[k for k in study.ks if k <= samples], settings=run.eval_settings,
                                      seed=cfg.seed + 104_729)
  final["wall_seconds"] = time.time() - start
  _write_json(os.path.join(workdir, FINAL_EVAL), final)


def _write_json(path: str, value: Any) -> None:
  with open(path + ".tmp", "w") as f:
    json.dump(value, f, indent=2)
  os.replace(path + ".tmp", path)


def read_final(workdir: str) -> dict:
  with open(os.path.join(workdir, FINAL_EVAL)) as f:
    return json.load(f)


# ------------------------------------------------------------------------------ the warm start
def warm_start(study: Study, directory: str) -> str:
  """The task's warm-start checkpoint (an HF directory every run loads), made once; its own pass@k on
  val and test (the 'start' row of the report) in <directory>/eval.json."""
  if os.path.exists(os.path.join(directory, "eval.json")):
    return directory
  from oapl_jax import evaluation  # pylint: disable=import-outside-toplevel
  from experiments import split_task  # pylint: disable=import-outside-toplevel
  from oapl_jax.models import hf  # pylint: disable=import-outside-toplevel
  from oapl_jax.rl import warmstart  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import assemble, files, schema  # pylint: disable=import-outside-toplevel
  from oapl_jax.sampler import core  # pylint: disable=import-outside-toplevel
  start = time.time()
  cfg = schema.from_config(files.load(study.config_spec))
  task, test = split_task.build(cfg.task)
  placement = assemble.placement(cfg)
  model, params = assemble.build_model(cfg, placement.trainer)
  demos = task.demonstrations(cfg.seed)
  seq_len = max(len(d.prompt_tokens) + len(d.completion_tokens) for d in demos) - 1
  params = warmstart.warm_start(demos, params, model, placement.trainer, cfg.warmstart, seq_len=seq_len,
                                seed=cfg.seed,
                                log=lambda step, m: print(f"[claims] warm start step {step}: {m}", flush=True))
  tokenizer = task.tokenizer
  hf.save(directory, model.config, params, token_ids=hf.TokenIds(eos=tokenizer.eos_id, pad=tokenizer.pad_id,
                                                                 bos=tokenizer.bos_id))
  _, eval_settings = assemble.sampling(cfg, task)
  sampler = core.Sampler(model, layout=placement.sampler, num_slots=cfg.sampler.num_slots,
                         max_prefill_length=cfg.sampler.max_prefill_length, max_new_tokens=eval_settings.max_new_tokens)
  sampler.refresh(params)
  result = {name: evaluation.evaluate(sampler, sampler.params, task, problems, samples=study.final_samples,
                                      ks=study.ks, settings=eval_settings, seed=104_729)
            for name, problems in (("val", task.eval_sets["val"]), ("test", test))}
  result["wall_seconds"] = time.time() - start
  _write_json(os.path.join(directory, "eval.json"), result)
  print(f"[claims] warm start: {time.time() - start:.0f}s, test {result['test']}", flush=True)
  return directory


# ------------------------------------------------------------------------------ the study
def best_points(study: Study, runs_dir: str) -> dict[str, int]:
  """Per loss, the tuning point with the best final validation pass@1 (ties: the first)."""
  best = {}
  for loss in study.losses:
    scores = []
    for cell in (c for c in tuning_cells(study) if c.loss == loss):
      workdir = os.path.join(runs_dir, run_dir_name(study, cell))
      scores.append(read_final(workdir)["val"]["pass@1"] if is_done(workdir) else float("-inf"))
    best[loss] = max(range(len(scores)), key=lambda i: (scores[i], -i))
  return best


def run_study(study: Study, runs_dir: str, collect: bool = False) -> dict[str, int]:
  """Warm start, tuning runs, then the chosen point at every lag and seed; returns the chosen points."""
  os.makedirs(runs_dir, exist_ok=True)
  warm_dir = os.path.join(runs_dir, "warmstart")
  if not collect:
    warm_start(study, warm_dir)
  stages = [("tuning", tuning_cells(study)), ("main", None)]
  for stage, cells in stages:
    cells = cells if cells is not None else main_cells(study, best_points(study, runs_dir))
    for index, cell in enumerate(cells):
      workdir = os.path.join(runs_dir, run_dir_name(study, cell))
      if is_done(workdir) or collect:
        continue
      print(f"[claims] {stage} {index + 1}/{len(cells)}: {os.path.basename(workdir)}", flush=True)
      execute(study, cell, workdir, warm_dir)
      final = read_final(workdir)
      print(f"[claims]   done in {final['wall_seconds']:.0f}s: val pass@1 {final['val']['pass@1']:.3f}, "
            f"test pass@1 {final['test']['pass@1']:.3f}", flush=True)
  return best_points(study, runs_dir)


def enable_compile_cache(directory: str) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_compilation_cache_dir", os.path.abspath(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
