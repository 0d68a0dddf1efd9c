"""One run of the claims study (experiments/claims.py): a task, its model and the RL budget.

  python -m experiments.study --task arithmetic --out reports/claims_v3              # the whole study
  python -m oapl_jax.main --config configs/claims.py:arithmetic --workdir runs/x \
      --config.model.checkpoint=runs/claims/arithmetic/warmstart --config.warmstart.steps=0 \
      --config.trainer.loss=grpo --config.loop.sync_every=2 ...                      # one of its runs

Variants: 'arithmetic' (task A: the demo's slip-fix addition, configs/arithmetic.py, with its full warm
start: 1000 steps on a teacher that slips on 85% of the demonstrations), 'hard_tail' (task B: the same
addition, the teacher always wrong on the problems whose first operand is odd: experiments/hard_tail_task.py),
each optionally ',digits3' (3-digit addition, slip 0.5, a 3000-step warm start: off the ceiling) and ',smoke'
(CI size); 'chain' (task C, optionally ',smoke': oapl_jax/tasks/chain_task.py, a running sum of CHAIN_TERMS
terms of CHAIN_DIGITS digits written step by step, "37+58+12=" -> "37+58=95;95+12=107;#107", only the final
answer graded; its teacher slips by +1 at one step and carries the wrong total on); 'code' (task D, optionally
',smoke': tasks/code_task.py's code_synthetic, "f(x)=37x-5" -> a fenced `def f(x): return 37*x-5`, graded by
running it in the sandbox on four inputs; its teacher flips the constant's sign on CODE_SLIP_RATE of its
demonstrations, CODE_COPIES per problem, each slipping on its own so the warm start learns the rate, not which
problems slip). The report's per-cell commands give every override.

Why the code task's numbers: the sandbox starts two interpreters per program (about 0.13 s on this host), so
rewards are cached by (program, tests) (a converged policy writes the same few programs a prompt again and again;
only clean runs are kept); at slip 0.65 a policy that learned the teacher exactly is right at the eval's T = 0.6
0.35^(1/0.6) / (0.35^(1/0.6) + 0.65^(1/0.6)) = 0.26 of the time.

Why the chain's numbers: 3 two-digit terms keep a response at 14-26 tokens (chain_task.max_completion_len: 26 with
eos; the prompt is at most 10 with bos), about 4x the addition's, so a run's CPU time stays a few minutes; the
sampler's and eval's max_new_tokens are that longest completion and max_prefill_length that longest prompt
(computed, not typed: a truncated answer scores 0). The same tiny model (the chain tokenizer has 32 ids, the
model's vocab_size), the same B x G, S, L and split sizes as 'arithmetic' (128 validation / 256 test prompts).
The teacher's slip rate, the train set's size and the warm start's length put the warm-started policy off the
ceiling and the floor with its entropy intact. A first try (commit 303e307, reports/claims_v4/chain at that commit:
slip 0.7, the addition's 4096 train problems, 1500 steps = 47 passes) memorized which demonstrations slip (train
nll 0.0024): validation pass@1 0.373 but test pass@32 only 0.50, 74-90% of the pilot's rollout groups all-equal
over its first 50 steps, and the pilot failed its stop rule (OAPL L = 50 0.400 -> 0.510 at step 150, +0.11 <
+0.15). Now: 32768 train problems and 1000 steps at batch 128 (about 4 passes; train nll 0.075 at the end, the
teacher's own entropy: calibrated, not memorized) and the study's slip 0.85, which spreads over two steps, so a
policy that learned the teacher exactly would, at the eval's T = 0.6, be right (0.575^(1/0.6) / (0.575^(1/0.6) +
0.425^(1/0.6)))^2 = 0.39 of the time. Measured: validation pass@1 0.285 (pass@4 0.66), test pass@1 0.285, pass@32
0.94, sequence entropy 1.17 nats, no truncation; made in 1097 s on one shared core (about 1.1 s/step).

The defaults here are OAPL at lag L = 50 for S = 300 trainer steps: each step draws B = 4 prompts x G = 8
responses from a chunk generated for it (32 generations per step), the teacher slipping on 85% of the
demonstrations: round 3's settings, chosen to keep every primary arm off the ceiling at mid-run (round 2,
reports/claims_arithmetic, used S = 200, B = 8 and the demo's slip rate 0.7; GRPO was at 0.95 by step 100). The harness (experiments/plan.py) changes only the method's fields per cell: the loss and its
learning rate, and the loop's lag, chunking and sampler delay; it checks that nothing else differs between
the cells it pairs. Rollouts at T = 1, top-p 1; evals at the paper's T = 0.6, top-p 0.95. The trainer's
current policy is scored every eval.every_steps steps whatever the lag (policy_eval/... in metrics.jsonl).
OAPL's beta1 is the paper's 1; beta2 = 0.5 is the toy task's default (docs/DESIGN.md: 1e-3 is for 16K tokens);
the study tunes it with the learning rate (experiments/plan.KNOBS).
"""
import importlib.util
import os

