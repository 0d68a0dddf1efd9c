"""OAPL, Algorithm 1: a lagged sampler fills the buffer while the trainer regresses on it.

  for each sync window (L trainer steps):
    sampler <- trainer params (device-side reshard, version += 1); buffer <- empty, that version
    background thread: [eval the fresh snapshot]; generate the window's chunks of P prompts x G samples
    trainer: L steps, step s draws B groups from the chunks the schedule makes visible to it
  checkpoint at window boundaries (the buffer is empty there by construction)
  every eval.every_steps steps, whatever L: the trainer's current policy on the eval sets (rl/policy_eval.py)

loop.sampler_delay_windows = 1 samples each window from the params of the previous window's start
(off-by-one asynchronous RL: the paper's GRPO baseline, with 2 steps a window so its clip acts).

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
import contextlib
import dataclasses
import logging
import time
from typing import Any, Optional

import jax
import numpy as np

from oapl_jax import checkpoints, parallel, reporting
from oapl_jax.models.api import CausalLM
from oapl_jax.rl.buffer import RolloutBuffer
from oapl_jax.rl import policy_eval, preemption, trainer
from oapl_jax.rl.monitors import HealthMonitor
from oapl_jax.rl.rollout_worker import RolloutWorker, Window
from oapl_jax.rl.schedule import WindowSchedule
from oapl_jax.sampler import core
from oapl_jax.sampler.settings import SamplingSettings
from oapl_jax.tasks.base import Task


@dataclasses.dataclass
class Run:
  """Everything a run holds; built by `setup`, advanced by `train`."""
  cfg: Any  # the run's typed config (run/schema.RunConfig)
  placement: parallel.Placement
  task: Task
  schedule: WindowSchedule
  rollout_settings: SamplingSettings
  eval_settings: SamplingSettings
  model: CausalLM
  state: Any
  train_step: Any
  sampler: core.Sampler
  buffer: RolloutBuffer
  checkpointer: checkpoints.Checkpointer
  reporter: reporting.Reporter
  meta: checkpoints.Meta
  monitor: HealthMonitor
  batch_sharding: Any  # how a trainer batch's prompt axis lies over the trainer's devices
  batch_rows: slice  # the batch rows this process feeds (parallel.process_rows)
  evaluate: Any  # params -> {'eval/<set>/<metric>': value} over the task's eval sets
  score_old_policy: Any = None  # (params, chunk) -> per-token log-probs, for losses that read pi_old
  policy_eval: Any = None  # rl/policy_eval.PolicyEval: the current policy every eval.every_steps steps
  policy_params: Any = lambda state: state.params  # state -> the model's full params (LoRA: merged)
  demo_mixer: Any = None  # rl/demo_mix.DemoMixer when loop.demo_fraction > 0
  lock: Any = None  # run_dir.RunLock on the workdir (process 0), released when the run ends

  def release(self) -> None:
    """Ends the run's hold on its files: the checkpointer (waits for the last save), writers, the task, the lock."""
    with contextlib.ExitStack() as closing:  # every one runs, last first, whichever raises
      closing.callback(self.lock.release if self.lock is not None else lambda: None)
      closing.callback(self.task.close)
      closing.callback(self.reporter.close)
      closing.callback(self.checkpointer.close)


def _score_new_chunks(run: Run, params, scored: int, visible: int) -> int:
  """Score chunks [scored, visible) with `params` (the policy as this round starts); returns visible."""
  for index in range(scored, visible):
    chunk = run.buffer.chunk(index)
    if chunk is None:
      return scored  # closed: the trainer's sample will surface why
    inputs = {k: chunk[k] for k in ("tokens", "targets", "positions", "response_mask")}
    run.buffer.annotate(index, "old_policy_token_logp", np.asarray(run.score_old_policy(params, inputs)))
  return visible


def _evaluate(run: Run, step: int) -> dict:
  out = run.evaluate(run.sampler.params)
  logging.info("eval at step %d: %s", step, {k: round(v, 4) for k, v in out.items() if "pass@" in k})
  return out


def evaluate_policy(run: Run, step: int, params) -> None:
  """The trainer's current policy on the eval sets (rl/policy_eval.py), logged at `step`."""
  metrics = run.policy_eval(params)
  policy_eval.log(step, metrics)
  run.reporter.scalars(step, metrics)


def _log_worker_stats(run: Run, worker: RolloutWorker, log_from: int) -> None:
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


