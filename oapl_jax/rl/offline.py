"""The paper's offline two-stage mode (§5.2): rollouts generated once to disk, then epochs of OAPL on them.

  python -m oapl_jax.apps.offline generate --config configs/code.py:smoke --workdir W [--stage 1]
  python -m oapl_jax.apps.offline train --offline --config configs/code.py:smoke --workdir W [--stage 1]
  python -m oapl_jax.apps.offline run --config configs/code.py:smoke --workdir W    # every stage, with evals

Stage s: the policy trained through stage s-1 (stage 1: the warm-started or pretrained model, saved as
checkpoint step 0) becomes sampler snapshot s and generates G = loop.group_size responses for
`offline.prompts[s-1]` training prompts (0: all; a seeded subset otherwise) into
<workdir>/rollouts/stage-<s> (rl/rollout_store.py: Parquet chunks, resumable). Training drops the groups
in which no sample is correct (reward > 0.5, as pass@k counts it), and with `drop_all_correct` those in
which every sample is, then takes `offline.epochs[s-1]` epochs of steps of loop.batch_prompts groups over
the rest with no sync: the lag is the whole stage, and V* and log pi_vllm come from the stored rollouts.
Every stage starts a fresh optimizer state whose cosine schedule (if any) spans that stage's steps
(trainer.optim.total_steps is replaced); the step counter runs on across stages. A checkpoint ends every
stage (meta.syncs_done = stages trained). `run` evaluates pass@k before its first stage and after each.

Resuming: generate continues after the last whole chunk; an interrupted train restarts from the checkpoint
that began its stage; `run` picks up at the first stage not trained. SIGTERM/SIGINT (rl/preemption.py) stops
generate after the chunk being made, and train after the step in flight with a checkpoint there (meta's
window_steps_done: the stage's steps done), from which train goes on exactly: same batches, same updates.
"""
import contextlib
import dataclasses
import functools
import logging
import os
import time
from typing import Any, Iterator, Optional, Sequence

import jax
import numpy as np

from oapl_jax import checkpoint_files, sections
from oapl_jax.rl import policy_eval, preemption, stepping, trainer
from oapl_jax.rl.buffer import pack_groups, sequence_length
from oapl_jax.rl.monitors import check_reward_failures
from oapl_jax.rl.optim import make_schedule
from oapl_jax.rl.parts import RunParts
from oapl_jax.rl.rollout_store import RolloutStore, StoreHeader, take_groups
from oapl_jax.sampler import api as sampler_api


@dataclasses.dataclass(frozen=True)
class OfflineConfig:
  """The `offline` config section (configs run by oapl_jax.apps.offline): per-stage prompt counts and epochs,
  chunking, the filter."""
  stages: int = sections.rule(2, low=1)  # generate-then-train rounds (the paper's code setting: 2)
  prompts: tuple[int, ...] = sections.rule((0, 4000), low=0)  # training prompts per stage (0: all of them)
  epochs: tuple[int, ...] = sections.rule((1, 4), low=1)  # passes over each stage's kept groups
  chunk_prompts: int = sections.rule(64, low=1)  # prompts per sampler call and per stored Parquet chunk
  drop_all_wrong: bool = True  # the paper's filter: groups with no correct sample
  drop_all_correct: bool = False  # optional: groups with only correct samples

  def __post_init__(self):
    sections.enforce(self)
    if len(self.prompts) != self.stages or len(self.epochs) != self.stages:
      raise ValueError(f"offline.prompts={self.prompts} and offline.epochs={self.epochs} need one entry per stage "
                       f"({self.stages})")


def keep_groups(rewards_PxG: np.ndarray, drop_all_wrong: bool = True, drop_all_correct: bool = False) -> np.ndarray:
  """[P] bool, the groups the filter keeps; a sample is correct when its reward is > 0.5."""
  correct_PxG = np.asarray(rewards_PxG) > 0.5
  keep_P = np.ones(len(correct_PxG), bool)
  if drop_all_wrong:
    keep_P &= correct_PxG.any(axis=-1)
  if drop_all_correct:
    keep_P &= ~correct_PxG.all(axis=-1)
  return keep_P


