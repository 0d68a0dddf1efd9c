"""The paper's code setting (OAPL §5.2): DeepSeek-R1-Distill-Qwen-14B on DeepCoder's problems, offline in
two stages, eval on LiveCodeBench.

  oapl-prepare model deepseek-ai/DeepSeek-R1-Distill-Qwen-14B --out ~/models/DeepSeek-R1-Distill-Qwen-14B
  oapl-prepare data livecodebench --out ~/data/livecodebench
  python -m oapl_jax.apps.offline run --config configs/code.py --workdir /runs/oapl-code
  python -m oapl_jax.apps.offline run --config configs/code.py:smoke --workdir /tmp/code_smoke   # CPU, minutes
  (or stage by stage: `generate --stage 1`, `train --offline --stage 1`, `generate --stage 2`, ...)

Paper: stage 1 generates 8 responses for every DeepCoder training prompt with the initial model, drops
prompts with no correct response, and trains 1 epoch with no sync; stage 2 regenerates on 4000 random
prompts with the trained model and trains 4 more epochs. beta1 = 1, beta2 = 1e-3, AdamW (0.9, 0.999), lr
1e-6 cosine (2% warmup, min ratio 0.05), grad clip 1.0, global batch 256 with 1 batch per update,
generation temperature 1.0, top-p 1.0, 32000 tokens; eval temperature 0.6, top-p 0.95, 64K tokens, 20
samples per prompt. We read "global batch 256" as 256 sequences = 32 prompts x 8 samples per step: one
epoch over the ~13.4K DeepCoder prompts that survive the filter is then the paper's ~418 updates (with
256 prompts per step, 418 steps would need 107K prompts, more than DeepCoder has).
Data as distributed: DeepCoder-Preview-Dataset Parquet files ({"problem", "tests"}; edit the paths to
where they were downloaded) and LiveCodeBench code_generation_lite's problems ({"question_content",
"public_test_cases", "private_test_cases", "metadata", "contest_date", "starter_code"}; `oapl-prepare data
livecodebench` joins its test.jsonl ... test6.jsonl into one test.jsonl), cut into the v5 window
(2024-08-01..2025-02-01, DeepCoder's 279 problems) and the v6 window (2025-02-01..2025-05-01).
"""
from ml_collections import ConfigDict

from oapl_jax.run import config_base

DATA = "~/data"  # edit, or override each path on the command line
MODEL = "~/models/DeepSeek-R1-Distill-Qwen-14B"
LCB_FILES = (f"{DATA}/livecodebench/test.jsonl",)  # or the published test.jsonl ... test6.jsonl, each a path
INSTRUCTION = ("\n\nSolve the problem in Python. Put the complete program (or the requested function) in one "
               "```python code block at the end of your response.")


def code_task() -> ConfigDict:
  """DeepCoder training problems and LiveCodeBench eval windows (tasks/code_task.records_task)."""
  window = lambda start, end: dict(paths=LCB_FILES, problem_key="question_content", start=start, end=end)  # noqa: E731
  return ConfigDict(dict(
      name="oapl_jax.tasks.code_task:records_task", tokenizer_dir=MODEL, problem_key="problem",
      train_paths=tuple(f"{DATA}/deepcoder/{subset}/train.parquet" for subset in ("lcbv5", "primeintellect", "taco")),
      eval_sets={"lcb_v5": window("2024-08-01", "2025-02-01"), "lcb_v6": window("2025-02-01", "2025-05-01")},
      system_prompt="", instruction_suffix=INSTRUCTION, reward_workers=64, reward_timeout_s=6.0, max_tests=0,
      max_train=0))


def smoke_task() -> ConfigDict:
  """code_synthetic (tasks/code_task.py): 'f(x)=3x+1' -> a fenced def, run in the sandbox; a teacher that
  flips the constant's sign on 70% of its demonstrations (8 per problem, each slipping on its own)."""
  return ConfigDict(dict(name="code_synthetic", num_digits=1, num_train=96, num_held_out=32, held_out_fraction=0.25,
                         teacher_slip_rate=0.7, teacher_copies=8, reward_workers=2, reward_timeout_s=2.0, seed=0))


