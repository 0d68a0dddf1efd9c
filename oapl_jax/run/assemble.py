"""The assembler: every part of a run built from a RunConfig one way, for every entry point (the loop,
offline mode, eval, export, serve, the compile check, the study).

    layouts = placement(rc)                          # trainer and sampler meshes
    task = build_task(rc)                            # prompts and eval sets, checked against the run's limits
    model, params = build_model(rc, layouts.trainer) # an HF checkpoint or a preset, born sharded
    sampler = build_sampler(rc, model, layouts.sampler)
    T = seq_len(rc, longest_prompt(task))            # the trainer's sequence length, one rule
    metrics = evaluate(rc, task, sampler, sampler.params, settings=eval_settings)
    probe = policy_eval(rc, task, sampler, model, T, evaluate_params)   # the current policy every N steps
    run = setup(cfg, workdir); loop.train(run)        # a whole run (rl/loop.py), resuming if it can; locks workdir
    # setup = the parts (RunParts, by keyword) -> online(rc, parts) (loop.Online) or offline(rc, parts)
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from oapl_jax import checkpoint_files, checkpoints, evaluation, generations, objectives, parallel, reporting, run_dir, sections
from oapl_jax.models import factory
from oapl_jax.models.api import CausalLM
from oapl_jax.rl import loop, offline as offline_mode, preemption, trainer, warmstart, windows
from oapl_jax.rl.buffer import RolloutBuffer, sequence_length
from oapl_jax.rl.demo_mix import DemoMixer
from oapl_jax.rl.monitors import HealthMonitor
from oapl_jax.rl.parts import RunParts
from oapl_jax.rl.policy_eval import PolicyEval
from oapl_jax.run import check, schema
from oapl_jax.run.schema import RunConfig
from oapl_jax.sampler import api as sampler_api, core, scripted
from oapl_jax.sampler.settings import SamplingSettings
from oapl_jax.tasks import factory as task_factory
from oapl_jax.tasks.base import Task
from oapl_jax.tasks.problem_checks import Demands, validate_task


def placement(rc: RunConfig, devices: Optional[Sequence[Any]] = None) -> parallel.Placement:
  return parallel.placement_from_config(rc.mesh, devices)


def build_task(rc: RunConfig, vocab_size: Optional[int] = None) -> Task:
  """The task with every set checked against the run's prompt budget, policy and warm start, and its reward
  called once on a probe response (tasks/base.Task.probe_reward), all before any model is built."""
  demands = Demands(max_prompt_tokens=rc.sampler.max_prefill_length, policy=rc.validation,
                    warmstart_steps=rc.warmstart.steps, warmstart_batch=rc.warmstart.batch_size, seed=rc.seed,
                    vocab_size=vocab_size)
  task = task_factory.build_task(rc.task)
  try:
    task = validate_task(task, demands, task_settings=rc.task)[0]
    task.probe_reward()
    return task
  except Exception:
    task.close()
    raise


def sampling(rc: RunConfig, task: Task) -> tuple[SamplingSettings, SamplingSettings]:
  """(rollout settings, eval settings); both stop at the task's eos."""
  stops = (task.tokenizer.eos_id,)
  return rc.sampler.sampling(stops), rc.eval.sampling(stops)


def new_tokens(rc: RunConfig) -> int:
  """The longest generation the trainer sees: the rollouts' budget; online runs also keep eval's in the
  buffer's length (an offline run trains only on stored rollouts: configs/code.py 32K, not eval's 64K)."""
  return rc.sampler.max_new_tokens if rc.is_offline else max(rc.sampler.max_new_tokens, rc.eval.max_new_tokens)


def seq_len(rc: RunConfig, longest_prompt: int) -> int:
  """The trainer's sequence length (T of its [B, G, T] batch): prompt + response, less the last target."""
  return sequence_length(longest_prompt, new_tokens(rc))


def longest_prompt(task: Task, *, train_only: bool = False) -> int:
  sets = [task.train] + ([] if train_only else list(task.eval_sets.values()))
  return max(len(p.prompt_tokens) for problems in sets for p in problems)


def build_model(rc: RunConfig, layout: parallel.Layout) -> tuple[CausalLM, Any]:
  return factory.build_model(rc.model, layout, rc.seed)