def stage_prompts(num_train: int, count: int, seed: int, stage: int) -> np.ndarray:
  """Indices of the training prompts stage `stage` generates on: the first `count` (0: all) of a seeded shuffle."""
  if count > num_train:
    raise ValueError(f"offline.prompts asks stage {stage} for {count} prompts; the task has {num_train}")
  return np.random.default_rng([seed, stage]).permutation(num_train)[:count or num_train]


def stage_dir(workdir: str, stage: int) -> str:
  return os.path.join(os.path.abspath(workdir), "rollouts", f"stage-{stage}")


def stage_batches(store: RolloutStore, keep_by_chunk: Sequence[np.ndarray], batch_prompts: int, epochs: int,
                  seed: Sequence[int], seq_len: int) -> Iterator[dict[str, np.ndarray]]:
  """Trainer batches of `batch_prompts` kept groups (`pack_groups` arrays), floor(epochs * kept / B) of them.

  Each epoch visits the chunks in a fresh seeded order and a chunk's kept groups in a fresh order; one
  chunk is read at a time, and a batch may span chunks (and epochs)."""
  carry: Optional[dict[str, np.ndarray]] = None
  for epoch in range(epochs):
    rng = np.random.default_rng([*seed, epoch])
    for chunk in rng.permutation(store.header.num_chunks):
      rows = np.flatnonzero(keep_by_chunk[chunk])
      if not rows.size:
        continue
      rows = rows[rng.permutation(rows.size)]
      stored = store.read_chunk(int(chunk))
      packed = pack_groups(take_groups(stored.groups, rows), stored.rewards_PxG[rows], seq_len)
      carry = packed if carry is None else {k: np.concatenate([carry[k], v]) for k, v in packed.items()}
      while len(carry["rewards"]) >= batch_prompts:
        yield {k: v[:batch_prompts] for k, v in carry.items()}
        carry = {k: v[batch_prompts:] for k, v in carry.items()}


def stage_train_config(config: trainer.TrainConfig, steps: int, temperature: float,
                       longest_prompt: int = 0) -> trainer.TrainConfig:
  """The trainer section with a cosine schedule spanning `steps`, at the rollouts' temperature (and their longest
  prompt, for trainer.share_prompts)."""
  optim = dataclasses.replace(config.optim, total_steps=steps) if config.optim.schedule == "cosine" else config.optim
  return dataclasses.replace(config, optim=optim, temperature=temperature, longest_prompt=longest_prompt)


# ------------------------------------------------------------------------------ stages on an Offline run
@dataclasses.dataclass(kw_only=True)
class Offline(RunParts):
  """An offline run: the parts and what its stages read (built by run/assemble.offline); no buffer, train step
  or scorer: each stage makes its own step for its own schedule."""
  config: OfflineConfig  # (each stage sets train_config's schedule, temperature and longest prompt)
  seed: int
  batch_prompts: int  # B: groups per trainer step
  group_size: int  # G: responses generated per prompt


def _check_stage(run: Offline, stage: int, stages: int) -> None:
  if not 1 <= stage <= stages:
    raise ValueError(f"stage {stage} is not one of the config's offline stages 1..{stages}")
  if run.meta.syncs_done != stage - 1:
    raise ValueError(f"stage {stage} needs the policy trained through stage {stage - 1}, but the latest checkpoint in "
                     f"{run.checkpointer.directory} (step {run.checkpointer.latest_step()}) has "
                     f"{run.meta.syncs_done} stage(s) trained")


def ensure_start_checkpoint(run: Offline) -> None:
  """Saves the starting policy (warm-started or pretrained) as step 0, so every command starts from it."""
  if run.checkpointer.latest_step() is None:
    run.checkpointer.save(0, run.state, run.meta)
    run.checkpointer.wait()


