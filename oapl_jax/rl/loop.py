"""OAPL, Algorithm 1: a lagged sampler fills the buffer while the trainer regresses on it.

  for each sync window (L trainer steps):
    sampler <- trainer params (device-side reshard, version += 1); buffer <- empty, that version
    background thread: [eval the fresh snapshot]; generate the window's chunks of P prompts x G samples
    trainer: L steps, step s draws B groups from the chunks the schedule makes visible to it
  checkpoint at window boundaries (the buffer is empty there by construction)

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
import math
import time
from typing import Any, Optional

import jax
import numpy as np

from oapl_jax import checkpoints, evaluation, objectives, parallel, reporting, run_dir, validation
from oapl_jax.models.api import CausalLM
from oapl_jax.models.factory import build_model
from oapl_jax.rl import trainer, warmstart
from oapl_jax.rl.buffer import RolloutBuffer
from oapl_jax.rl.monitors import HealthMonitor, MonitorConfig
from oapl_jax.rl.rollout_worker import RolloutWorker, Window
from oapl_jax.rl.schedule import WindowSchedule
from oapl_jax.sampler import core
from oapl_jax.sampler.settings import SamplingSettings
from oapl_jax.tasks.base import Task
from oapl_jax.tasks.factory import build_task


@dataclasses.dataclass
class Run:
  """Everything a run holds; built by `setup`, advanced by `train`."""
  cfg: Any
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
  score_old_policy: Any = None  # (params, chunk) -> per-token log-probs, for losses that read pi_old


def sampling_settings(cfg, task: Task) -> tuple[SamplingSettings, SamplingSettings]:
  """(rollout settings from cfg.sampler, eval settings from cfg.eval); both stop at the task's eos."""
  stops = (task.tokenizer.eos_id,)
  rollout_settings = SamplingSettings.from_config(cfg.sampler, stop_tokens=stops)
  eval_settings = SamplingSettings.from_config(cfg.eval, stop_tokens=stops)
  return rollout_settings, eval_settings


def _warm_start(cfg, task: Task, model: CausalLM, params, layout: parallel.Layout, seq_len: int, reporter):
  config = warmstart.WarmStartConfig.from_config(cfg.warmstart)
  if not config.steps:
    return params
  if task.demonstrations is None:
    raise ValueError(f"config field warmstart.steps={config.steps}, but task {task.name!r} has no demonstrations")
  logging.info("warm start: %d supervised steps on demonstrations", config.steps)
  return warmstart.warm_start(task.demonstrations(cfg.seed), params, model, layout, config, seq_len=seq_len,
                              seed=cfg.seed, log=reporter.scalars)


def setup(cfg, workdir: str, allow_config_changes: bool = False) -> Run:
  """Build a run: where it runs, the task, the model (warm-started or restored), the sampler.
  The whole config and every data source are checked before any model is built."""
  validation.validate_config(cfg)
  placement = parallel.placement_from_config(cfg.mesh)
  task, _ = validation.validate_task(cfg, build_task(cfg.task), vocab_size=None)
  rollout_settings, eval_settings = sampling_settings(cfg, task)
  schedule = WindowSchedule(cfg.loop.sync_every, cfg.loop.steps_per_rollout, cfg.loop.prompts_per_rollout)
  model, params = build_model(cfg.model, placement.trainer, cfg.seed)
  every_prompt = list(task.train) + [q for problems in task.eval_sets.values() for q in problems]
  seq_len = max(len(p.prompt_tokens) for p in every_prompt) + max(rollout_settings.max_new_tokens,
                                                                   eval_settings.max_new_tokens) - 1
  checkpointer = checkpoints.Checkpointer(f"{workdir}/checkpoints", cfg.checkpoint.max_to_keep)
  reporter = reporting.Reporter(workdir, cfg.loop.num_syncs * cfg.loop.sync_every)

  train_cfg = dataclasses.replace(trainer.TrainConfig.from_config(cfg.trainer), temperature=rollout_settings.temperature)
  resuming = checkpointer.latest_step() is not None
  if resuming:  # a resume with another config says what differs, and refuses unless allowed
    run_dir.check_resume(workdir, cfg, allow_config_changes)
  if not resuming or run_dir.recorded_config(workdir) is None:
    run_dir.record_config(workdir, cfg)
  if not resuming:
    params = _warm_start(cfg, task, model, params, placement.trainer, seq_len, reporter)
  state = trainer.create_train_state(train_cfg, model, params, placement.trainer)
  del params
  meta = checkpoints.Meta(syncs_done=0, snapshot_version=0, data_position=0, seed=cfg.seed)
  if resuming:
    state, meta = checkpointer.restore(checkpoints.abstract_like(state))
    reporter.resume_from(int(state.step))
    logging.info("resumed from %s at step %d (%d syncs done)", checkpointer.directory, int(state.step), meta.syncs_done)

  sampler_model = model.with_dtypes(param_dtype=cfg.sampler.dtype, dtype=cfg.sampler.dtype)
  sampler = core.Sampler(sampler_model, layout=placement.sampler, num_slots=cfg.sampler.num_slots,
                         max_prefill_length=cfg.sampler.max_prefill_length,
                         max_new_tokens=max(rollout_settings.max_new_tokens, eval_settings.max_new_tokens))
  sampler.snapshot_version = meta.snapshot_version
  batch_sharding = trainer.batch_sharding(placement.trainer, cfg.loop.batch_prompts)
  return Run(cfg, task, schedule, rollout_settings, eval_settings, model, state,
             trainer.make_train_step(train_cfg, model, placement.trainer, cfg.loop.batch_prompts), sampler, RolloutBuffer(seq_len),
             checkpointer, reporter, meta, HealthMonitor(MonitorConfig.from_config(cfg.get("monitors"))),
             batch_sharding, parallel.process_rows(batch_sharding, cfg.loop.batch_prompts),
             _old_policy_scorer(train_cfg, model, placement.trainer, cfg.loop.prompts_per_rollout))