def train_config(rc: RunConfig, longest_prompt: int = 0) -> trainer.TrainConfig:
  """The trainer section with the sampler's temperature (policy log-probs use logits / temperature) and, for
  trainer.share_prompts, the task's longest prompt."""
  return dataclasses.replace(rc.trainer, temperature=rc.sampler.temperature, longest_prompt=longest_prompt)


def sampler_model(rc: RunConfig, model: CausalLM) -> CausalLM:
  return model.with_execution(param_dtype=rc.sampler.dtype, dtype=rc.sampler.dtype, remat=False)


def build_sampler(rc: RunConfig, model: CausalLM, layout: parallel.Layout, *,
                  max_prefill_length: Optional[int] = None, max_new_tokens: Optional[int] = None,
                  snapshot_version: int = 0) -> sampler_api.GroupSampler:
  """The run's sampler (`sampler.backend`): its dtype and slots, a prompt bucket and the longest generation it
  serves; its versions go on from `snapshot_version` (a resumed run's)."""
  sizes = dict(max_prefill_length=max_prefill_length or rc.sampler.max_prefill_length,
               max_new_tokens=max_new_tokens or max(rc.sampler.max_new_tokens, rc.eval.max_new_tokens),
               layout=layout, snapshot_version=snapshot_version)
  if rc.sampler.backend == "scripted":
    return scripted.ScriptedSampler(model.config.vocab_size, **sizes)
  return core.Sampler(sampler_model(rc, model), num_slots=rc.sampler.num_slots,
                      max_prefill_batch=rc.sampler.max_prefill_batch, **sizes)


def eval_seed(rc: RunConfig) -> int:
  return rc.seed + evaluation.SEED_OFFSET


def evaluate(rc: RunConfig, task: Task, sampler: sampler_api.GroupSampler, params, *, settings: SamplingSettings,
             eval_sets=None, sink: Optional[generations.Sink] = None, step: Optional[int] = None,
             prefix: str = "") -> dict[str, float]:
  """{'eval/<set>/<metric>': value} over the task's eval sets (or `eval_sets`), at the run's eval seed; with a
  `sink` and a `step`, each set's first eval.save_prompts prompts' generations go to evals/<step>/<prefix><set>."""
  per_set, saved = evaluation.evaluate_sets(sampler, params, task, task.eval_sets if eval_sets is None else eval_sets,
                                            rc.eval, settings, eval_seed(rc))
  if sink is not None and step is not None:
    sink.eval(step, saved, prefix)
  return {f"eval/{name}/{k}": v for name, metrics in per_set.items() for k, v in metrics.items()}


def rollout_saver(rc: RunConfig, task: Task, sink: generations.Sink) -> Optional[Callable]:
  """RunParts.save_rollouts: a window's first eval.save_prompts training prompts x G rollouts, with their rewards
  and the loss's advantages (generations.advantages); None when eval.save_prompts is 0."""
  keep = rc.eval.save_prompts
  if not keep:
    return None

  def save(window: int, problems, groups, rewards_PxG: np.ndarray) -> None:
    with jax.default_device(jax.local_devices(backend="cpu")[0]):  # a few numbers, off the accelerators
      advantages_PxG = generations.advantages(rc.trainer.loss, rc.trainer.loss_settings, rewards_PxG[:keep])
    sink.rollouts(window, generations.records(task, problems, groups, rewards_PxG, keep, advantages_PxG))
  return save


WARMSTART_CHECKPOINTS = "warmstart_checkpoints"  # RUN/warmstart_checkpoints: a stopped (or finished) warm start