def train(run: Run, on_window=None, inline_rollouts: Optional[bool] = None, max_windows: Optional[int] = None) -> dict:
  """Runs the remaining sync windows; returns the final summary (also written to the workdir).
  on_window(progress: dict), if given, is called after every window (e.g. a notebook redraws its curve).
  inline_rollouts: rollouts in the trainer's thread (True) or their own (False); None: `rollouts_inline`.
  max_windows: stop after this many windows of this call (the run stays resumable), e.g. to test a resume.
  SIGTERM or SIGINT (rl/preemption.py) stops the run after the step in flight, with a checkpoint there;
  the summary then names the signal under `stopped_by`. One after the last step's checkpoint skips (or, on one
  process, cuts short) the final eval: `stopped_by` again, and `final_eval` says so; the same call runs it."""
  cfg, loop, schedule = run.cfg, run.cfg.loop, run.schedule
  worker = RolloutWorker(run.sampler, run.task, run.buffer, schedule, run.rollout_settings,
                         group_size=loop.group_size, seed=cfg.seed, eval_fn=lambda step: _evaluate(run, step),
                         monitors=run.monitor.config,
                         inline=rollouts_inline(run.sampler.layout) if inline_rollouts is None else inline_rollouts,
                         lookahead=1 if loop.refresh_drift else None, demo_mixer=run.demo_mixer)
  stop = preemption.StopFlag(run.placement.trainer.mesh).install()
  worker.start()
  meta, state = run.meta, run.state
  first_sync, delayed = meta.syncs_done, None
  restored_step = int(jax.device_get(state.step))  # trainer steps done: windows may end early (loop.refresh_drift)
  resume_at = meta.window_steps_done  # > 0: saved inside its window, whose snapshot the checkpoint holds
  step0 = restored_step - resume_at
  base_key = jax.random.PRNGKey(cfg.seed)
  try:
    if resume_at:
      _restore_snapshot(run, restored_step)
    sync = first_sync
    while step0 < loop.total_steps:
      if max_windows is not None and sync - first_sync >= max_windows:
        logging.warning("stopping after %d sync windows (max_windows)", max_windows)
        break
      length = min(schedule.sync_every, loop.total_steps - step0)
      if resume_at and meta.drift_seen:  # the window's last step was due one after the saved ones
        length = resume_at + 1
      if not resume_at:
        params = run.policy_params(state)
        run.sampler.refresh(params if delayed is None else delayed)
        if loop.sampler_delay_windows:  # the next window samples from these (a copy: the step donates state)
          delayed = parallel.reshard(params, jax.tree.map(lambda x: x.sharding, params))
        del params
        run.reporter.scalars(step0, {"sampler/refresh_seconds": run.sampler.last_refresh_seconds,
                                     "sampler/refresh_bytes": run.sampler.last_refresh_bytes})
      run.buffer.reset(run.sampler.snapshot_version)
      run.monitor.new_window()
      worker.start_window(Window(run.sampler.snapshot_version, sync, meta.data_position,
                                 evaluate=sync % loop.eval_every_syncs == 0 and not resume_at, first_step=step0))
      _replay_draws(run, worker, step0, resume_at)
      pending, last_fetch, scored, drifted, stopping = None, time.perf_counter(), 0, False, False
      for s in range(resume_at, length):
        step = step0 + s
        if run.policy_eval is not None and run.policy_eval.due(step):
          if pending is not None:  # its metrics first, and the probe's time is no step's
            drifted, stopping = _or(_finish_step(run, *pending, last_fetch), drifted, stopping)
            pending = None
          evaluate_policy(run, step, run.policy_params(state))
          last_fetch = time.perf_counter()
        worker.produce(schedule.chunks_visible(s))  # inline rollouts only: the chunks this step may draw
        if run.score_old_policy is not None:
          scored = _score_new_chunks(run, run.policy_params(state), scored, schedule.chunks_visible(s))
        wait_start = time.perf_counter()
        batch = run.buffer.sample(loop.batch_prompts, schedule.chunks_visible(s), np.random.default_rng([cfg.seed, step]),
                                  rows=run.batch_rows)
        if batch is None:
          worker.wait_window()  # raises the worker's error, if that is why the buffer closed
          raise RuntimeError("the rollout buffer was closed while the trainer waited for data")
        waited = time.perf_counter() - wait_start
        reuse = batch.pop("reuse")
        versions = batch.pop("version")
        if (versions != run.sampler.snapshot_version).any():
          raise AssertionError(f"buffer served versions {set(versions)} at snapshot {run.sampler.snapshot_version}")
        batch = parallel.from_process_rows(batch, run.batch_sharding, loop.batch_prompts)  # this host's rows only
        state, metrics = run.train_step(state, batch, jax.random.fold_in(base_key, step))
        if pending is not None:
          drifted, stopping = _or(_finish_step(run, *pending, last_fetch), drifted, stopping)
          last_fetch = time.perf_counter()
        pending = (step, metrics, {"train/policy_lag": s, "train/wait_seconds": waited,
                                   "buffer/groups": run.buffer.num_groups(), "buffer/reuse_mean": reuse.mean()},
                   stop.vote())
        _log_worker_stats(run, worker, restored_step)
        run.reporter.tick(step + 1, step0 + length)
        if drifted or stopping:  # the step before this one drifted past loop.refresh_drift (refresh now), or a stop
          break
      drift_last, stop_last = _finish_step(run, *pending, last_fetch)
      stopping |= stop_last
      done, resume_at = s + 1, 0
      worker.wait_window(cut=done < schedule.sync_every)
      _log_worker_stats(run, worker, restored_step)
      end_step = step0 + done
      if done < length and not drifted:  # stopped inside the window: save it as it stands
        meta = checkpoints.Meta(sync, run.sampler.snapshot_version, meta.data_position, cfg.seed,
                                window_steps_done=done, drift_seen=int(drift_last))
        _save(run, end_step, state, meta, sampler=run.sampler.params)
        step0 = end_step
        break
      meta = checkpoints.Meta(sync + 1, run.sampler.snapshot_version,
                              meta.data_position + schedule.chunks_visible(s) * schedule.prompts_per_chunk, cfg.seed)
      if loop.refresh_drift:
        run.reporter.scalars(step0, {"sampler/window_steps": float(done)})
      _print_window(run, sync, end_step)
      if on_window is not None:
        on_window({"syncs": sync + 1, "num_syncs": loop.num_syncs, "trainer_steps": end_step,
                   "metrics_path": run.reporter.history_path})
      if stopping or (sync + 1) % cfg.checkpoint.every_syncs == 0 or end_step == loop.total_steps:
        _save(run, end_step, state, meta)
      step0, sync = end_step, sync + 1
      if stopping:
        break
    run.state, run.meta = state, meta
    if stop.signal_name is not None and step0 < loop.total_steps:
      logging.warning("stopped by %s after trainer step %d; resume with the same command", stop.signal_name, step0)
    summary = _finish(run, step0, stop)
    stopped = stop.signal_name and (step0 < loop.total_steps or "final_eval" in summary)
    return {**summary, **({"stopped_by": stop.signal_name} if stopped else {})}
  finally:  # a run is single-use: stop the worker thread and release writers, pools and files
    stop.uninstall()
    worker.stop()
    run.buffer.close()
    worker.join(timeout=600)
    run.release()


