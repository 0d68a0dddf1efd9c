"""The paper's five claims in miniature, on any task: the runner (plan: experiments/plan.py; report:
claims_report.py).

  python -m experiments.study --task arithmetic --out reports/claims_v3              # configs/claims.py:arithmetic
  python -m experiments.study --config configs/own_task.py --out reports/own --smoke  # any training config
  ... --collect          only rebuild the report from the run directories that exist
  ... --cell NAME        run (or resume) that one cell
  ... --stage pilot      stop after the pilot (tuning: after the tuning grid)

Order (a study cut short still reports every claim at a lower n):
  0. the config and its data checked (experiments/task_config.preflight): a bad file or reward fails here
  1. the warm start (apps/sweep_warmstart, once per config + warm-start fields, reused; every run loads it)
  2. the pilot: every primary arm at its loss's middle grid point on the tuning seed. The main OAPL arm must
     learn (tuning.PILOT_GAIN over the warm start at mid-run) or the study stops; an arm at or above
     tuning.HEADROOM at mid-run makes the primary metric the area under the validation curve
  3. tuning of oapl, grpo (off-by-one) and grpo_onpolicy: lr x the loss's own knob (plan.KNOBS; OAPL's beta2 set
     by strength from the pilot with --beta2_by_strength), 9 points each on the tuning seeds, chosen by the mean
     area under the validation pass@1 curve; a winner at an edge extends its axis (tuning.extension)
  4. the claims' arms and the on-policy baseline, round-robin by seed (plan.main_cells)
  5. opmd and asymre (tuned alike), then the beta1 probe at L = 1 (lowest priority)
Resumable: a run with final_eval.json is skipped; an unfinished one resumes from its last checkpoint.
"""
from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from typing import Optional

from experiments import lag_stats, plan, results, task_config, tuning, tuning_record

FINAL_SEED_OFFSET = 104_729  # the test eval's seed: the run's eval seed + this (the same for paired cells)
FINAL_SAMPLES = (32, (1, 4, 8, 16, 32))
SMOKE_SAMPLES = (8, (1, 2, 4, 8))


def final_sampling(study: plan.Study) -> tuple[int, tuple[int, ...]]:
  """(samples per test prompt, ks) of the end-of-run test eval."""
  return SMOKE_SAMPLES if study.smoke else study.final_samples or FINAL_SAMPLES


def run_config(study: plan.Study, cell: plan.Cell, warm_dir: str):
  from oapl_jax.run import files  # pylint: disable=import-outside-toplevel
  return files.load(study.config, plan.overrides(study, cell, warm_dir))


def warm_dir_of(runs_dir: str, study: plan.Study) -> str:
  """Where the study's warm start lives: keyed by what it is made from (plan.warm_key)."""
  return os.path.join(runs_dir, study.name, f"warm_{plan.warm_key(study)}", "warmstart")


def execute(study: plan.Study, cell: plan.Cell, workdir: str, warm_dir: str) -> dict:
  """One run in this process (resuming if its directory holds a checkpoint), then pass@k of the final policy
  on the test sets; writes final_eval.json."""
  from oapl_jax import evaluation  # pylint: disable=import-outside-toplevel
  from oapl_jax.rl import loop  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import assemble, schema  # pylint: disable=import-outside-toplevel
  start = time.time()
  rc = schema.from_config(run_config(study, cell, warm_dir))
  run = assemble.setup(rc, workdir)
  summary = loop.train(run)
  if not summary["finished"]:
    raise RuntimeError(f"{workdir}: the run stopped before its last window ({summary})")
  task, tests = task_config.task_and_tests(rc.task)  # its own reward: the run released its pools when it ended
  samples, ks = final_sampling(study)
  params = run.sampler.prepare(run.state.params)
  try:
    final = {"cell": cell.name, "arm": cell.arm.name, "task": study.name, "loss": cell.arm.loss, "lr": cell.lr,
             "setting": list(cell.setting), "seed": cell.seed, "trainer_steps": summary["trainer_steps"],
             "generations": rc.loop.num_syncs * rc.loop.schedule().prompts_per_window * rc.loop.group_size,
             "command": plan.command(study, cell, warm_dir, workdir), "train_seconds": time.time() - start,
             "test": {name: evaluation.evaluate(run.sampler, params, task, problems, samples=samples, ks=ks,
                                                settings=run.eval_settings,
                                                seed=assemble.eval_seed(rc) + FINAL_SEED_OFFSET)
                      for name, problems in tests.items()}}
  finally:
    task.close()
  failed = {name: m["reward_failures"] for name, m in final["test"].items() if m["reward_failures"] > 0}
  if failed:  # a reward that failed is not a zero to report
    raise RuntimeError(f"{workdir}: the final test eval's reward failed on {failed} items; nothing recorded")
  final["wall_seconds"] = time.time() - start
  results.write_json(os.path.join(workdir, results.FINAL_EVAL), final)
  return final


