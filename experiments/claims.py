"""The paper's five claims in miniature: the runner (plan: experiments/plan.py; report: claims_report.py).

  python -m experiments.study --task arithmetic --out reports/claims_arithmetic            # everything
  python -m experiments.study --task arithmetic --smoke --out /tmp/claims_smoke            # CI: ~2 min
  ... --collect          only rebuild the report from the run directories that exist
  ... --cell NAME        run (or resume) that one cell, e.g. arithmetic/grpo_obo/lr0.0001/seed3
  ... --checks_only      the warm starts, the pilot and task B's check only (~10 min): does the design work?

Order (a study cut short still reports every claim at a lower n):
  1. task A's warm start (one checkpoint every run loads; the RL seed varies, the warm start never does)
  2. the pilot: OAPL at L = 50, the grid's middle lr, the tuning seed. Validation pass@1 at mid-run must
     rise by tuning.PILOT_GAIN over the warm start and stay below tuning.PILOT_CEILING, else the study stops
     and says what to change (the task, never the losses). The pilot is also one of OAPL's tuning runs.
  3. task B's warm start and its check (the hard half never solved); --checks_only stops here
  4. tuning of oapl, grpo (off-by-one) and grpo_onpolicy: 3 learning rates each on the tuning seed, chosen by
     the area under the validation pass@1 curve; an edge winner adds one point beyond it for every loss
  5. the claims' arms and the on-policy baseline, round-robin by seed (plan.main_cells)
  6. opmd and asymre (tuned alike), then the beta1 probe at L = 1 (lowest priority)
Resumable: a run with final_eval.json is skipped; an unfinished one resumes from its last checkpoint (one
about every 50 steps). A resumed off-by-one run's first window samples from its restored params.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import time
from typing import Optional

from experiments import plan, results, tuning

FINAL_SEED_OFFSET = 104_729  # the test eval's seed: the run's eval seed + this (the same for paired cells)
FINAL_SAMPLES = {"arithmetic": (32, (1, 4, 8, 16, 32)), "hard_tail": (256, (1, 4, 16, 64, 256))}
SMOKE_SAMPLES = (8, (1, 2, 4, 8))


def final_sampling(study: plan.Study, task: str) -> tuple[int, tuple[int, ...]]:
  """(samples per test prompt, ks) of the end-of-run test eval."""
  return SMOKE_SAMPLES if study.smoke else FINAL_SAMPLES[task]


def task_and_tests(task_section):
  """(the loop's task, {test set name: problems}) from the study task's own `build` (split_task, hard_tail)."""
  module = importlib.import_module(task_section["name"].partition(":")[0])
  return module.build(task_section)


def run_config(study: plan.Study, cell: plan.Cell, warm_dir: str):
  from oapl_jax.run import files  # pylint: disable=import-outside-toplevel
  return files.load(study.config_spec(cell.arm.task), plan.overrides(study, cell, warm_dir))


def warm_dir_of(runs_dir: str, task: str) -> str:
  return os.path.join(runs_dir, task, "warmstart")


def execute(study: plan.Study, cell: plan.Cell, workdir: str, warm_dir: str) -> dict:
  """One run in this process (resuming if its directory holds a checkpoint), then pass@k of the final policy
  on the test sets; writes final_eval.json."""
  from oapl_jax import evaluation  # pylint: disable=import-outside-toplevel
  from oapl_jax.rl import loop  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import assemble  # pylint: disable=import-outside-toplevel
  start = time.time()
  run = assemble.setup(run_config(study, cell, warm_dir), workdir)
  rc = run.cfg
  summary = loop.train(run)
  if not summary["finished"]:
    raise RuntimeError(f"{workdir}: the run stopped before its last window ({summary})")
  _, tests = task_and_tests(rc.task)
  samples, ks = final_sampling(study, cell.arm.task)
  params = run.sampler.prepare(run.state.params)
  final = {"cell": cell.name, "arm": cell.arm.name, "task": cell.arm.task, "loss": cell.arm.loss, "lr": cell.lr,
           "seed": cell.seed, "trainer_steps": summary["trainer_steps"],
           "generations": rc.loop.num_syncs * rc.loop.schedule().prompts_per_window * rc.loop.group_size,
           "command": plan.command(study, cell, warm_dir, workdir), "train_seconds": time.time() - start,
           "test": {name: evaluation.evaluate(run.sampler, params, run.task, problems, samples=samples, ks=ks,
                                              settings=run.eval_settings,
                                              seed=assemble.eval_seed(rc) + FINAL_SEED_OFFSET)
                    for name, problems in tests.items()}}
  final["wall_seconds"] = time.time() - start
  results.write_json(os.path.join(workdir, results.FINAL_EVAL), final)
  return final


def warm_start(study: plan.Study, task: str, directory: str) -> dict:
  """The task's warm-start checkpoint (an HF directory every run of the task loads), made once with the task
  config's own warm start; its pass@k on the validation and test sets in <directory>/eval.json."""
  done = results.read_json(os.path.join(directory, "eval.json"))
  if done is not None:
    return done
  from oapl_jax import evaluation  # pylint: disable=import-outside-toplevel
  from oapl_jax.models import hf  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import assemble, files, schema  # pylint: disable=import-outside-toplevel
  start = time.time()
  rc = schema.from_config(files.load(study.config_spec(task)))
  loop_task = assemble.build_task(rc)
  _, tests = task_and_tests(rc.task)
  placement = assemble.placement(rc)
  model, params = assemble.build_model(rc, placement.trainer)
  seq = assemble.seq_len(rc, assemble.longest_prompt(loop_task))
  def log(step, metrics):
    if step % 200 == 0:
      print(f"[claims] {task} warm start step {step}: {metrics}", flush=True)
  params = assemble.warm_start(rc, loop_task, model, params, placement.trainer, seq, log)
  tok = loop_task.tokenizer
  hf.save(directory, model.config, params, token_ids=hf.TokenIds(eos=tok.eos_id, pad=tok.pad_id, bos=tok.bos_id))
  _, eval_settings = assemble.sampling(rc, loop_task)
  sampler = assemble.build_sampler(rc, model, placement.sampler)
  snapshot = sampler.prepare(params)
  samples, ks = final_sampling(study, task)
  out = {"val": {name: evaluation.evaluate(sampler, snapshot, loop_task, problems, samples=rc.eval.samples,
                                           ks=rc.eval.ks, settings=eval_settings, seed=assemble.eval_seed(rc))
                 for name, problems in loop_task.eval_sets.items()},
         "test": {name: evaluation.evaluate(sampler, snapshot, loop_task, problems, samples=samples, ks=ks,
                                            settings=eval_settings, seed=assemble.eval_seed(rc) + FINAL_SEED_OFFSET)
                  for name, problems in tests.items()}}
  out["wall_seconds"] = time.time() - start
  results.write_json(os.path.join(directory, "eval.json"), out)
  print(f"[claims] {task} warm start: {out['wall_seconds']:.0f}s, test pass@1 "
        + ", ".join(f"{name} {m['pass@1']:.3f}" for name, m in out["test"].items()), flush=True)
  return out


# ------------------------------------------------------------------------------ the study
@dataclasses.dataclass
class State:
  """What the study decided so far (the report reads it)."""
  chosen: dict = dataclasses.field(default_factory=dict)  # loss -> learning rate
  tuning: dict = dataclasses.field(default_factory=dict)  # loss -> {lr: AUC or None (not run)}
  extended: dict = dataclasses.field(default_factory=dict)  # stage -> the learning rates its edge added
  pilot: Optional[tuning.Pilot] = None
  hard_tail: Optional[tuple[bool, str]] = None
  stopped: Optional[str] = None
  warm: dict = dataclasses.field(default_factory=dict)  # task -> warm start eval.json


class Runner:
  def __init__(self, study: plan.Study, runs_dir: str, collect: bool = False, only: Optional[str] = None,
               checks_only: bool = False):
    self.study, self.runs_dir, self.collect, self.only, self.checks_only = study, runs_dir, collect, only, checks_only
    self.state = State()

  def run(self, stage: str, cell: plan.Cell) -> Optional[results.RunResult]:
    workdir = os.path.join(self.runs_dir, cell.name)
    if not results.is_done(workdir) and not self.collect and self.only in (None, cell.name):
      print(f"[claims] run ({stage}): {cell.name}", flush=True)
      final = execute(self.study, cell, workdir, warm_dir_of(self.runs_dir, cell.arm.task))
      print(f"[claims]   done in {final['wall_seconds']:.0f}s: test "
            + ", ".join(f"{n} pass@1 {m['pass@1']:.3f}" for n, m in final["test"].items()), flush=True)
    return results.load(self.runs_dir, cell)

  def warm(self, task: str) -> Optional[dict]:
    directory = warm_dir_of(self.runs_dir, task)
    if not self.collect and self.only is None:
      self.state.warm[task] = warm_start(self.study, task, directory)
    else:
      self.state.warm[task] = results.read_json(os.path.join(directory, "eval.json"))
    return self.state.warm[task]

  def tune(self, stage: str, losses: tuple[str, ...]) -> None:
    """Base grid for every loss, then one extension round if an edge won; choose by AUC."""
    grid = list(self.study.learning_rates)
    scores = {loss: self._scores(stage, loss, grid) for loss in losses}
    if all(None not in s.values() for s in scores.values()):
      winners = {loss: (grid, tuning.choose(s)) for loss, s in scores.items()}
      extra = tuning.extension(winners, dict(self.study.extension))
      self.state.extended[stage] = extra
      for loss in losses:
        scores[loss].update(self._scores(stage, loss, extra))
    for loss in losses:
      self.state.tuning[loss] = scores[loss]
      finished = {lr: v for lr, v in scores[loss].items() if v is not None}
      if finished:
        self.state.chosen[loss] = tuning.choose(finished)

  def _scores(self, stage: str, loss: str, lrs) -> dict:
    out = {}
    for cell in plan.tuning_cells(self.study, loss, lrs):
      result = self.run(stage, cell)
      out[cell.lr] = tuning.auc(result.curve()) if result is not None else None
    return out

  def main(self, stage: str, tiers: tuple[str, ...]) -> None:
    hard_tail_ok = self.state.hard_tail is None or self.state.hard_tail[0]
    for cell in plan.main_cells(self.study, self.state.chosen, tiers, hard_tail=hard_tail_ok):
      self.run(stage, cell)

  def study_all(self) -> State:
    s = self.state
    self.warm("arithmetic")
    pilot = self.run("pilot", plan.pilot_cell(self.study))
    if pilot is None:
      s.stopped = "the pilot has not run"
      return s
    s.pilot = tuning.pilot_verdict(pilot.curve(), self.study.steps)
    print(f"[claims] pilot: {s.pilot.message}", flush=True)
    if not s.pilot.ok and not self.study.smoke:  # the smoke's 5-step warm start cannot learn; it goes on
      s.stopped = "the pilot failed: " + s.pilot.message
      return s
    warm_b = self.warm("hard_tail")
    if warm_b is not None:
      s.hard_tail = tuning.hard_tail_verdict(warm_b["test"])
      print(f"[claims] {s.hard_tail[1]}", flush=True)
      if self.study.smoke:
        s.hard_tail = (True, s.hard_tail[1] + " (smoke: task B runs anyway)")
    if self.checks_only:
      s.stopped = "--checks_only: the warm starts, the pilot and task B's check, nothing more"
      return s
    self.tune("tuning", plan.PRIMARY_LOSSES)
    self.main("main", ("claim", "baseline"))
    if self.study.secondary:
      self.tune("secondary tuning", plan.SECONDARY_LOSSES)
      self.main("secondary", ("secondary",))
      self.main("beta1 probe", ("probe",))
    return s


def enable_compile_cache(directory: str) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_compilation_cache_dir", os.path.abspath(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