def _or(flags: tuple[bool, bool], drifted: bool, stopping: bool) -> tuple[bool, bool]:
  return flags[0] or drifted, flags[1] or stopping


def _save(run: Run, step: int, state, meta: checkpoints.Meta, sampler=None) -> None:
  """A checkpoint at `step`, unless its last update was skipped as non-finite (then the last good one stays)."""
  if run.monitor.diverging:
    logging.warning("not checkpointing step %d: its last update was skipped as non-finite", step)
    return
  run.checkpointer.save(step, trainer.checkpointed(state), meta, sampler=sampler)
  if meta.window_steps_done:
    logging.info("checkpoint %d saved inside window %d (%d of its steps done)", step, meta.syncs_done + 1,
                 meta.window_steps_done)


def _replay_draws(run: Run, worker: RolloutWorker, step0: int, steps: int) -> None:
  """A window resumed inside: its first `steps` draws again (numpy only, batches dropped), so the buffer's
  least-used-first order goes on as it would have."""
  for s in range(steps):
    visible = run.schedule.chunks_visible(s)
    worker.produce(visible)
    if run.buffer.sample(run.cfg.loop.batch_prompts, visible, np.random.default_rng([run.cfg.seed, step0 + s])) is None:
      worker.wait_window()
      raise RuntimeError("the rollout buffer was closed while its draws were replayed")