def warm_start(study: plan.Study, directory: str) -> dict:
  """The study's warm start (an HF directory every run loads), made once by apps/sweep_warmstart from the
  study's config (a subprocess: the same code path as a sweep's), then its pass@k on the validation and test
  sets in <directory>/eval.json."""
  done = results.read_json(os.path.join(directory, "eval.json"))
  if done is not None:
    return done
  from oapl_jax import evaluation  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import shared_warmstart  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import assemble, files, schema  # pylint: disable=import-outside-toplevel
  start = time.time()
  extra = [f"--config.{k}={v}" for k, v in study.shared]
  record = shared_warmstart.ensure(study.config, os.path.dirname(directory), extra)
  cfg = files.load(study.config, {**dict(study.shared), "model.checkpoint": os.path.abspath(directory),
                                  "warmstart.steps": 0})
  rc = schema.from_config(cfg)
  loop_task, tests = task_config.task_and_tests(rc.task)
  placement = assemble.placement(rc)
  model, params = assemble.build_model(rc, placement.trainer)
  _, eval_settings = assemble.sampling(rc, loop_task)
  sampler = assemble.build_sampler(rc, model, placement.sampler)
  snapshot = sampler.prepare(params)
  samples, ks = final_sampling(study)
  out = {"val": {name: evaluation.evaluate(sampler, snapshot, loop_task, problems[:rc.eval.num_prompts],
                                           samples=rc.eval.samples, ks=rc.eval.ks, settings=eval_settings,
                                           seed=assemble.eval_seed(rc))
                 for name, problems in loop_task.eval_sets.items()},
         "test": {name: evaluation.evaluate(sampler, snapshot, loop_task, problems, samples=samples, ks=ks,
                                            settings=eval_settings, seed=assemble.eval_seed(rc) + FINAL_SEED_OFFSET)
                  for name, problems in tests.items()},
         "build_seconds": record["wall_seconds"], "command": record["command"]}
  out["wall_seconds"] = time.time() - start
  results.write_json(os.path.join(directory, "eval.json"), out)
  loop_task.close()
  print(f"[claims] {study.name} warm start: {out['wall_seconds']:.0f}s, test pass@1 "
        + ", ".join(f"{'' if name == 'test' else name + ' '}{m['pass@1']:.3f}" for name, m in out["test"].items()),
        flush=True)
  return out


# ------------------------------------------------------------------------------ the study
STAGES = ("pilot", "tuning", "main", "all")
POLL_SECONDS = 30.0  # how often a shard looks whether the others finished a stage


def parse_shard(text: Optional[str]) -> Optional[tuple[int, int]]:
  """--shard I/N as (i, n), None for None; ValueError naming the flag otherwise."""
  if not text:
    return None
  try:
    shard = tuple(int(x) for x in text.split("/"))
  except ValueError:
    shard = ()
  if len(shard) != 2 or not 0 <= shard[0] < shard[1]:
    raise ValueError(f"--shard {text}: expected I/N with 0 <= I < N, e.g. 0/2")
  return shard


@dataclasses.dataclass
class State:
  """What the study decided so far (the report reads it)."""
  chosen: dict = dataclasses.field(default_factory=dict)  # loss -> (lr, knob value)
  tuning: dict = dataclasses.field(default_factory=dict)  # loss -> {(lr, knob): AUC or None (not run)}
  pilot: Optional[tuning.Pilot] = None  # the main OAPL arm learns
  headroom: dict = dataclasses.field(default_factory=dict)  # primary arm -> tuning.Headroom
  pilot_missing: list = dataclasses.field(default_factory=list)  # primary arms whose pilot run has not finished
  primary_metric: str = "final"  # 'final' (test pass@1 at the end) or 'auc' (validation AUC: an arm at the ceiling)
  stopped: Optional[str] = None
  warm: Optional[dict] = None  # the warm start's eval.json
  checked: Optional[list] = None  # the preflight's warnings (None: not checked in this invocation)
  strength: Optional[tuning.Strength] = None  # OAPL's beta2 grid by strength (the study's beta2_by_strength)
  extended: dict = dataclasses.field(default_factory=dict)  # loss -> the points added past an edge winner
  record: Optional[tuning_record.Record] = None  # a tuning taken from its record instead of runs (study --tuned)

  @property
  def recorded(self) -> dict:
    """loss -> tuning_record.Recorded, for the losses whose tuning came from the record."""
    return self.record.losses if self.record is not None else {}