def _old_policy_scorer(train_cfg: trainer.TrainConfig, model: CausalLM, layout: parallel.Layout, chunk_prompts: int):
  """For a loss that reads pi_old (GRPO's ratio): the policy's log-probs of a rollout chunk, taken with
  the params that start its round, so the PPO clip acts on the later steps of that round."""
  if "old_policy_token_logp" not in objectives.loss_spec(train_cfg.loss).optional:
    return None
  config = dataclasses.replace(train_cfg, micro_batches=math.gcd(chunk_prompts, train_cfg.micro_batches))
  score = trainer.make_score_fn(config, model, layout, chunk_prompts)
  sharding = trainer.batch_sharding(layout, chunk_prompts)
  rows = parallel.process_rows(sharding, chunk_prompts)
  to_every_host = jax.jit(lambda x: x, out_shardings=layout.replicated)  # on the trainer's devices only

  def score_chunk(params, chunk: dict) -> np.ndarray:
    inputs = parallel.from_process_rows({k: v[rows] for k, v in chunk.items()}, sharding, chunk_prompts)
    return np.asarray(to_every_host(score(params, inputs)))
  return score_chunk


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
  e = run.cfg.eval
  out = {}
  for name, problems in run.task.eval_sets.items():
    metrics = evaluation.evaluate(run.sampler, run.sampler.params, run.task, problems[:e.num_prompts],
                                  samples=e.samples, ks=tuple(e.ks), settings=run.eval_settings,
                                  seed=run.cfg.seed + 7919)
    out.update({f"eval/{name}/{k}": v for k, v in metrics.items()})
  logging.info("eval at step %d: %s", step, {k: round(v, 4) for k, v in out.items() if "pass@" in k})
  return out


def _log_worker_stats(run: Run, worker: RolloutWorker) -> None:
  while not worker.stats.empty():
    step, metrics = worker.stats.get()
    run.reporter.scalars(step, metrics)


def rollouts_inline(sampler_layout: parallel.Layout) -> bool:
  """Whether the rollouts run in the trainer's thread (RolloutWorker inline) instead of beside it:
  with several processes on the CPU backend, where two threads running cross-process programs at
  once deadlock in JAX 0.10.2's gloo collectives (each side alone runs; both at once hang). Results
  are the same either way; only the overlap of sampling and training is lost."""
  return jax.process_count() > 1 and sampler_layout.platform == "cpu"