def warm_start(rc: RunConfig, task: Task, model: CausalLM, params, layout: parallel.Layout, seq: int,
               log: Callable[[int, dict], None], *, workdir: Optional[str] = None,
               stop: Optional[preemption.StopFlag] = None):
  """params after the warm start's supervised steps (unchanged when warmstart.steps = 0). With a `workdir`, a warm
  start saved in it is continued and its end saved; a `stop` agreed during it saves it and raises
  preemption.Stopped (rl/warmstart.py)."""
  if not rc.warmstart.steps:
    return params
  if task.demonstrations is None:
    raise ValueError(f"config field warmstart.steps={rc.warmstart.steps}, but task {task.name!r} has no "
                     "demonstrations")
  demonstrations = task.demonstrations(rc.seed)
  longest = max((len(d.completion_tokens) for d in demonstrations), default=0)
  if longest > rc.sampler.max_new_tokens:  # the RL answers would be cut there too
    raise sections.ConfigError([f"sampler.max_new_tokens={rc.sampler.max_new_tokens}: task {task.name!r} has "
                                f"demonstrations of up to {longest} completion tokens, and answers that long are cut "
                                "off (and score 0); raise it (and eval.max_new_tokens)"])
  logging.info("warm start: %d supervised steps on demonstrations", rc.warmstart.steps)
  saves = None if workdir is None else checkpoints.Checkpointer(os.path.join(workdir, WARMSTART_CHECKPOINTS), 1)
  try:
    return warmstart.warm_start(demonstrations, params, model, layout, rc.warmstart, seq_len=seq,
                                seed=rc.seed, log=log, checkpointer=saves, stop=stop)
  finally:
    if saves is not None:
      saves.close()


def warm_start_saved(rc: RunConfig, workdir: str) -> bool:
  """Whether `workdir` holds a save of this config's warm start (one stopped, or one whose RL has no checkpoint)."""
  directory = checkpoint_files.absolute(os.path.join(workdir, WARMSTART_CHECKPOINTS))
  return bool(rc.warmstart.steps) and bool(checkpoint_files.step_dirs(directory)[0])


def old_policy_scorer(train_cfg: trainer.TrainConfig, model: CausalLM, layout: parallel.Layout, chunk_prompts: int):
  """For a loss that reads pi_old (GRPO's ratio): the policy's log-probs of a rollout chunk, taken with
  the params that start its round, so the PPO clip acts on the later steps of that round; else None."""
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


def policy_eval(rc: RunConfig, task: Task, sampler: sampler_api.GroupSampler, model: CausalLM, seq: int,
                evaluate_params: Callable) -> Optional[PolicyEval]:
  """The every-N-steps eval of the trainer's current policy (eval.every_steps; None when 0)."""
  if not rc.eval.every_steps:
    return None
  return PolicyEval(rc.eval.every_steps, evaluate_params, sampler, model,
                    {name: problems[:rc.eval.num_prompts] for name, problems in task.eval_sets.items()},
                    rc.eval.probe_sampling((task.tokenizer.eos_id,)), eval_seed(rc), seq)


def setup(cfg: Any, workdir: str, allow_config_changes: bool = False, force_lock: bool = False,
          stop: Optional[preemption.StopFlag] = None) -> loop.Online | offline_mode.Offline:
  """Build a run: where it runs, the task, the model (warm-started or restored), the sampler; the online driver
  (rl/loop.py), or the offline one (rl/offline.py) when the config has an `offline` section.
  cfg: a RunConfig, or a ConfigDict (read by schema.from_config). The config's cross-section rules and
  every data source are checked before any model is built; the workdir is locked (run_dir.lock, RunDirBusy
  at once; `force_lock` takes over another host's record) before anything is written, until the run ends.
  `stop` (installed by the caller, rl/preemption.py): one agreed during the warm start saves it and raises
  preemption.Stopped, the workdir released; the same call continues it."""
  rc = cfg if isinstance(cfg, RunConfig) else schema.from_config(cfg)
  workdir = os.path.abspath(os.path.expanduser(workdir))
  check.check(rc)
  lock = run_dir.lock(workdir, force_lock)
  try:
    parts = _parts(rc, workdir, allow_config_changes, lock, stop)
    return offline(rc, parts) if rc.is_offline else online(rc, parts)
  except BaseException:
    if lock is not None:
      lock.release()
    raise