class Runner:
  """Runs the study's cells stage by stage. With shard=(i, n), n processes share a stage's cells (each takes the
  next cell none has claimed: a flock on `<run dir>.claim`) and wait for each other before the next stage
  (n processes on n cores; shard 0 makes the warm start). The strength rule may replace `study` after the
  pilot (its OAPL grid): report from runner.study."""

  def __init__(self, study: plan.Study, runs_dir: str, collect: bool = False, only: Optional[str] = None,
               stage: str = "all", shard: Optional[tuple[int, int]] = None, poll_seconds: Optional[float] = None,
               record: Optional[tuning_record.Record] = None):
    if shard is not None and not 0 <= shard[0] < shard[1]:
      raise ValueError(f"shard {shard[0]}/{shard[1]}: expected i/n with 0 <= i < n")
    self.study, self.runs_dir, self.collect, self.only, self.stage = study, runs_dir, collect, only, stage
    self.shard, self.poll_seconds = shard, POLL_SECONDS if poll_seconds is None else poll_seconds
    self.state = State(record=record)

  def run_all(self, stage: str, cells: list[plan.Cell]) -> list[Optional[results.RunResult]]:
    """Run (or load) every cell; with shards, each process takes the next cell no other has claimed (so none
    idles while cells remain), then waits for the rest."""
    sharded = self.shard is not None and self.shard[1] > 1 and not self.collect and self.only is None
    workdirs = [os.path.join(self.runs_dir, cell.name) for cell in cells]
    ran_seconds = []  # cells this process ran, for the ETA
    for cell, workdir in zip(cells, workdirs):
      claim = None
      if sharded:
        claim = None if results.is_done(workdir) else _claim(workdir)
        if claim is None:
          continue
      was_done, start = results.is_done(workdir), time.time()
      try:
        self.run(stage, cell)
      finally:
        if claim is not None:
          os.close(claim)  # the lock goes with it
      if not was_done and results.is_done(workdir):
        ran_seconds.append(time.time() - start)
        done = sum(map(results.is_done, workdirs))
        per_cell = sum(ran_seconds) / len(ran_seconds)
        minutes = (len(cells) - done) / (self.shard[1] if sharded else 1) * per_cell / 60
        print(f"[claims] {stage}: {done}/{len(cells)} cells done; ~{minutes:.0f} min left at this pace", flush=True)
    if sharded:
      self._wait([os.path.join(self.runs_dir, c.name) for c in cells])
    return [results.load(self.runs_dir, cell) for cell in cells]

  def _wait(self, workdirs: list[str], done=results.is_done) -> None:
    said = 0.0
    while missing := [w for w in workdirs if not done(w)]:
      if time.time() - said > 600:
        print(f"[claims] shard {self.shard[0]}/{self.shard[1]}: waiting for {len(missing)} cell(s) the other shards "
              f"run, e.g. {os.path.relpath(missing[0], self.runs_dir)}", flush=True)
        said = time.time()
      time.sleep(self.poll_seconds)

  def run(self, stage: str, cell: plan.Cell) -> Optional[results.RunResult]:
    workdir = os.path.join(self.runs_dir, cell.name)
    if not results.is_done(workdir) and not self.collect and self.only in (None, cell.name):
      print(f"[claims] run ({stage}): {cell.name}", flush=True)
      final = execute(self.study, cell, workdir, warm_dir_of(self.runs_dir, self.study))
      print(f"[claims]   done in {final['wall_seconds']:.0f}s: test pass@1 "
            + ", ".join(f"{'' if n == 'test' else n + ' '}{m['pass@1']:.3f}" for n, m in final["test"].items()),
            flush=True)
    return results.load(self.runs_dir, cell)

  def warm(self) -> Optional[dict]:
    directory = warm_dir_of(self.runs_dir, self.study)
    if not self.collect and self.only is None and (self.shard or (0, 1))[0] > 0:
      self._wait([directory], lambda d: os.path.exists(os.path.join(d, "eval.json")))  # shard 0 makes it
    if not self.collect and self.only is None:
      self.state.warm = warm_start(self.study, directory)
    else:
      self.state.warm = results.read_json(os.path.join(directory, "eval.json"))
    return self.state.warm

  def scores(self, stage: str, loss: str, settings: list[plan.Setting]) -> dict:
    """setting -> its validation AUC, the mean over the tuning seeds (None until every seed's run finished)."""
    cells = plan.tuning_cells(self.study, loss, settings)
    return tuning.mean_auc_by_setting(zip(cells, self.run_all(stage, cells)))

  def tune(self, stage: str, losses: tuple[str, ...]) -> None:
    """Every point of each loss's grid on the tuning seeds; the largest mean AUC wins (tuning.choose); a winner at
    an edge of an axis adds the next point on it (tuning.extension), up to tuning.MAX_EXTENSIONS times."""
    for loss in losses:
      if loss in self.state.recorded:  # tuned before (tuning_record): its runs are not run again
        r = self.state.recorded[loss]
        self.state.tuning[loss], self.state.chosen[loss] = dict(r.scores), r.chosen
        if r.extended:
          self.state.extended[loss] = list(r.extended)
        print(f"[claims] {loss}: tuning taken from {self.state.record.path}: {len(r.scores)} points, chosen "
              f"{r.chosen}", flush=True)
        if off_grid := [p for p in self.study.grid(loss) if p not in r.scores]:
          print(f"[claims] {loss}: warning: this study's grid has points the record lacks: {off_grid}", flush=True)
        continue
      grid = self.study.grid(loss)
      scores = self.scores(stage, loss, grid)
      for _ in range(tuning.MAX_EXTENSIONS if not self.study.smoke else 0):
        finished = {s: v for s, v in scores.items() if v is not None}
        if len(finished) < len(scores):
          break
        added = tuning.extension(finished, loss == "oapl" and self.study.beta2_by_strength)
        if not added:
          break
        print(f"[claims] {loss}: the winner {tuning.choose(finished)} is at an edge of its grid; adding "
              f"{', '.join(map(str, added))}", flush=True)
        self.state.extended.setdefault(loss, []).extend(added)
        grid = grid + added
        scores.update(self.scores("grid extension", loss, added))
      self.state.tuning[loss] = scores
      finished = {s: v for s, v in scores.items() if v is not None}
      if finished:
        self.state.chosen[loss] = tuning.choose(finished)

  def pilot(self) -> bool:
    """Every primary arm at its middle grid point; False when the study must stop."""
    s, study = self.state, self.study
    curves = {}
    cells = plan.pilot_cells(study)
    for cell, r in zip(cells, self.run_all("pilot", cells)):
      if r is not None:
        curves[cell.arm.name] = r.curve()
    main = study.tuning_arm("oapl").name
    s.pilot_missing = [a.name for a in study.primary_arms() if a.name not in curves]
    if s.pilot_missing:
      print(f"[claims] pilot not run yet for: {', '.join(s.pilot_missing)} (headroom unknown there)", flush=True)
    if main not in curves:
      s.stopped = "the pilot has not run"
      return False
    s.pilot = tuning.pilot_verdict(curves[main], study.steps, ceiling=None)  # a ceiling: the AUC rule
    s.headroom = {arm: tuning.headroom(curve, study.steps) for arm, curve in curves.items()}
    s.primary_metric = "final" if all(h.ok for h in s.headroom.values()) else "auc"
    print(f"[claims] pilot: {s.pilot.message}", flush=True)
    for arm, h in s.headroom.items():
      print(f"[claims] headroom {arm}: {h.message}", flush=True)
    print(f"[claims] primary metric: {tuning.PRIMARY_METRICS[s.primary_metric]}", flush=True)
    if not s.pilot.ok and not study.smoke:  # the smoke's 5-step warm start cannot learn; it goes on
      s.stopped = "the pilot failed: " + s.pilot.message
      return False
    if study.beta2_by_strength:
      cell = next(c for c in cells if c.arm.name == main)
      share = lag_stats.beta2_share(results.load(self.runs_dir, cell), cell.setting[1])
      s.strength = tuning.beta2_by_strength(share, cell.setting[1])
      self.study = dataclasses.replace(study, knob_values=(("oapl", s.strength.values),))
      print(f"[claims] {s.strength.message}", flush=True)
    return True

  def study_all(self) -> State:
    s = self.state
    if not self.collect:
      s.checked = task_config.preflight(self.study.config, dict(self.study.shared))
      print(f"[claims] config and data OK: {self.study.config} ({len(s.checked)} warning(s))", flush=True)
    self.warm()
    if not self.pilot():
      return s
    if self.stage == "pilot":
      s.stopped = "--stage pilot: the warm start and the pilot, nothing more"
      return s
    self.tune("tuning", self.study.primary_losses())
    if self.stage == "tuning":
      s.stopped = "--stage tuning: the warm start, the pilot and the tuning grid, nothing more"
      return s
    self.main("main", ("claim", "baseline"))
    if self.study.secondary and not self.study.claim1_only and self.stage == "all":
      self.tune("secondary tuning", plan.SECONDARY_LOSSES)
      self.main("secondary", ("secondary",))
      self.main("beta1 probe", ("probe",))
    return s

  def main(self, stage: str, tiers: tuple[str, ...]) -> None:
    self.run_all(stage, plan.main_cells(self.study, self.state.chosen, tiers))


def _claim(workdir: str) -> Optional[int]:
  """The cell's claim for this runner: an open file `<run dir>.claim` under an exclusive flock, which the kernel
  drops when its process dies (a killed shard's cell is free again; the run resumes from its checkpoint); None
  when another runner holds it. The file stays, so every runner locks the same one."""
  path = workdir.rstrip(os.sep) + ".claim"
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    return None
  return fd


def enable_compile_cache(directory: str) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_compilation_cache_dir", os.path.abspath(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