def policy_snapshot(run: Offline, version: int) -> None:
  """The sampler holds the trainer's current params as snapshot `version` (refreshed unless it already does)."""
  if run.sampler.params is None or run.sampler.snapshot_version != version:
    run.sampler.refresh(run.state.params, version=version)


def evaluate_policy(run: Offline) -> dict[str, float]:
  """pass@k (evaluation.evaluate) of the sampler's snapshot on every eval set, at the eval settings."""
  step = run.checkpointer.latest_step()
  out = run.evaluate(run.sampler.params, step=step)
  run.reporter.scalars(step, out)
  logging.info("eval of the policy at step %d: %s", step, {k: round(v, 4) for k, v in out.items() if "pass@" in k})
  return out


def generate_stage(run: Offline, config: OfflineConfig, stage: int, workdir: str,
                   stop: Optional[preemption.StopFlag] = None) -> RolloutStore:
  """Stage `stage`'s rollouts, generated by the current policy as snapshot `stage`, stored chunk by chunk;
  a `stop` ends it after the chunk being made, or within it on one process (the store is then incomplete, and
  resumable)."""
  _check_stage(run, stage, config.stages)
  task = run.task
  indices = stage_prompts(len(task.train), config.prompts[stage - 1], run.seed, stage)
  header = StoreHeader(task=task.name, stage=stage, snapshot_version=stage, policy_step=run.checkpointer.latest_step(),
                       group_size=run.group_size, num_prompts=len(indices), chunk_prompts=config.chunk_prompts,
                       seed=run.seed, settings=run.rollout_settings)
  store = RolloutStore.create_or_resume(stage_dir(workdir, stage), header)
  if store.num_complete:
    logging.info("stage %d: resuming generation after %d of %d chunks", stage, store.num_complete, header.num_chunks)
  if not store.complete:
    policy_snapshot(run, stage)
  G = header.group_size
  for chunk in range(store.num_complete, header.num_chunks):
    idx = indices[chunk * header.chunk_prompts:(chunk + 1) * header.chunk_prompts]
    problems = [task.train[i] for i in idx]
    try:
      with contextlib.nullcontext() if stop is None else stop.cutting(run.sampler):
        groups = run.sampler.generate([p.prompt_tokens for p in problems], G, run.rollout_settings,
                                      seed=int(np.random.default_rng([run.seed, stage, chunk]).integers(2**31)),
                                      prompt_ids=idx)
    except sampler_api.Interrupted:
      logging.warning("stage %d: chunk %d of %d cut by %s; `generate` resumes at it", stage, chunk + 1,
                      header.num_chunks, stop.signal_name)
      break
    rewards_PxG, result = task.score_groups(problems, groups.response_tokens, groups.lengths)
    check_reward_failures(result.num_failed + result.num_timeout, rewards_PxG.size, run.monitor.config,
                          f"stage {stage}, chunk {chunk}")
    responses = [[task.completion_text(groups.response_tokens[p, g, :groups.lengths[p, g]]) for g in range(G)]
                 for p in range(len(problems))]
    store.write_chunk(chunk, groups, rewards_PxG, problems, idx, responses, result.num_failed, result.num_timeout)
    stats = {"reward_mean": float(rewards_PxG.mean()), "frac_groups_all_wrong": float(1 - keep_groups(rewards_PxG).mean()),
             "response_length": float(groups.lengths.mean()), "tokens_per_second": groups.tokens_per_second}
    run.reporter.scalars(header.policy_step, {f"offline/generate/{k}": v for k, v in stats.items()})
    logging.info("stage %d: chunk %d/%d stored, %s, %.1fs", stage, chunk + 1, header.num_chunks,
                 {k: round(v, 3) for k, v in stats.items()}, groups.wall_seconds)
    if stop is not None and chunk + 1 < header.num_chunks and stop.vote()():
      logging.warning("stage %d: stopped by %s after %d of %d chunks; `generate` resumes after them", stage,
                      stop.signal_name, chunk + 1, header.num_chunks)
      break
  return store