def _parts(rc: RunConfig, workdir: str, allow_config_changes: bool, lock: Optional[run_dir.RunLock],
           stop: Optional[preemption.StopFlag]) -> RunParts:
  layouts = placement(rc)
  if stop is not None:
    stop.across(layouts.trainer.mesh)
  task = build_task(rc)
  rollout_settings, eval_settings = sampling(rc, task)
  model, params = build_model(rc, layouts.trainer)
  longest = longest_prompt(task)
  seq = seq_len(rc, longest)
  checkpointer = checkpoints.Checkpointer(f"{workdir}/checkpoints", rc.checkpoint.max_to_keep)
  reporter = reporting.Reporter(workdir, rc.loop.num_syncs * rc.loop.sync_every, switches(rc), rc.report.events)

  train_cfg = train_config(rc, longest)
  record = schema.to_mapping(rc)
  resuming = checkpointer.latest_step() is not None
  warm_resuming = not resuming and warm_start_saved(rc, workdir)
  if resuming or warm_resuming:  # a resume with another config says what differs, and refuses unless allowed
    run_dir.check_resume(workdir, record, allow_config_changes, defaults=schema.defaults().to_dict())
  if not (resuming or warm_resuming) or run_dir.recorded_config(workdir) is None:
    run_dir.record_config(workdir, record)
  if warm_resuming:
    reporter.resume_from(0)  # keeps the warm start's metrics, drops the RL steps of an attempt that saved none
  if not resuming:
    try:
      params = warm_start(rc, task, model, params, layouts.trainer, seq, reporter.scalars, workdir=workdir,
                          stop=stop)
    except BaseException:  # a stop too: setup ends here, so the task's reward workers go now
      task.close()
      raise
  state = trainer.create_train_state(train_cfg, model, params, layouts.trainer, jax.random.PRNGKey(rc.seed))
  del params
  meta = checkpoint_files.Meta(syncs_done=0, snapshot_version=0, data_position=0, seed=rc.seed)
  if resuming:
    frozen = state.frozen
    if train_cfg.lora.enabled:  # the base the adapters were trained on (after its warm start)
      frozen = checkpoints.restore_base(workdir, checkpoints.abstract_like(frozen))
    state, meta = checkpointer.restore(checkpoints.abstract_like(trainer.checkpointed(state)))
    state = state.replace(frozen=frozen)
    reporter.resume_from(int(state.step))
    logging.info("resumed from %s at step %d (%d syncs done)", checkpointer.directory, int(state.step), meta.syncs_done)

  elif train_cfg.lora.enabled:
    checkpoints.save_base(workdir, state.frozen)

  sampler = build_sampler(rc, model, layouts.sampler, snapshot_version=meta.snapshot_version)
  sink = generations.Sink(workdir, reporter.texts)
  evaluate_params = functools.partial(evaluate, rc, task, sampler, settings=eval_settings, sink=sink)
  return RunParts(placement=layouts, task=task, model=model, train_config=train_cfg,
                  policy_params=trainer.make_policy_params(train_cfg, model, layouts.trainer), state=state, meta=meta,
                  sampler=sampler, rollout_settings=rollout_settings, eval_settings=eval_settings,
                  checkpointer=checkpointer, reporter=reporter, monitor=HealthMonitor(rc.monitors),
                  evaluate=evaluate_params, policy_eval=policy_eval(rc, task, sampler, model, seq, evaluate_params),
                  save_rollouts=rollout_saver(rc, task, sink), lock=lock)


def switches(rc: RunConfig) -> dict[str, str]:
  """The settings that change what a run is, in use or 'off': summary.md's lines (reporting.Reporter)."""
  loop, lora, model = rc.loop, rc.trainer.lora, rc.model
  return {
      "loss": rc.trainer.loss,
      "task": rc.task.get("name") if isinstance(rc.task, dict) else rc.task.name,
      "model": model.checkpoint or f"preset {model.preset} {model.overrides or ''}".strip(),
      "sync windows": f"{loop.num_syncs} of L={loop.sync_every} steps",
      "LoRA": f"rank {lora.rank}, alpha {lora.alpha}, on {', '.join(lora.targets)}" if lora.rank
              else "off (full fine-tuning)",
      "adaptive lag": f"a refresh when {loop.drift_metric} > {loop.refresh_drift} (L bounds a window)"
                      if loop.refresh_drift else "off (a refresh every L steps)",
      "demonstrations in RL batches": f"fraction {loop.demo_fraction}" if loop.demo_fraction else "off",
      "sampler delay": f"{loop.sampler_delay_windows} window(s)" if loop.sampler_delay_windows else "off",
      "warm start": f"{rc.warmstart.steps} steps" if rc.warmstart.steps else "off",
      "offline": "on" if rc.is_offline else "off",
  }