def _restore_snapshot(run: Run, step: int) -> None:
  """A save inside a window: the sampler gets that window's snapshot back, at its version (the restored params
  are only its template: shapes and shardings)."""
  version = run.meta.snapshot_version
  run.sampler.refresh(run.policy_params(run.state))
  snapshot = run.checkpointer.restore_sampler(step, checkpoints.abstract_like(run.sampler.params))
  run.sampler.snapshot_version = version - 1
  run.sampler.refresh(snapshot)
  logging.info("resuming inside window %d at its step %d, from the snapshot (version %d) saved with it",
               run.meta.syncs_done + 1, run.meta.window_steps_done, version)


def _print_window(run: Run, sync: int, end_step: int) -> None:
  """One concise console line per window (full metrics: TensorBoard, metrics.jsonl); printed, so a
  notebook or a script calling loop.train sees it too."""
  latest = run.reporter.latest
  values = {"loss": latest.get("train/loss"), "reward": latest.get("rollout/reward_mean")}
  values.update({f"{k.split('/')[1]} pass@1": v for k, v in latest.items() if k.startswith("eval/") and
                 k.endswith("/pass@1")})
  line = run.reporter.window_line(end_step, sync + 1, None if run.cfg.loop.refresh_drift else run.cfg.loop.num_syncs,
                                  {k: v for k, v in values.items() if v is not None})
  if run.reporter.is_main:
    print(line, flush=True)


def _finish_step(run: Run, step: int, metrics, extra: dict, stop_vote, last_fetch: float) -> tuple[bool, bool]:
  """Logs a step's metrics; (whether its drift from the sampler passed loop.refresh_drift (adaptive lag),
  whether any process had been asked to stop when it was dispatched)."""
  metrics = jax.device_get(metrics)
  run.checkpointer.poll()  # a failed background save stops the run here
  run.monitor.observe(step, metrics, run.checkpointer.latest_step())
  seconds = max(time.perf_counter() - last_fetch - extra["train/wait_seconds"], 1e-9)
  scalars = {f"train/{k}": v for k, v in metrics.items()}
  scalars.update(extra, **{"train/tokens_per_second": float(metrics["tokens"]) / seconds})
  run.reporter.scalars(step, scalars)
  threshold = run.cfg.loop.refresh_drift
  return bool(threshold) and float(metrics[run.cfg.loop.drift_metric]) > threshold, stop_vote()


def _reward_failures(history: list[dict]) -> int:
  """Training rewards that raised, timed out or were not finite (scored 0), over the logged rollouts: from
  metrics.jsonl, so a resumed run counts the earlier attempt's kept steps and never a re-run one twice."""
  return int(sum(h.get("rollout/reward_failures", 0.0) for h in history))


def _finish(run: Run, done_steps: int, stop: preemption.StopFlag) -> dict:
  """Final eval of the trained policy (none once a stop was asked for: `final_eval` says so), then the PNG curve
  and summary."""
  finished = done_steps >= run.cfg.loop.total_steps
  if finished:
    run.sampler.refresh(run.policy_params(run.state))
  summary: dict[str, Any] = {"finished": finished, "trainer_steps": done_steps, "syncs": run.meta.syncs_done,
                             "snapshot_version": run.sampler.snapshot_version, **run.monitor.summary(),
                             "reward_failures": _reward_failures(run.reporter.history())}
  evaluated = False
  if finished and not stop.vote()():  # the same answer on every process
    try:
      with stop.interrupting():
        policy = None if run.policy_eval is None else run.policy_eval(run.policy_params(run.state))
        final = _evaluate(run, done_steps)
    except preemption.Stopped:
      pass
    else:
      evaluated = True
      if policy is not None:
        policy_eval.log(done_steps, policy)
        run.reporter.scalars(done_steps, policy)
      run.reporter.scalars(done_steps, final)
      history = run.reporter.history()
      first = next((h for h in history if any(k.startswith("eval/") for k in h)), {})
      for key in sorted(k for k in final if "pass@" in k or "reward_mean" in k):
        summary[f"{key} (start)"] = first.get(key, float("nan"))
        summary[f"{key} (end)"] = final[key]
  if finished and not evaluated:
    summary["final_eval"] = f"skipped: stopped by {stop.signal_name}; the same command runs it"
    logging.warning("final eval %s", summary["final_eval"])
  paths = run.reporter.finish(summary, title=f"{run.cfg.trainer.loss.upper()} run summary")
  summary["paths"] = {**paths, "checkpoints": run.checkpointer.directory}
  return summary
