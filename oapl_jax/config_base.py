"""Defaults every experiment config (configs/*.py) starts from, each field documented once, here.

It lives in the package so config files import it however they are loaded (python -m, oapl-train, Colab)."""
from ml_collections import ConfigDict


def base_config() -> ConfigDict:
  c = ConfigDict()
  c.seed = 0
  # model: an HF checkpoint directory, or a preset (oapl_jax/models/config.py) + overrides.
  # attention: the training/prefill kernel (models/attention.py); "auto" picks by the mesh's platform.
  c.model = ConfigDict(dict(checkpoint="", preset="tiny", overrides={}, param_dtype="float32", dtype="float32",
                            remat=False, attention="auto"))
  # warmstart: supervised steps on the task's demonstrations before RL (0 = none); optim.total_steps
  # 0 means "the whole warm start" for the cosine schedule.
  c.warmstart = ConfigDict(dict(steps=0, batch_size=0, optim=dict(
      lr=1e-4, b1=0.9, b2=0.98, eps=1e-8, weight_decay=0.01, max_grad_norm=1.0, schedule="cosine", warmup_ratio=0.05,
      min_ratio=0.1, total_steps=0)))
  c.trainer = ConfigDict(dict(
      loss="oapl",  # a name in objectives.LOSSES; only its entry of loss_settings is read
      loss_settings=dict(oapl=dict(beta1=1.0, beta2=1e-3, length_normalize=False), grpo=dict(clip_eps=0.2, tis_cap=2.0),
                         grpo_onpolicy=dict(clip_eps=0.2, tis_cap=2.0), asymre=dict(shift=-0.1),
                         opmd=dict(tau=1.0, baseline="mean"), m2po=dict(budget=0.04)),
      optim=dict(lr=1e-6, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, max_grad_norm=1.0, schedule="constant",
                 warmup_ratio=0.0, min_ratio=0.0, total_steps=0),
      micro_batches=1))
  # sampler: its own mesh and dtype; the trainer's log-probs use the same temperature. grow_cache:
  # attend over a KV cache that grows with the batch (faster decode, one compile per cache length).
  c.sampler = ConfigDict(dict(num_slots=64, max_prefill_length=1024, max_new_tokens=1024, temperature=1.0,
                              top_p=1.0, top_k=0, steps_per_sync=16, grow_cache=True, dtype="float32"))
  # loop: Algorithm 1. sync_every = L; a step samples B groups; the sampler adds chunks of P prompts
  # x G samples; step s of a window may use the first min(1 + s // steps_per_rollout, chunks) chunks.
  c.loop = ConfigDict(dict(sync_every=50, num_syncs=10, batch_prompts=128, prompts_per_rollout=128, group_size=8,
                           steps_per_rollout=2, eval_every_syncs=1, stop_after_syncs=0))
  c.eval = ConfigDict(dict(num_prompts=1_000_000, samples=10, ks=(1, 5, 10), temperature=0.6, top_p=0.95,
                           max_new_tokens=1024))
  c.checkpoint = ConfigDict(dict(every_syncs=1, max_to_keep=3))
  # validation (oapl_jax/validation.py): prompts longer than sampler.max_prefill_length are an "error" or
  # a counted "skip"; duplicate records are kept ("keep") or dropped ("drop"), and counted either way.
  c.validation = ConfigDict(dict(on_oversized="error", on_duplicates="keep"))
  # monitors (rl/monitors.py): stop after this many non-finite (skipped) updates in a row; warn on a loss
  # this many times its recent median, on token entropy below the floor, on this many steps with no signal.
  # A rollout chunk where more than max_reward_failure_fraction of the rewards failed stops the run.
  c.monitors = ConfigDict(dict(max_skipped_updates=3, loss_explosion_factor=1e4, entropy_floor=1e-3,
                               no_signal_steps=20, max_reward_failure_fraction=0.5))
  # mesh (parallel.placement_from_config): ici sizes within a slice and dcn sizes across slices for
  # (data, fsdp, tensor), one -1 per list fills; sampler_devices > 0 gives the sampler the last n
  # devices (whole hosts); rules override parallel.DEFAULT_RULES.
  c.mesh = ConfigDict(dict(trainer_ici=(1, -1, 1), trainer_dcn=(-1, 1, 1), sampler_ici=(1, -1, 1),
                           sampler_dcn=(-1, 1, 1), sampler_devices=0, rules={}))
  return c


def arithmetic_task(num_digits: int, num_train: int, num_held_out: int) -> ConfigDict:
  """teacher_slip_rate: the fraction of warm-start demonstrations whose last digit is off by one."""
  return ConfigDict(dict(name="arithmetic", num_digits=num_digits, operations=("+",), num_train=num_train,
                         num_held_out=num_held_out, seed=0, teacher_slip_rate=0.0))


def chat_task(tokenizer_dir: str, train_path: str, eval_paths: dict, reward: str = "math_verify") -> ConfigDict:
  """Problem/answer records (JSONL, Parquet or tfds:NAME/SPLIT) templated with the model's chat template."""
  return ConfigDict(dict(name="chat", tokenizer_dir=tokenizer_dir, train_path=train_path, eval_paths=eval_paths,
                         problem_key="problem", answer_key="answer", system_prompt="",
                         instruction_suffix=" Let's think step by step and output the final answer within \\boxed{}.",
                         reward=reward, reward_workers=4, reward_timeout_s=10.0, max_train=0,
                         answer_after=""))  # e.g. "####" for GSM8K: the answer is what follows it


def records_task(train_path: str, eval_paths: dict, reward: str = "exact_match", tokenizer: str = "chars",
                 demonstrations_path: str = "") -> ConfigDict:
  """Your own task from data files (tasks/records_task.py). Sources are .jsonl, .parquet or tfds:NAME/SPLIT.
  reward: a name in tasks/rewards.REWARDS, or 'package.module:function' to `score(record, response) -> float`
  (it gets the prompt's whole record). tokenizer: "chars" (printable ASCII, tiny models) or an HF checkpoint
  directory (its chat template wraps prompts; system_prompt applies there). demonstrations_path: records with
  prompt_key and completion_key for the warm start (warmstart.steps > 0). unfinished_reward: what a response cut
  at the token budget scores with "chars" (it is not shown to the reward)."""
  return ConfigDict(dict(name="records", train_path=train_path, eval_paths=eval_paths, reward=reward,
                         tokenizer=tokenizer, demonstrations_path=demonstrations_path, prompt_key="prompt",
                         answer_key="answer", completion_key="completion", system_prompt="", instruction_suffix="",
                         max_train=0, unfinished_reward=0.0))


def shrink_for_cpu(c: ConfigDict) -> None:
  """The same pipeline at toy size: one window of two trainer steps, float32, a few short rollouts."""
  c.model.update(dtype="float32", remat=False)
  c.task.update(reward_workers=1, max_train=8)
  c.trainer.micro_batches = 1
  c.sampler.update(num_slots=8, max_prefill_length=256, max_new_tokens=8, dtype="float32", steps_per_sync=4)
  c.loop.update(sync_every=2, num_syncs=1, batch_prompts=8, prompts_per_rollout=8, group_size=2, steps_per_rollout=1,
                eval_every_syncs=1)
  c.eval.update(num_prompts=2, samples=2, ks=(1, 2), max_new_tokens=8)
  c.mesh.update(trainer_ici=(1, -1, 1), sampler_ici=(1, -1, 1), sampler_devices=0)  # tiny heads: no tensor split