def _shared(parts: RunParts) -> dict:
  return {f.name: getattr(parts, f.name) for f in dataclasses.fields(RunParts)}


def loop_settings(rc: RunConfig) -> loop.LoopSettings:
  return loop.LoopSettings(total_steps=rc.loop.total_steps, num_syncs=rc.loop.num_syncs,
                           batch_prompts=rc.loop.batch_prompts, group_size=rc.loop.group_size, seed=rc.seed,
                           eval_every_syncs=rc.loop.eval_every_syncs,
                           checkpoint_every_syncs=rc.checkpoint.every_syncs,
                           title=f"{rc.trainer.loss.upper()} run summary")


def loss_fn(rc: RunConfig) -> objectives.BoundLoss:
  """The train step's loss: the trainer's, with the demonstration slots' NLL beside it for loop.demo_use='sft'."""
  loss = functools.partial(objectives.compute_loss, rc.trainer.loss)
  return objectives.with_demo_sft(loss, rc.trainer.demo_sft_weight) if rc.loop.demo_use == "sft" else loss


def online(rc: RunConfig, parts: RunParts) -> loop.Online:
  """The online driver (Algorithm 1, rl/loop.py): the parts, the buffer and train step, the window policy
  the loop section asks for (fixed L, delayed by one window, adaptive on drift) and the step hooks (the
  policy probe when eval.every_steps > 0, the old-policy scorer when the loss reads pi_old and a group can be
  trained after its params moved)."""
  layout, schedule, train_cfg = parts.placement.trainer, rc.loop.schedule(), parts.train_config
  buffer = RolloutBuffer(seq_len(rc, train_cfg.longest_prompt))
  batch_sharding = trainer.batch_sharding(layout, rc.loop.batch_prompts)
  hooks: list[windows.StepHook] = []
  if parts.policy_eval is not None:
    hooks.append(windows.PolicyProbe(parts.policy_eval, parts.reporter, parts.policy_params))
  # a group trained once, on arrival, has pi_old = the step's params: the loss takes stop_gradient(pi) (ratio 1
  # exactly, as TRL and Tunix do at one iteration) and no forward of the scorer runs
  score = (None if rc.loop.trains_each_group_on_arrival
           else old_policy_scorer(train_cfg, parts.model, layout, rc.loop.prompts_per_rollout))
  if score is not None:
    hooks.append(windows.OldPolicyScorer(score, buffer, schedule, parts.policy_params))
  return loop.Online(**_shared(parts), settings=loop_settings(rc), schedule=schedule,
                     windows=windows.window_policy(rc.loop.refresh_drift, rc.loop.drift_metric,
                                                   rc.loop.sampler_delay_windows),
                     hooks=hooks, buffer=buffer,
                     train_step=trainer.make_train_step(train_cfg, parts.model, layout, rc.loop.batch_prompts,
                                                        loss_fn(rc)),
                     batch_sharding=batch_sharding,
                     batch_rows=parallel.process_rows(batch_sharding, rc.loop.batch_prompts),
                     demo_mixer=demo_mixer(rc, parts.task))


def offline(rc: RunConfig, parts: RunParts) -> offline_mode.Offline:
  """The offline driver (rl/offline.py): the parts and the stages' settings; no buffer, train step or scorer."""
  return offline_mode.Offline(**_shared(parts), config=rc.offline, seed=rc.seed,
                         batch_prompts=rc.loop.batch_prompts, group_size=rc.loop.group_size)


def demo_mixer(rc: RunConfig, task: Task) -> Optional[DemoMixer]:
  """Demonstrations in the buffer (loop.demo_fraction), from the task's demonstrations at the run's seed."""
  if not rc.loop.demo_fraction:
    return None
  if task.demonstrations is None:
    raise ValueError(f"loop.demo_fraction={rc.loop.demo_fraction}: task {task.name!r} has no demonstrations")
  return DemoMixer.build(task.demonstrations(rc.seed), rc.loop.demo_fraction, rc.loop.group_size,
                         rc.sampler.temperature, rc.sampler.max_new_tokens, as_sft=rc.loop.demo_use == "sft")