def train(run: Run, on_window=None, inline_rollouts: Optional[bool] = None) -> dict:
  """Runs the remaining sync windows; returns the final summary (also written to the workdir).
  on_window(progress: dict), if given, is called after every window (e.g. a notebook redraws its curve).
  inline_rollouts: rollouts in the trainer's thread (True) or their own (False); None: `rollouts_inline`."""
  cfg, loop, schedule = run.cfg, run.cfg.loop, run.schedule
  worker = RolloutWorker(run.sampler, run.task, run.buffer, schedule, run.rollout_settings,
                         group_size=loop.group_size, seed=cfg.seed, eval_fn=lambda step: _evaluate(run, step),
                         monitors=run.monitor.config,
                         inline=rollouts_inline(run.sampler.layout) if inline_rollouts is None else inline_rollouts)
  worker.start()
  meta, state = run.meta, run.state
  first_sync = meta.syncs_done
  base_key = jax.random.PRNGKey(cfg.seed)
  try:
    for sync in range(first_sync, loop.num_syncs):
      if loop.stop_after_syncs and sync - first_sync >= loop.stop_after_syncs:
        logging.warning("stopping after %d sync windows (loop.stop_after_syncs)", loop.stop_after_syncs)
        break
      step0 = schedule.first_step(sync)
      run.sampler.refresh(state.params)
      run.buffer.reset(run.sampler.snapshot_version)
      run.monitor.new_window()
      run.reporter.scalars(step0, {"sampler/refresh_seconds": run.sampler.last_refresh_seconds,
                                   "sampler/refresh_bytes": run.sampler.last_refresh_bytes})
      worker.start_window(Window(run.sampler.snapshot_version, sync, meta.data_position,
                                 evaluate=sync % loop.eval_every_syncs == 0))
      pending, last_fetch, scored = None, time.perf_counter(), 0
      for s in range(schedule.sync_every):
        step = step0 + s
        worker.produce(schedule.chunks_visible(s))  # inline rollouts only: the chunks this step may draw
        if run.score_old_policy is not None:
          scored = _score_new_chunks(run, state.params, scored, schedule.chunks_visible(s))
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
          _finish_step(run, *pending, last_fetch)
          last_fetch = time.perf_counter()
        pending = (step, metrics, {"train/policy_lag": s, "train/wait_seconds": waited,
                                   "buffer/groups": run.buffer.num_groups(), "buffer/reuse_mean": reuse.mean()})
        _log_worker_stats(run, worker)
        run.reporter.tick(step + 1, schedule.first_step(sync + 1))
      _finish_step(run, *pending, last_fetch)
      worker.wait_window()
      _log_worker_stats(run, worker)
      meta = checkpoints.Meta(sync + 1, run.sampler.snapshot_version,
                              meta.data_position + schedule.prompts_per_window, cfg.seed)
      end_step = schedule.first_step(sync + 1)
      _print_window(run, sync, end_step)
      if on_window is not None:
        on_window({"syncs": sync + 1, "num_syncs": loop.num_syncs, "trainer_steps": end_step,
                   "metrics_path": run.reporter.history_path})
      if run.monitor.diverging:
        logging.warning("not checkpointing step %d: its last update was skipped as non-finite", end_step)
      elif (sync + 1) % cfg.checkpoint.every_syncs == 0 or sync + 1 == loop.num_syncs:
        run.checkpointer.save(end_step, state, meta)
    run.state, run.meta = state, meta
    return _finish(run)
  finally:  # a run is single-use: stop the worker thread and release writers, pools and files
    worker.stop()
    run.buffer.close()
    worker.join(timeout=600)
    run.checkpointer.close()
    run.reporter.close()
    run.task.close()


def _print_window(run: Run, sync: int, end_step: int) -> None:
  """One concise console line per window (full metrics: TensorBoard, metrics.jsonl); printed, so a
  notebook or a script calling loop.train sees it too."""
  latest = run.reporter.latest
  values = {"loss": latest.get("train/loss"), "reward": latest.get("rollout/reward_mean")}
  values.update({f"{k.split('/')[1]} pass@1": v for k, v in latest.items() if k.startswith("eval/") and
                 k.endswith("/pass@1")})
  line = run.reporter.window_line(end_step, sync + 1, run.cfg.loop.num_syncs,
                                  {k: v for k, v in values.items() if v is not None})
  if run.reporter.is_main:
    print(line, flush=True)


def _finish_step(run: Run, step: int, metrics, extra: dict, last_fetch: float) -> None:
  metrics = jax.device_get(metrics)
  run.monitor.observe(step, metrics, run.checkpointer.latest_step())
  seconds = max(time.perf_counter() - last_fetch - extra["train/wait_seconds"], 1e-9)
  scalars = {f"train/{k}": v for k, v in metrics.items()}
  scalars.update(extra, **{"train/tokens_per_second": float(metrics["tokens"]) / seconds})
  run.reporter.scalars(step, scalars)


def _finish(run: Run) -> dict:
  """Final eval of the trained policy, then the PNG curve and summary."""
  done_steps = run.schedule.first_step(run.meta.syncs_done)
  finished = run.meta.syncs_done == run.cfg.loop.num_syncs
  if finished:
    run.sampler.refresh(run.state.params)
  summary: dict[str, Any] = {"finished": finished, "trainer_steps": done_steps, "syncs": run.meta.syncs_done,
                             "snapshot_version": run.sampler.snapshot_version, **run.monitor.summary()}
  if finished:
    final = _evaluate(run, done_steps)
    run.reporter.scalars(done_steps, final)
    history = run.reporter.history()
    first = next((h for h in history if any(k.startswith("eval/") for k in h)), {})
    for key in sorted(k for k in final if "pass@" in k or "reward_mean" in k):
      summary[f"{key} (start)"] = first.get(key, float("nan"))
      summary[f"{key} (end)"] = final[key]
  paths = run.reporter.finish(summary)
  summary["paths"] = {**paths, "checkpoints": run.checkpointer.directory}
  return summary
