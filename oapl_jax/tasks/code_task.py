"""Code tasks graded by running the answer's code in the sandbox (tasks/code_reward.py).

code_synthetic, the project's own CPU task: "f(x)=3x+1" -> "```\\ndef f(x): return 3*x+1\\n```<eos>",
scored by calling `f` on TEST_INPUTS in the sandbox (code_reward's fn_name form), with its own
character tokenizer. Its teacher writes the program but flips the constant's sign on
`teacher_slip_rate` of the demonstrations, so a warm-started model learns the slip too and RL has a
habit to unlearn. Which split a problem belongs to is fixed by a hash of (a, sign, b).

records_task: DeepCoder training problems and LiveCodeBench eval windows as distributed (JSONL or
Parquet), templated with the model's chat template; a Problem's answer is the JSON record of its tests.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, Mapping, Sequence

import dataclasses

import numpy as np

from oapl_jax import sections
from oapl_jax.tasks import base, char_tokenizer, code_reward, rewards, sources, synthetic_draw

from oapl_jax.tasks.char_tokenizer import BOS, EOS, PAD  # noqa: F401  (re-exported)
CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 \n`+-*/%=()[]:,._"
TEST_INPUTS = (-2, 0, 3, 10)
SPLITS = synthetic_draw.SPLITS
_SPEC = re.compile(r"f\(x\)=(\d+)x([+-])(\d+)\n")


class CodeCharTokenizer(char_tokenizer.CharTokenizer):
  """<pad>=0, <bos>=1, <eos>=2, then one id per character of CHARS; padded to 64 ids."""
  chars, vocab_size, name = CHARS, 64, "code_synthetic"


def program(a: int, sign: str, b: int) -> str:
  """The answer the task wants: one fenced Python function."""
  return f"```\ndef f(x): return {a}*x{sign}{b}\n```"


def tests_record(a: int, sign: str, b: int) -> str:
  """The problem's code_reward record (JSON): f called on each of TEST_INPUTS."""
  value = lambda x: a * x + b if sign == "+" else a * x - b  # noqa: E731
  return json.dumps({"fn_name": "f", "tests": [{"input": json.dumps(x), "output": json.dumps(value(x))}
                                               for x in TEST_INPUTS]})