from ml_collections import ConfigDict

from oapl_jax.tasks import chain_task, code_task

STEPS = 300  # S: trainer steps per run (round 3; round 2, reports/claims_arithmetic, ran 200)
LAG = 50  # OAPL's main lag (the paper's L)
LONG_LAG = 100  # claim 3: L = 100 against L = 50, three windows at L = 100
BATCH_PROMPTS = 4  # round 3: 4 prompts x 8 per step (round 2's 8 put GRPO at 0.95 by step 100: the ceiling)
DIGITS3_SLIP_RATE = 0.5  # ',digits3': 3-digit addition, a teacher slipping on half the demonstrations,
DIGITS3_WARMSTART_STEPS = 3000  # and a longer warm start (validation pass@1 0.41 after it)
CHAIN_TERMS, CHAIN_DIGITS = 3, 2  # 'chain': 3 two-digit terms, two "a+b=c;" steps, responses of 14-26 tokens
CHAIN_SLIP_RATE = SLIP_RATE = 0.85  # the teacher slips on 85% (round 3; round 2: the demo's 0.7)
CHAIN_TRAIN = 32768  # 'chain': 8x the addition's 4096 train problems, so the warm start sees each about 4 times
CHAIN_WARMSTART_STEPS = 1000  # 'chain': validation pass@1 0.285, test 0.285 (pass@32 0.94) after it
CODE_DIGITS, CODE_SLIP_RATE = 2, 0.65  # 'code': f(x)=ax+-b with a, b of up to 2 digits; the teacher flips the sign
CODE_TRAIN, CODE_COPIES = 8192, 4  # 'code': 4 demonstrations a problem, each slipping on its own (no memorising)
CODE_REWARD_CACHE = 1 << 16  # 'code': programs met again are not re-run (code_reward.CodeReward.cache_size)
EVAL_EVERY_STEPS = 10  # the current policy's validation pass@1 and entropy on this step grid


