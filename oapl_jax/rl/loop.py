"""OAPL, Algorithm 1: a lagged sampler fills the buffer while the trainer regresses on it.

  for each sync window (L trainer steps):
    sampler <- trainer params (device-side reshard, version += 1); buffer <- empty, that version
    background thread: [eval the fresh snapshot]; generate the window's chunks of P prompts x G samples
    trainer: L steps, step s draws B groups from the chunks the schedule makes visible to it
  checkpoint at window boundaries (the buffer is empty there by construction)

What varies is chosen by the assembler (run/assemble.online), never branched on here (rl/windows.py):
the window policy says which params a window's sampler takes and when a window ends early (fixed L,
off-by-one delayed, adaptive on drift); step hooks run before a step (the policy probe every
eval.every_steps steps, the old-policy scorer of GRPO's ratio).

With `mesh.sampler_devices` = 0 the sampler and trainer share devices; with n > 0 the sampler gets
its own and both run truly concurrently (parallel.placement_from_config).

Several processes (jax.distributed): every process runs this same loop. Each holds part of both
meshes (parallel.split_devices says why not whole hosts per side), so the refresh is a reshard on the
trainer's devices plus local device-to-device copies (parallel.transfer), and the rollouts come back
to every host as token ids (the sampler's outputs are replicated: small). The buffer's draw is the
same on every host; each host packs and feeds only its rows of the trainer batch. Only process 0
writes reports (reporting.Reporter) and the run's config; orbax saves and restores with all of them.
On the CPU backend the rollouts then run in the trainer's thread (`rollouts_inline`).
"""
import dataclasses
import logging
import time
from typing import Any, Callable, Optional

import jax
import numpy as np

from oapl_jax import checkpoint_files, checkpoints, parallel
from oapl_jax.rl import monitors, policy_eval, preemption, stepping, trainer
from oapl_jax.rl.buffer import RolloutBuffer
from oapl_jax.rl.parts import RunParts
from oapl_jax.rl.rollout_worker import RolloutWorker, Window
from oapl_jax.rl.schedule import WindowSchedule
from oapl_jax.rl.demo_mix import DemoMixer
from oapl_jax.rl.windows import StepHook, WindowPolicy
from oapl_jax.sampler import api as sampler_api


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """What the loop reads of the run's config: its budget, batch, group size, seed and cadences."""
  total_steps: int  # trainer steps of the whole run (loop.num_syncs x loop.sync_every)
  num_syncs: int  # windows planned (the console line's count; an adaptive lag may take more)
  batch_prompts: int  # B: groups per trainer step
  group_size: int  # G: samples per prompt
  seed: int
  eval_every_syncs: int  # the sampler's fresh snapshot is evaluated every this many windows
  checkpoint_every_syncs: int
  title: str  # the summary's title, e.g. "OAPL run summary"


@dataclasses.dataclass(kw_only=True)
class Online(RunParts):
  """An online run: the parts, the buffer, the train step, the window policy and the hooks; built by
  run/assemble.online, advanced by `train`."""
  settings: LoopSettings
  schedule: WindowSchedule
  windows: WindowPolicy
  hooks: list[StepHook] = dataclasses.field(default_factory=list)
  buffer: RolloutBuffer
  train_step: trainer.StepFn
  batch_sharding: jax.sharding.NamedSharding  # how a trainer batch's prompt axis lies over the trainer's devices
  batch_rows: slice  # the batch rows this process feeds (parallel.process_rows)
  demo_mixer: Optional[DemoMixer] = None  # loop.demo_fraction: demonstrations in the rollout groups


@dataclasses.dataclass(frozen=True)
class _WindowEnd:
  """How a window's steps ended (`_train_window`), for `_end_window`."""
  done: int  # steps of the window done
  ended: bool  # the window policy ended it before its length
  ended_last: bool  # its last step asked the policy to end it (a window saved inside resumes one step longer)
  stopping: bool  # a stop was agreed


@dataclasses.dataclass
class _Position:
  """Where the loop stands: the window (sync) and its first step, and a restored run's starting point."""
  sync: int
  step0: int  # the window's first trainer step
  resume_at: int  # > 0: the window was saved after that many of its steps (its snapshot saved with it)
  first_sync: int
  restored_step: int  # trainer steps done when this call began

  @classmethod
  def of(cls, run: Online) -> "_Position":
    restored, resume_at = int(jax.device_get(run.state.step)), run.meta.window_steps_done
    return cls(run.meta.syncs_done, restored - resume_at, resume_at, run.meta.syncs_done, restored)


