"""Synthetic verifiable arithmetic, the CPU default task: "37+58=" -> "95<eos>".

Operands are uniform in [0, 10**num_digits). Which split an operand triple belongs to is
fixed by a hash of the triple (not by the seed), so train and held-out never overlap; the
seed only picks which problems of a split are drawn.
"""
from __future__ import annotations

import hashlib
import operator
from typing import Sequence

import dataclasses

import numpy as np

from oapl_jax import sections
from oapl_jax.tasks import base, char_tokenizer, synthetic_draw
from oapl_jax.tasks import rewards

from oapl_jax.tasks.char_tokenizer import BOS, EOS, PAD  # noqa: F401  (re-exported)
CHARS = "0123456789+-*= "
OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
SPLITS = synthetic_draw.SPLITS


class CharTokenizer(char_tokenizer.CharTokenizer):
  """<pad>=0, <bos>=1, <eos>=2, then one id per character; padded to 32 ids."""
  chars, vocab_size, name = CHARS, 32, "arithmetic"


def is_held_out(a: int, op: str, b: int, held_out_fraction: float) -> bool:
  digest = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") < held_out_fraction * 2**64


def max_completion_len(num_digits: int, operations: Sequence[str]) -> int:
  """Longest gold completion in tokens, eos included."""
  hi = 10**num_digits - 1
  longest = max(len(str(OPERATIONS[op](x, y))) for op in operations
                for x, y in ((hi, hi), (0, hi)))
  return longest + 1


def make_problems(num: int, split: str = "train", *, seed: int = 0, num_digits: int = 2,
                  operations: Sequence[str] = ("+",), held_out_fraction: float = 0.1,
                  tokenizer: CharTokenizer | None = None) -> list[base.Problem]:
  """`num` distinct problems of `split`, deterministic given the arguments."""
  synthetic_draw.check_split(split)
  unknown = set(operations) - set(OPERATIONS)
  if unknown or not operations:
    raise ValueError(f"operations must be a non-empty subset of {list(OPERATIONS)}, "
                     f"got {list(operations)}")
  tokenizer = tokenizer or CharTokenizer()

  def draw(rng):
    op = operations[int(rng.integers(len(operations)))]
    a, b = (int(x) for x in rng.integers(10**num_digits, size=2))
    return a, op, b

  problems = []
  for a, op, b in synthetic_draw.draw_distinct(num, split, seed, draw, lambda k: is_held_out(*k, held_out_fraction),
                                               f"num_digits={num_digits}, held_out_fraction={held_out_fraction}"):
    prompt = f"{a}{op}{b}="
    problems.append(base.Problem(
        prompt=prompt, answer=str(OPERATIONS[op](a, b)),
        prompt_tokens=(tokenizer.bos_id, *tokenizer.encode(prompt))))
  return problems


def slipped(answer: str) -> str:
  """The demo's systematic slip: the last digit off by one (9 wraps to 0)."""
  return answer[:-1] + str((int(answer[-1]) + 1) % 10)


def sft_examples(problems: Sequence[base.Problem], tokenizer: CharTokenizer | None = None, *,
                 slip_rate: float = 0.0, seed: int = 0) -> list[base.Demonstration]:
  """Prompt tokens and completion tokens (answer + eos) for a supervised warm start.

  With `slip_rate` > 0, that fraction of the demonstrations carry `slipped` answers: the
  imperfect teacher the CPU demo warm-starts from, so RL has a habit to fix.
  """
  tokenizer = tokenizer or CharTokenizer()
  slips = np.random.default_rng(seed).random(len(problems)) < slip_rate
  return [base.Demonstration(p.prompt_tokens, (*tokenizer.encode(slipped(p.answer) if slip else p.answer),
                                       tokenizer.eos_id))
          for p, slip in zip(problems, slips)]


def score(completion: str, answer: str) -> float:
  """1.0 iff the completion is exactly the answer followed by eos."""
  head, eos, _ = completion.partition(EOS)
  return float(bool(eos) and head == answer)


def detail(completion: str, answer: str) -> str:
  """What `score` read: the answer before eos, or that the completion never stopped."""
  head, eos, _ = completion.partition(EOS)
  return f"answer {head!r}" if eos else f"no {EOS}: {head!r}"


def make_task(num_train: int = 2048, num_held_out: int = 256, *, seed: int = 0,
              num_digits: int = 2, operations: Sequence[str] = ("+",),
              held_out_fraction: float = 0.1, teacher_slip_rate: float = 0.0) -> base.Task:
  """Train problems, one eval set 'held_out', the exact-match reward, and warm-start
  demonstrations from a teacher that slips on `teacher_slip_rate` of them."""
  tokenizer = CharTokenizer()
  kw = dict(seed=seed, num_digits=num_digits, operations=tuple(operations),
            held_out_fraction=held_out_fraction, tokenizer=tokenizer)
  train = make_problems(num_train, "train", **kw)
  return base.Task(
      name="arithmetic", tokenizer=tokenizer, train=train,
      eval_sets={"held_out": make_problems(num_held_out, "held_out", **kw)},
      reward_fn=rewards.Guarded(rewards.ItemReward(score)), reward_detail=detail,
      demonstrations=lambda demo_seed: sft_examples(train, tokenizer, slip_rate=teacher_slip_rate, seed=demo_seed))


@dataclasses.dataclass(frozen=True)
class ArithmeticSettings(synthetic_draw.SyntheticSettings):
  """task.name='arithmetic' (a slipped demonstration's last digit is off by one)."""
  name: str = "arithmetic"  # task.name: this task
  num_digits: int = sections.rule(2, low=1)  # digits per operand
  operations: tuple[str, ...] = sections.rule(("+",), choices=tuple(OPERATIONS), nonempty=True)  # drawn per problem


def from_config(cfg: ArithmeticSettings) -> base.Task:
  return make_task(cfg.num_train, cfg.num_held_out, seed=cfg.seed, num_digits=cfg.num_digits,
                   operations=tuple(cfg.operations), teacher_slip_rate=cfg.teacher_slip_rate)