def train_stage(run: Offline, config: OfflineConfig, stage: int, workdir: str,
                stop: Optional[preemption.StopFlag] = None) -> dict[str, float]:
  """`offline.epochs[stage-1]` epochs of OAPL on stage `stage`'s kept groups; checkpoints at the end, or after
  the step in flight when `stop` is agreed (the stats then hold `stopped_at`; train again to go on)."""
  _check_stage(run, stage, config.stages)
  store = RolloutStore.open(stage_dir(workdir, stage))
  done = run.meta.window_steps_done  # > 0: a stop saved inside this stage, after that many of its steps
  h, start_step = store.header, run.checkpointer.latest_step() - done
  if not store.complete:
    raise RuntimeError(f"stage {stage}'s rollouts in {store.directory} hold {store.num_complete} of {h.num_chunks} "
                       f"chunks: finish them with `generate --stage {stage}`")
  if h.policy_step != start_step:
    raise RuntimeError(f"stage {stage}'s rollouts come from the policy at step {h.policy_step}, but the latest "
                       f"checkpoint is step {start_step}")
  keep_by_chunk = [keep_groups(store.read_rewards(c), config.drop_all_wrong, config.drop_all_correct)
                   for c in range(h.num_chunks)]
  kept, total = sum(int(k.sum()) for k in keep_by_chunk), sum(len(k) for k in keep_by_chunk)
  B, epochs = run.batch_prompts, config.epochs[stage - 1]
  steps = epochs * kept // B
  if steps < 1:
    raise ValueError(f"stage {stage}: the filter kept {kept} of {total} groups; {epochs} epoch(s) of them make no "
                     f"batch of loop.batch_prompts={B}")
  logging.info("stage %d: the filter kept %d of %d groups; %d epoch(s) = %d steps of %d groups", stage, kept, total,
               epochs, steps, B)
  layout = run.placement.trainer
  longest_prompt = max(len(p.prompt_tokens) for p in run.task.train)
  train_cfg = stage_train_config(run.train_config, steps, h.settings.temperature, longest_prompt)
  if done:  # the restored state is this stage's, optimizer state included
    state, run.state = run.state, None
  else:
    params, run.state = run.state.params, None  # the old optimizer state goes before the new one is made
    state = trainer.create_train_state(train_cfg, run.model, params, layout)
    del params  # the step donates its state, which may share buffers with the old one
    state = state.replace(step=jax.device_put(np.int32(start_step), state.step.sharding))
  step_fn, schedule = trainer.make_train_step(train_cfg, run.model, layout, B), make_schedule(train_cfg.optim)
  base_key, stop = jax.random.PRNGKey(run.seed), stop or preemption.StopFlag()
  driver = stepping.StepDriver(step_fn, lambda step: jax.random.fold_in(base_key, step),
                               functools.partial(_log_step, run), stop=stop,
                               checkpointer=run.checkpointer, monitor=run.monitor)
  first_position = run.meta.data_position - done * B  # where the stage began
  # T from the stored rollouts' own budget and prompts (buffer.sequence_length: the one rule)
  seq_len = sequence_length(longest_prompt, h.settings.max_new_tokens)
  for i, batch in enumerate(stage_batches(store, keep_by_chunk, B, epochs, (run.seed, stage), seq_len)):
    if i < done:  # steps a stopped attempt took: the same batches, in order, skipped
      continue
    if run.policy_eval is not None and i > 0 and run.policy_eval.due(start_step + i):  # its start: evaluate_policy
      policy_eval.report(run.policy_eval, run.reporter, start_step + i, state.params)
    state = driver.step(state, batch, start_step + i, {"train/learning_rate": float(schedule(i)),
                                                       "offline/stage": stage, "offline/epoch": i * B / kept})
    if driver.stopping and i + 1 < steps:
      break
  driver.flush()
  done = i + 1 if i + 1 < steps else 0  # > 0: stopped inside the stage
  end_step = start_step + (done or steps)
  meta = checkpoint_files.Meta(syncs_done=stage - bool(done), snapshot_version=h.snapshot_version,
                          data_position=first_position + (done or steps) * B, seed=run.seed, window_steps_done=done)
  run.checkpointer.save(end_step, state, meta)
  run.checkpointer.wait()
  run.state, run.meta = state, meta
  if done:
    logging.warning("stage %d: stopped by %s after %d of its %d steps, checkpoint %d saved; `train` goes on from it",
                    stage, stop.signal_name, done, steps, end_step)
  return {"kept_groups": kept, "groups": total, "steps": steps, **({"stopped_at": end_step} if done else {})}