def _evaluate(run: RunParts, step: int) -> dict:
  out = run.evaluate(run.sampler.params, step=step)
  logging.info("eval at step %d: %s", step, {k: round(v, 4) for k, v in out.items() if "pass@" in k})
  return out


def _log_worker_stats(run: Online, worker: RolloutWorker, log_from: int) -> None:
  """The sampler's metrics; those of steps before `log_from` (the restored step: a window resumed inside
  regenerates its first chunks) were logged by the attempt that saved it."""
  while not worker.stats.empty():
    step, metrics = worker.stats.get()
    if step >= log_from:
      run.reporter.scalars(step, metrics)


def rollouts_inline(sampler_layout: parallel.Layout) -> bool:
  """Whether the rollouts run in the trainer's thread (RolloutWorker inline) instead of beside it:
  with several processes on the CPU backend, where two threads running cross-process programs at
  once deadlock in JAX 0.10.2's gloo collectives (each side alone runs; both at once hang). Results
  are the same either way; only the overlap of sampling and training is lost."""
  return jax.process_count() > 1 and sampler_layout.platform == "cpu"


def train(run: Online, on_window: Optional[Callable[[dict], None]] = None, inline_rollouts: Optional[bool] = None,
          max_windows: Optional[int] = None, stop: Optional[preemption.StopFlag] = None) -> dict:
  """Runs the remaining sync windows; returns the final summary (also written to the workdir).
  on_window(progress: dict), if given, is called after every window (e.g. a notebook redraws its curve).
  inline_rollouts: rollouts in the trainer's thread (True) or their own (False); None: `rollouts_inline`.
  max_windows: stop after this many windows of this call (the run stays resumable), e.g. to test a resume.
  SIGTERM or SIGINT (rl/preemption.py) stops the run after the step in flight, with a checkpoint there;
  the summary then names the signal under `stopped_by`. One after the last step's checkpoint skips (or, on one
  process, cuts short) the final eval: `stopped_by` again, and `final_eval` says so; the same call runs it.
  stop: the flag a command installed before setup (its warm start's), if any; the loop installs its own else."""
  worker = _worker(run, inline_rollouts)
  stop = (stop or preemption.StopFlag()).across(run.placement.trainer.mesh).install()
  run.reporter.phases.start()
  worker.start()
  at = _Position.of(run)
  try:
    with stop.cutting(run.sampler):  # an eval or a chunk in flight ends at a signal (one process)
      if at.resume_at:
        _restore_snapshot(run, at.restored_step)
      while at.step0 < run.settings.total_steps:
        if max_windows is not None and at.sync - at.first_sync >= max_windows:
          logging.warning("stopping after %d sync windows (max_windows)", max_windows)
          break
        length = _begin_window(run, worker, at)  # 1. sampler <- trainer (the window policy's params); D <- {}
        end = _train_window(run, worker, stop, at, length)  # 2-3. the sampler fills D while the trainer steps
        if not _end_window(run, worker, at, length, end, on_window):  # 4. after L steps: checkpoint, next window
          break
      if stop.signal_name is not None and at.step0 < run.settings.total_steps:
        logging.warning("stopped by %s after trainer step %d; resume with the same command", stop.signal_name,
                        at.step0)
      return _finish(run, at.step0, stop, worker.cut)
  finally:  # a run is single-use: stop the worker thread and release writers, pools and files
    run.reporter.phases.stop()
    stop.uninstall()
    worker.stop()
    run.buffer.close()
    worker.join(timeout=600)
    run.release()


def _timed(run: RunParts, phase: str):
  """The trainer thread's time in `phase` (summary.md's 'Where the time went')."""
  return run.reporter.phases.timed("trainer", phase)


def _worker(run: Online, inline: Optional[bool]) -> RolloutWorker:
  return RolloutWorker(run.sampler, run.task, run.buffer, run.schedule, run.rollout_settings,
                       group_size=run.settings.group_size, seed=run.settings.seed,
                       eval_fn=lambda step: _evaluate(run, step), monitors=run.monitor.config,
                       inline=rollouts_inline(run.sampler.layout) if inline is None else inline,
                       lookahead=run.windows.lookahead, demo_mixer=run.demo_mixer, phases=run.reporter.phases,
                       save_rollouts=run.save_rollouts)