def _arithmetic_demo_config() -> ConfigDict:
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "arithmetic.py")
  spec = importlib.util.spec_from_file_location("_claims_arithmetic", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def get_config(arg: str = "arithmetic") -> ConfigDict:
  parts = set(arg.split(",")) - {""}
  tasks = (parts & {"arithmetic", "hard_tail", "chain", "code"}) or {"arithmetic"}
  if len(tasks) != 1 or parts - {"arithmetic", "hard_tail", "chain", "code", "digits3", "smoke"} or \
      ("digits3" in parts and tasks & {"chain", "code"}):
    raise ValueError(f"configs/claims.py: unknown variant {arg!r}; expected 'arithmetic' (the default) or "
                     f"'hard_tail', optionally ',digits3' and ',smoke', or 'chain' or 'code', optionally ',smoke'")
  task = tasks.pop()
  smoke = "smoke" in parts
  c = _arithmetic_demo_config()  # the demo's tiny model, task, teacher (slip 0.7) and 1000-step warm start
  c.mesh.cpu_compile = "fast_code"  # as every study run so far compiled (the demo's is 'fast_start'): resumes match
  c.sampler.max_prefill_batch = 0  # every prefill as wide as the free slots take, as every study run so far
  c.model.update(logprob_chunk_tokens=512, logprob_tail_levels=3)  # the vocabulary's chunks as every study run so far
  base = c.task
  base.teacher_slip_rate = SLIP_RATE
  if task == "chain":  # the chain task, held out as 'arithmetic': 128 validation, 256 test
    base = ConfigDict(dict(name="oapl_jax.tasks.chain_task:from_config", num_terms=CHAIN_TERMS,
                           num_digits=CHAIN_DIGITS, num_train=CHAIN_TRAIN, num_held_out=384, seed=0,
                           teacher_slip_rate=CHAIN_SLIP_RATE))
    c.task = ConfigDict(dict(name="experiments.split_task:from_config", base=base, num_val=128, num_test=256))
  elif task == "code":  # programs run in the sandbox, held out as 'arithmetic': 128 validation, 256 test
    base = ConfigDict(dict(name="code_synthetic", num_digits=CODE_DIGITS, num_train=CODE_TRAIN, num_held_out=384,
                           held_out_fraction=0.25, teacher_slip_rate=CODE_SLIP_RATE, teacher_copies=CODE_COPIES,
                           reward_workers=2, reward_timeout_s=2.0, reward_cache=CODE_REWARD_CACHE, seed=0))
    c.task = ConfigDict(dict(name="experiments.split_task:from_config", base=base, num_val=128, num_test=256))
  elif task == "arithmetic":  # held-out: 128 validation (chosen on), 256 test (reported)
    base.num_held_out = 384
    c.task = ConfigDict(dict(name="experiments.split_task:from_config", base=base, num_val=128, num_test=256))
  else:  # per half: 64 validation, 64 test (pass@k to k = 256 at the end)
    base.num_held_out = 640
    c.task = ConfigDict(dict(name="experiments.hard_tail_task:from_config", base=base, hard_slip_rate=1.0,
                             num_val=64, num_test=64))
  c.trainer.loss_settings.oapl.update(beta1=1.0, beta2=0.5)
  c.sampler.update(num_slots=64, max_new_tokens=6, temperature=1.0, top_p=1.0)
  c.loop.update(batch_prompts=BATCH_PROMPTS, prompts_per_rollout=BATCH_PROMPTS, group_size=8, steps_per_rollout=1,
                sync_every=LAG, num_syncs=STEPS // LAG, sampler_delay_windows=0,
                eval_every_syncs=1_000_000)  # the snapshot eval only at step 0; the policy eval is the curve
  c.eval.update(num_prompts=1_000_000, samples=4, ks=(1, 4), temperature=0.6, top_p=0.95, max_new_tokens=6,
                every_steps=EVAL_EVERY_STEPS)
  c.checkpoint.update(every_syncs=1, max_to_keep=1)  # the plan sets every_syncs to one save per 50 steps
  c.monitors.no_signal_steps = 1_000_000  # all-equal groups are common on a hard half; not an alarm here
  if "digits3" in parts:  # 3-digit addition: off the ceiling (GRPO's pilot 0.41 -> 0.69 at step 150, 0.79 at 300)
    c.task.base.update(num_digits=3, teacher_slip_rate=DIGITS3_SLIP_RATE)
    c.warmstart.steps = DIGITS3_WARMSTART_STEPS  # 1000 steps left pass@1 at 0.04 and GRPO flat for 180 steps
    c.sampler.update(max_prefill_length=10, max_new_tokens=7)
    c.eval.max_new_tokens = 7
  if task == "chain":  # answers of up to chain_task.max_completion_len tokens, prompts of bos + "a+b+c="
    longest = chain_task.max_completion_len(CHAIN_TERMS, CHAIN_DIGITS)
    c.sampler.update(max_prefill_length=1 + CHAIN_TERMS * (CHAIN_DIGITS + 1), max_new_tokens=longest)
    c.eval.max_new_tokens = longest
    c.warmstart.steps = CHAIN_WARMSTART_STEPS
  if task == "code":  # bos + "f(x)=99x+99\n", then "```\ndef f(x): return 99*x+99\n```" + eos
    c.model.overrides.vocab_size = code_task.CodeCharTokenizer.vocab_size
    c.sampler.update(max_prefill_length=13, max_new_tokens=33)
    c.eval.max_new_tokens = 33
  if smoke:  # CI: seconds per run; S = 4 steps, lag 2
    c.warmstart.update(steps=5, batch_size=32)
    c.sampler.update(grow_cache=False, num_slots=32)  # one decode compile instead of one per cache length
    c.eval.grow_cache = False
    c.task.base.update(num_train=64, num_held_out=48 if task == "arithmetic" else 96)
    c.task.update(num_val=8, num_test=8)
    c.loop.update(batch_prompts=4, prompts_per_rollout=4, sync_every=2, num_syncs=2)
    c.eval.every_steps = 2
  return c