def get_config(arg: str = "") -> ConfigDict:
  c = config_base.base_config()
  c.model.update(checkpoint=MODEL, preset="deepseek_r1_distill_qwen_14b", param_dtype="float32", dtype="bfloat16",
                 remat=True)
  c.task = code_task()
  c.trainer.loss_settings.oapl.update(beta1=1.0, beta2=1e-3)
  # total_steps: the offline mode gives every stage a cosine of its own length; 418 is the paper's stage 1.
  c.trainer.optim.update(lr=1e-6, b1=0.9, b2=0.999, weight_decay=0.0, max_grad_norm=1.0, schedule="cosine",
                         warmup_ratio=0.02, min_ratio=0.05, total_steps=418)
  c.trainer.micro_batches = 8  # 4 prompts x 8 samples = 32 sequences per micro-batch: one per device of a v5p-64
  # Compile check on v5p-64 (python -m oapl_jax.apps.compile_check --config configs/code.py --topology v5p-64), per chip:
  # train step at T=36095 44.8 GiB (46.8% of 95.7 at 1a81059; remat + splash; about 10 GiB fixed + 0.72 GiB per
  # layer, mostly the bf16 residual saved per layer), prefill 2.8, insert 26.5, decode 39.6, train + resident
  # sampler 71.2 (74.4%).
  # 64 slots: the KV cache is sized for eval's 64K tokens; on a v5p-64 insert/decode compile to 26/46 GiB per chip
  c.sampler.update(num_slots=64, max_prefill_length=4096, max_new_tokens=32000, temperature=1.0, top_p=1.0,
                   dtype="bfloat16", steps_per_sync=64)
  c.loop.update(group_size=8, batch_prompts=32, prompts_per_rollout=32, steps_per_rollout=1, sync_every=418,
                num_syncs=2, eval_every_syncs=1)
  c.eval.update(samples=20, ks=(1, 5, 10, 20), temperature=0.6, top_p=0.95, max_new_tokens=65536)
  c.mesh.update(trainer_ici=(1, -1, 1), sampler_ici=(1, -1, 8), sampler_devices=0)  # tensor 8: the 8 KV heads
  # offline (rl/offline.py): stage s generates on prompts[s-1] training prompts (0: all), trains epochs[s-1].
  c.offline = ConfigDict(dict(stages=2, prompts=(0, 4000), epochs=(1, 4), chunk_prompts=256, drop_all_wrong=True,
                              drop_all_correct=False))
  if arg == "smoke":
    _shrink_to_smoke(c)
  elif arg:
    raise ValueError(f"unknown variant {arg!r}; known: '' (paper), 'smoke'")
  return c


def _shrink_to_smoke(c: ConfigDict) -> None:
  """The whole two-stage pipeline on CPU in minutes: a tiny Qwen, code_synthetic, toy betas (docs/DESIGN.md §1)."""
  c.model.update(checkpoint="", preset="tiny", param_dtype="float32", dtype="float32", remat=False,
                 overrides=dict(vocab_size=64, hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4,
                                num_kv_heads=2, head_dim=16, max_position_embeddings=64))
  c.task = smoke_task()
  c.warmstart.update(steps=200, batch_size=32)
  c.warmstart.optim.lr = 3e-3
  c.trainer.loss_settings.oapl.update(beta1=0.5, beta2=0.5)
  c.trainer.optim.update(lr=3e-4, b2=0.99, total_steps=1)
  c.trainer.micro_batches = 1
  # grow_cache off: one decode compile at the full (short) length instead of one per cache bucket
  c.sampler.update(num_slots=64, max_prefill_length=16, max_new_tokens=36, dtype="float32", steps_per_sync=8,
                   grow_cache=False)
  c.loop.update(batch_prompts=8, prompts_per_rollout=8, sync_every=1)
  c.eval.update(num_prompts=32, samples=4, ks=(1, 4), max_new_tokens=36, grow_cache=False)
  c.mesh.update(trainer_ici=(1, -1, 1), sampler_ici=(1, -1, 1))
  c.offline.update(prompts=(64, 32), epochs=(1, 4), chunk_prompts=32)