def _begin_window(run: Online, worker: RolloutWorker, at: _Position) -> int:
  """The sampler takes the params the window policy gives (unless the window resumes inside, on its saved
  snapshot), the buffer empties to its version and the worker starts the window; returns its length."""
  length = min(run.schedule.sync_every, run.settings.total_steps - at.step0)
  if at.resume_at:
    length = run.windows.resumed_length(length, at.resume_at, bool(run.meta.drift_seen))
  else:
    with _timed(run, "refresh"):
      run.sampler.refresh(run.windows.sampler_params(run.policy_params(run.state)))
    run.reporter.scalars(at.step0, {"sampler/refresh_seconds": run.sampler.last_refresh_seconds,
                                    "sampler/refresh_bytes": run.sampler.last_refresh_bytes})
  run.buffer.reset(run.sampler.snapshot_version)
  run.monitor.new_window()
  for hook in run.hooks:
    hook.new_window()
  worker.start_window(Window(run.sampler.snapshot_version, at.sync, run.meta.data_position,
                             evaluate=at.sync % run.settings.eval_every_syncs == 0 and not at.resume_at,
                             first_step=at.step0))
  _replay_draws(run, worker, at.step0, at.resume_at)
  return length


def _train_window(run: Online, worker: RolloutWorker, stop: preemption.StopFlag, at: _Position,
                  length: int) -> _WindowEnd:
  """The window's trainer steps from `at.resume_at`, each logged while the next runs; how they ended."""
  base_key, report = jax.random.PRNGKey(run.settings.seed), _StepReport(run)
  driver = stepping.StepDriver(run.train_step, lambda step: jax.random.fold_in(base_key, step), report, stop=stop,
                               checkpointer=run.checkpointer, monitor=run.monitor, timed=lambda p: _timed(run, p))
  done, cut = at.resume_at, False  # the window's steps dispatched so far; a stop cut the work a step needs
  for s in range(at.resume_at, length):
    step = at.step0 + s
    worker.produce(run.schedule.chunks_visible(s))  # inline rollouts only: the chunks this step may draw
    probing = any(hook.probes(step) for hook in run.hooks)
    if probing:  # the last step's metrics first, and the probe's time is no step's
      driver.flush()
    try:
      for hook in run.hooks:
        with _timed(run, hook.phase):
          hook.before_step(step, s, run.state)
    except sampler_api.Interrupted:  # a stop cut the probe: step s is the resume's
      logging.warning("the policy probe at step %d cut by the stop (the resume runs it again)", step)
      cut = True
      break
    if probing:
      run.reporter.scalars(step, run.reporter.phases.marks())
      report.restart_clock()
    drawn = _draw(run, worker, step, s)
    if drawn is None:  # a stop cut the sampler's eval or the chunk this step needs: step s is the resume's
      cut = True
      break
    batch, extra, reuse_mean = drawn
    # the buffer's size as the step starts (how far the sampler is ahead)
    extra.update({"buffer/groups": run.buffer.num_groups(), "buffer/reuse_mean": reuse_mean})
    run.state = driver.step(run.state, batch, step, extra)
    done = s + 1
    _log_worker_stats(run, worker, at.restored_step)
    run.reporter.tick(step + 1, at.step0 + length)
    if driver.ended or driver.stopping:  # the step before this one ended the window (the refresh now), or a stop
      break
  ended = driver.ended
  ended_last = driver.flush()
  return _WindowEnd(done, ended, ended_last, cut or driver.stopping)


class _StepReport:
  """The online step's report (stepping.Report): its metrics and tokens per second since the last fetch, the
  wait for samples apart; whether the window policy ends the window after the next step."""

  def __init__(self, run: Online):
    self.run, self.last_fetch = run, time.perf_counter()

  def __call__(self, step: int, metrics: dict, extra: dict) -> bool:
    seconds = max(time.perf_counter() - self.last_fetch - extra["train/wait_seconds"], 1e-9)
    scalars = {f"train/{k}": v for k, v in metrics.items()}
    scalars.update(extra, **{"train/tokens_per_second": float(metrics["tokens"]) / seconds})
    self.run.reporter.scalars(step, scalars)
    self.restart_clock()
    return self.run.windows.ends_after(metrics)

  def restart_clock(self) -> None:
    """Tokens per second count from now: after a fetch, or after a probe (whose time is no step's)."""
    self.last_fetch = time.perf_counter()