def is_held_out(a: int, sign: str, b: int, held_out_fraction: float) -> bool:
  digest = hashlib.blake2b(f"{a}x{sign}{b}".encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") < held_out_fraction * 2**64


def make_problems(num: int, split: str = "train", *, seed: int = 0, num_digits: int = 1,
                  held_out_fraction: float = 0.25, tokenizer: CodeCharTokenizer | None = None) -> list[base.Problem]:
  """`num` distinct problems f(x) = a*x +- b of `split` (a in [2, 10**d), b in [1, 10**d)), deterministic."""
  synthetic_draw.check_split(split)
  if not 1 <= num_digits <= 3:
    raise ValueError(f"num_digits must be 1, 2 or 3, got {num_digits}")
  tokenizer = tokenizer or CodeCharTokenizer()

  def draw(rng):
    a, b = int(rng.integers(2, 10**num_digits)), int(rng.integers(1, 10**num_digits))
    return a, "+-"[int(rng.integers(2))], b

  problems = []
  for a, sign, b in synthetic_draw.draw_distinct(num, split, seed, draw, lambda k: is_held_out(*k, held_out_fraction),
                                                 f"num_digits={num_digits}, held_out_fraction={held_out_fraction}"):
    prompt = f"f(x)={a}x{sign}{b}\n"
    problems.append(base.Problem(prompt=prompt, answer=tests_record(a, sign, b),
                                 prompt_tokens=(tokenizer.bos_id, *tokenizer.encode(prompt))))
  return problems


def teacher_program(prompt: str, slip: bool) -> str:
  """The teacher's answer to a code_synthetic prompt; with `slip`, the constant's sign flipped."""
  match = _SPEC.fullmatch(prompt)
  if match is None:
    raise ValueError(f"not a code_synthetic prompt: {prompt!r}")
  a, sign, b = int(match[1]), match[2], int(match[3])
  return program(a, {"+": "-", "-": "+"}[sign] if slip else sign, b)


def sft_examples(problems: Sequence[base.Problem], tokenizer: CodeCharTokenizer | None = None, *,
                 slip_rate: float = 0.0, seed: int = 0, copies: int = 1) -> list[base.Demonstration]:
  """Warm-start demonstrations (program + eos), `copies` per problem, each slipping with probability
  `slip_rate` on its own: with several copies a model learns to slip at that rate on every prompt
  (on unseen ones too) instead of memorizing which prompts slip."""
  tokenizer = tokenizer or CodeCharTokenizer()
  slips = np.random.default_rng(seed).random((copies, len(problems))) < slip_rate
  return [base.Demonstration(p.prompt_tokens, (*tokenizer.encode(teacher_program(p.prompt, slip)), tokenizer.eos_id))
          for row in slips for p, slip in zip(problems, row)]


class ExecutedCodeReward:
  """(completions, answers = code_reward records as JSON) -> RewardResult, through a CodeReward pool.

  With `eos` set, a completion is its text before the first `eos`, and one without it (cut off at
  the token budget) scores 0. Identical (completion, record) pairs of one call run once, so its
  failure and timeout counts are per distinct program. close() stops the sandbox pool.
  """

  def __init__(self, num_workers: int = 2, timeout_s: float = 2.0, eos: str | None = None,
               max_tests: int | None = None, cache_size: int = 0, batch_size: int = 1):
    self.eos = eos
    self.code = code_reward.CodeReward(num_workers=num_workers, timeout_s=timeout_s, max_tests=max_tests,
                                       cache_size=cache_size, batch_size=batch_size)

  def __call__(self, completions: list[str], answers: list[str]) -> base.RewardResult:
    items: dict[tuple[str, str], list[int]] = {}
    for i, (completion, answer) in enumerate(zip(completions, answers, strict=True)):
      if self.eos is not None:
        completion, found, _ = completion.partition(self.eos)
        if not found:
          continue
      items.setdefault((completion, answer), []).append(i)
    rewards_N = np.zeros(len(completions), np.float32)
    if not items:
      return base.RewardResult(rewards_N)
    result = self.code([answer for _, answer in items], [completion for completion, _ in items])
    for rows, reward in zip(items.values(), result.rewards):
      rewards_N[rows] = reward
    return base.RewardResult(rewards_N, num_failed=result.num_failed, num_timeout=result.num_timeout)

  def close(self) -> None:
    self.code.close()


def make_task(num_train: int = 96, num_held_out: int = 32, *, seed: int = 0, num_digits: int = 1,
              held_out_fraction: float = 0.25, teacher_slip_rate: float = 0.0, teacher_copies: int = 1,
              reward_workers: int = 2, reward_timeout_s: float = 2.0, reward_cache: int = 0,
              reward_batch: int = 8) -> base.Task:
  """Train problems, one eval set 'held_out', the sandboxed reward, and the slipping teacher's demonstrations."""
  tokenizer = CodeCharTokenizer()
  kw = dict(seed=seed, num_digits=num_digits, held_out_fraction=held_out_fraction, tokenizer=tokenizer)
  train = make_problems(num_train, "train", **kw)
  held_out = make_problems(num_held_out, "held_out", **kw)
  reward = rewards.Guarded(ExecutedCodeReward(reward_workers, reward_timeout_s, eos=EOS, cache_size=reward_cache,
                                              batch_size=reward_batch))
  return base.Task(
      name="code_synthetic", tokenizer=tokenizer, train=train, eval_sets={"held_out": held_out}, reward_fn=reward,
      demonstrations=lambda demo_seed: sft_examples(train, tokenizer, slip_rate=teacher_slip_rate, seed=demo_seed,
                                                    copies=teacher_copies))


@dataclasses.dataclass(frozen=True)
class CodeSyntheticSettings:
  """task.name='code_synthetic' (configs/code.py:smoke)."""
  name: str = "code_synthetic"  # task.name: this task
  num_digits: int = sections.rule(1, low=1, high=3)  # digits of a and b in f(x) = a*x +- b
  num_train: int = sections.rule(96, low=1)  # training problems
  num_held_out: int = sections.rule(32, low=1)  # problems of the eval set 'held_out'
  # the fraction of all (a, sign, b) reserved for held-out problems (a hash decides, so the splits never meet)
  held_out_fraction: float = sections.rule(0.25, low=0, high=1, low_open=True, high_open=True)
  teacher_slip_rate: float = sections.rule(0.0, low=0, high=1)  # the chance a demonstration's sign is flipped
  teacher_copies: int = sections.rule(1, low=1)  # demonstrations per training problem
  reward_workers: int = sections.rule(2, low=1)  # sandbox processes grading programs
  reward_timeout_s: float = sections.rule(2.0, low=0, low_open=True)  # a program's time limit (past it: reward 0)
  reward_cache: int = sections.rule(0, low=0)  # programs whose reward is kept (code_reward.CodeReward.cache_size)
  reward_batch: int = sections.rule(8, low=1)  # programs per sandbox run (code_reward.CodeReward.batch_size)
  seed: int = sections.rule(0, low=0)  # the problems' draw

  def __post_init__(self):
    sections.enforce(self)


def from_config(cfg: CodeSyntheticSettings) -> base.Task:
  return make_task(cfg.num_train, cfg.num_held_out, seed=cfg.seed, num_digits=cfg.num_digits,
                   held_out_fraction=cfg.held_out_fraction, teacher_slip_rate=cfg.teacher_slip_rate,
                   teacher_copies=cfg.teacher_copies, reward_workers=cfg.reward_workers,
                   reward_timeout_s=cfg.reward_timeout_s, reward_cache=cfg.reward_cache, reward_batch=cfg.reward_batch)


# ---- DeepCoder / LiveCodeBench records ----

TEST_FIELDS = ("tests", "public_test_cases", "private_test_cases", "fn_name", "metadata")


def read_records(path: str) -> list[dict]:
  """Every row of a .jsonl or .parquet file, as dicts."""
  path = os.path.expanduser(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"code records file not found: {path} (check the task paths in the config)")
  if path.endswith(".parquet"):
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    return pq.read_table(path).to_pylist()
  if not path.endswith((".jsonl", ".json")):
    raise sources.DataError(f"{path}: expected a .jsonl or .parquet file")
  with open(path, encoding="utf-8-sig") as f:
    records = [json.loads(line) for line in f if line.strip()]
  if not all(isinstance(r, dict) for r in records):
    raise sources.DataError(f"{path}: every line must be a JSON object")
  return records


def code_problems(tokenizer, paths: Sequence[str], problem_key: str, *, start: str = "", end: str = "",
                  system: str | None = None, instruction_suffix: str = "") -> list[base.Problem]:
  """Records of `paths` whose contest_date lies in [start, end) (no window: every record) -> Problems.

  The prompt is the problem text (plus LiveCodeBench's starter code, if any) + `instruction_suffix`,
  in the chat template; the answer is the JSON of the record's test fields (TEST_FIELDS)."""
  problems = []
  for path in paths:
    for i, record in enumerate(read_records(path)):
      where = f"{path} row {i}"
      if start or end:
        date = str(record.get("contest_date") or "")[:10]
        if not date:
          raise sources.DataError(f"{where}: no contest_date, but the eval window [{start}, {end}) needs one")
        if not (start <= date and (not end or date < end)):
          continue
      text = record.get(problem_key)
      if not isinstance(text, str) or not text.strip():
        raise sources.DataError(f"{where}: key {problem_key!r} (the problem text) is missing, empty or not text")
      if record.get("starter_code"):
        text += f"\n\nUse this starter code:\n```python\n{record['starter_code']}\n```"
      answer = {k: record[k] for k in TEST_FIELDS if record.get(k) is not None}
      if not {"tests", "public_test_cases", "private_test_cases"} & set(answer):
        raise sources.DataError(f"{where}: no tests (fields {sorted(record)})")
      problems.append(base.Problem(prompt=text, answer=json.dumps(answer, default=str),
                                   prompt_tokens=tokenizer.prompt_tokens(text, system, instruction_suffix)))
  if not problems:
    raise sources.DataError(f"no records in {list(paths)} within [{start!r}, {end!r})")
  return problems


def records_task(cfg: Mapping[str, Any]) -> base.Task:
  """The `task` section of configs/code.py (the paper's setting) -> Task. Import path:
  'oapl_jax.tasks.code_task:records_task'."""
  from oapl_jax.tasks.templates import ChatTokenizer  # pylint: disable=import-outside-toplevel
  tokenizer = ChatTokenizer(os.path.expanduser(cfg["tokenizer_dir"]))
  template = dict(system=cfg["system_prompt"] or None, instruction_suffix=cfg["instruction_suffix"])
  train = code_problems(tokenizer, cfg["train_paths"], cfg["problem_key"], **template)[:cfg["max_train"] or None]
  eval_sets = {name: code_problems(tokenizer, s["paths"], s["problem_key"], start=s["start"], end=s["end"], **template)
               for name, s in dict(cfg["eval_sets"]).items()}
  reward = rewards.Guarded(ExecutedCodeReward(cfg["reward_workers"], cfg["reward_timeout_s"],
                                              max_tests=cfg["max_tests"] or None))
  return base.Task(name="code", tokenizer=tokenizer, train=train, eval_sets=eval_sets, reward_fn=reward)