def _log_step(run: Offline, step: int, metrics: dict, extra: dict) -> None:
  """A stage step's report (stepping.Report): its metrics to the reporter and a console line."""
  run.reporter.scalars(step, {**{f"train/{k}": v for k, v in metrics.items()}, **extra})
  logging.info("step %d: loss %.4g, grad_norm %.3g, lr %.3g, entropy %.3g", step, metrics["loss"],
               metrics["grad_norm"], extra["train/learning_rate"], metrics["entropy"])


def close(run: Offline) -> None:
  """Releases the run's checkpointer, writers, the task's reward workers and the workdir's lock."""
  run.release()


def _evaluate_or_cut(run: Offline, stop: preemption.StopFlag, stage: int, summary: dict) -> Optional[dict]:
  """evaluate_policy, or None where a stop cut it (one process; the summary says so under `cut`)."""
  try:
    with stop.cutting(run.sampler):
      return evaluate_policy(run)
  except sampler_api.Interrupted:
    summary["cut"] = f"the eval after stage {stage}"
    logging.warning("%s cut by %s (the same command runs it again)", summary["cut"], stop.signal_name)
    return None


def run_stages(run: Offline, workdir: str, stop: Optional[preemption.StopFlag] = None) -> dict[str, Any]:
  """Every stage of the run's `offline` section not yet trained (generate -> train -> eval), with an eval of
  the policy it starts from; returns the summary (also written to the workdir). `pass@k after stage 0` is
  the starting policy. `run` comes from run/assemble.setup; it is closed at the end. After an agreed `stop`
  the summary names the signal under `stopped_by`; the same command goes on."""
  config, stop = run.config, stop or preemption.StopFlag()
  start = time.perf_counter()
  summary: dict[str, Any] = {}
  try:
    ensure_start_checkpoint(run)
    first, evals = run.meta.syncs_done + 1, {}
    if not run.meta.window_steps_done:  # (a stage stopped inside was evaluated at its start)
      policy_snapshot(run, first)
      evals[first - 1] = _evaluate_or_cut(run, stop, first - 1, summary)
    for stage in range(first, config.stages + 1):
      if evals.get(stage - 1, True) is None:  # cut by a stop: the same command runs it again
        break
      t0 = time.perf_counter()
      if not generate_stage(run, config, stage, workdir, stop).complete:
        break
      t1 = time.perf_counter()
      stats = train_stage(run, config, stage, workdir, stop)
      summary.update({f"stage {stage}/{k}": v for k, v in stats.items()})
      summary.update({f"stage {stage}/generate_seconds": t1 - t0, f"stage {stage}/train_seconds": time.perf_counter() - t1})
      if "stopped_at" in stats:
        break
      policy_snapshot(run, stage + 1)
      evals[stage] = _evaluate_or_cut(run, stop, stage, summary)
    for stage, metrics in ((s, m) for s, m in evals.items() if m is not None):
      summary.update({f"{k} after stage {stage}": v for k, v in metrics.items() if "pass@" in k or "reward_mean" in k})
    summary.update(trainer_steps=run.checkpointer.latest_step(), wall_seconds=time.perf_counter() - start,
                   **run.monitor.summary(), **({"stopped_by": stop.signal_name} if stop.signal_name else {}))
    summary["paths"] = {**run.reporter.finish(summary), "checkpoints": run.checkpointer.directory,
                        "rollouts": os.path.dirname(stage_dir(workdir, 1))}
    return summary
  finally:
    close(run)