def _draw(run: Online, worker: RolloutWorker, step: int, s: int) -> Optional[tuple[dict, dict, float]]:
  """Step s of the window's batch (this host's rows) from the chunks it may see, its lag and wait, and how often
  its groups had been drawn; None where a stop cut the work it waited for."""
  wait_start = time.perf_counter()
  with _timed(run, "waiting for samples"):
    batch = run.buffer.sample(run.settings.batch_prompts, run.schedule.chunks_visible(s),
                              np.random.default_rng([run.settings.seed, step]), rows=run.batch_rows)
  if batch is None:
    worker.wait_window()  # raises the worker's error, if that is why the buffer closed
    if worker.cut:
      return None
    raise RuntimeError("the rollout buffer was closed while the trainer waited for data")
  waited = time.perf_counter() - wait_start
  reuse = batch.pop("reuse")
  versions = batch.pop("version")
  if (versions != run.sampler.snapshot_version).any():
    raise AssertionError(f"buffer served versions {set(versions)} at snapshot {run.sampler.snapshot_version}")
  with _timed(run, "packing: the batch onto the trainer's devices"):
    batch = parallel.from_process_rows(batch, run.batch_sharding, run.settings.batch_prompts)  # this host's rows
  return batch, {"train/policy_lag": s, "train/wait_seconds": waited}, reuse.mean()


def _end_window(run: Online, worker: RolloutWorker, at: _Position, length: int, end: _WindowEnd,
                on_window: Optional[Callable[[dict], None]]) -> bool:
  """Closes the window after `end.done` of its steps: a checkpoint inside it when stopped there, else the next
  window's meta, its report and the checkpoint its cadence asks for; whether the loop goes on."""
  done, stopping = end.done, end.stopping
  s, at.resume_at = done - 1, 0
  with _timed(run, "waiting for samples"):  # the window's last chunks
    worker.wait_window(cut=done < run.schedule.sync_every)
  _log_worker_stats(run, worker, at.restored_step)
  end_step, seed = at.step0 + done, run.settings.seed
  if done == 0:  # stopped before the window's first step (its eval or first chunk cut): the resume starts it again
    if end_step and run.checkpointer.latest_step() != end_step:
      _save(run, end_step, run.meta)  # the window's start, as the last window's end left it
    return False
  if done < length and not end.ended:  # stopped inside the window: save it as it stands
    run.meta = checkpoint_files.Meta(at.sync, run.sampler.snapshot_version, run.meta.data_position, seed,
                                     window_steps_done=done, drift_seen=int(end.ended_last))
    if run.checkpointer.latest_step() != end_step:  # else resumed here and stopped again before a new step
      _save(run, end_step, run.meta, sampler=run.sampler.params)
    at.step0 = end_step
    return False
  run.meta = checkpoint_files.Meta(at.sync + 1, run.sampler.snapshot_version, run.meta.data_position
                              + run.schedule.chunks_visible(s) * run.schedule.prompts_per_chunk, seed)
  window_metrics = run.windows.window_metrics(done)
  if window_metrics:
    run.reporter.scalars(at.step0, window_metrics)
  _print_window(run, at.sync, end_step)
  if on_window is not None:
    on_window({"syncs": at.sync + 1, "num_syncs": run.settings.num_syncs, "trainer_steps": end_step,
               "metrics_path": run.reporter.history_path})
  if stopping or (at.sync + 1) % run.settings.checkpoint_every_syncs == 0 or end_step == run.settings.total_steps:
    _save(run, end_step, run.meta)
  at.step0, at.sync = end_step, at.sync + 1
  return not stopping


def _save(run: Online, step: int, meta: checkpoint_files.Meta, sampler: Optional[trainer.Params] = None) -> None:
  """A checkpoint at `step`, unless its last update was skipped as non-finite (then the last good one stays)."""
  if run.monitor.diverging:
    logging.warning("not checkpointing step %d: its last update was skipped as non-finite", step)
    return
  with _timed(run, "checkpoint"):
    run.checkpointer.save(step, trainer.checkpointed(run.state), meta, sampler=sampler)
  if meta.window_steps_done:
    logging.info("checkpoint %d saved inside window %d (%d of its steps done)", step, meta.syncs_done + 1,
                 meta.window_steps_done)


def _replay_draws(run: Online, worker: RolloutWorker, step0: int, steps: int) -> None:
  """A window resumed inside: its first `steps` draws again (numpy only, batches dropped), so the buffer's
  least-used-first order goes on as it would have."""
  for s in range(steps):
    visible = run.schedule.chunks_visible(s)
    worker.produce(visible)
    if run.buffer.sample(run.settings.batch_prompts, visible,
                         np.random.default_rng([run.settings.seed, step0 + s])) is None:
      worker.wait_window()
      if worker.cut:  # a stop: the window's first draw finds the buffer closed too
        return
      raise RuntimeError("the rollout buffer was closed while its draws were replayed")


def _restore_snapshot(run: Online, step: int) -> None:
  """A save inside a window: the sampler gets that window's snapshot back, at its version (the restored params
  are only its template: shapes and shardings)."""
  version = run.meta.snapshot_version
  template = run.sampler.prepare(run.policy_params(run.state))
  run.sampler.refresh(run.checkpointer.restore_sampler(step, checkpoints.abstract_like(template)), version=version)
  logging.info("resuming inside window %d at its step %d, from the snapshot (version %d) saved with it",
               run.meta.syncs_done + 1, run.meta.window_steps_done, version)


def _print_window(run: Online, sync: int, end_step: int) -> None:
  """One concise console line per window (full metrics: TensorBoard, metrics.jsonl); printed, so a
  notebook or a script calling loop.train sees it too."""
  latest = run.reporter.latest
  values = {"loss": latest.get("train/loss"), "reward": latest.get("rollout/reward_mean")}
  for prefix, label in (("eval/", "{} pass@1"), (policy_eval.PREFIX, "policy {} pass@1")):  # snapshot, policy
    values.update({label.format(k.split("/")[1]): v for k, v in latest.items() if k.startswith(prefix) and
                   k.endswith("/pass@1")})
  line = run.reporter.window_line(end_step, sync + 1, run.windows.planned_windows(run.settings.num_syncs),
                                  {k: v for k, v in values.items() if v is not None})
  if run.reporter.is_main:
    print(line, flush=True)


def _reward_failures(history: list[dict]) -> int:
  """Training rewards that raised, timed out or were not finite (scored 0), over the logged rollouts: from
  metrics.jsonl, so a resumed run counts the earlier attempt's kept steps and never a re-run one twice."""
  return int(sum(h.get("rollout/reward_failures", 0.0) for h in history))


def _finish(run: Online, done_steps: int, stop: preemption.StopFlag, cut: Optional[str] = None) -> dict:
  """Final eval of the trained policy (none once a stop was asked for: `final_eval` says so), then the PNG curve
  and summary; `stopped_by` names the signal that left work undone, `cut` the work it interrupted."""
  finished = done_steps >= run.settings.total_steps
  if finished:
    with _timed(run, "refresh"):
      run.sampler.refresh(run.policy_params(run.state))
  # the snapshot whose rollouts the last steps trained on, as the checkpoint (and an export's info) records it: the
  # refresh above makes one more, for the final eval only
  logged = run.reporter.history()  # metrics.jsonl, read once
  summary: dict[str, Any] = {"finished": finished, "trainer_steps": done_steps, "syncs": run.meta.syncs_done,
                             "snapshot_version": run.meta.snapshot_version, **run.monitor.summary(),
                             "reward_failures": _reward_failures(logged),
                             **monitors.run_notes(logged, done_steps, run.monitor.config)}
  evaluated = False
  if finished and not stop.vote()():  # the same answer on every process
    try:
      with stop.interrupting(), _timed(run, "eval"):
        records = [hook.final(done_steps, run.state) for hook in run.hooks]  # e.g. the policy probe's last point
        final = _evaluate(run, done_steps)
    except (preemption.Stopped, sampler_api.Interrupted):
      pass
    else:
      evaluated = True
      for record in records:
        record()
      run.reporter.scalars(done_steps, {**final, **run.reporter.phases.marks()})
      history = run.reporter.history()
      first = next((h for h in history if any(k.startswith("eval/") for k in h)), {})
      for key in sorted(k for k in final if "pass@" in k or "reward_mean" in k):
        summary[f"{key} (start)"] = first.get(key, float("nan"))
        summary[f"{key} (end)"] = final[key]
  if finished and not evaluated:
    summary["final_eval"] = f"skipped: stopped by {stop.signal_name}; the same command runs it"
    logging.warning("final eval %s", summary["final_eval"])
  if stop.signal_name and not (finished and evaluated):
    summary["stopped_by"] = stop.signal_name
  if cut:
    summary["cut"] = cut
  paths = run.reporter.finish(summary, title=run.settings.title)
  summary["paths"] = {**paths, "checkpoints": run.checkpointer.directory}
  return summary
