"""A synthetic task whose answers need a chain of steps: a running sum written out step by step.

  prompt      "37+58+12="
  completion  "37+58=95;95+12=107;#107<eos>"      (one "a+b=c;" per term after the first)

Only the final answer counts: the reward is 1 iff the text after the last '#' is the sum and the
completion ended with eos (the steps are the model's scratchpad, not graded). With 7 two-digit terms
a completion is 54-70 tokens, so response length, entropy and pass@k at large k matter.

Warm start: an imperfect teacher that, on `teacher_slip_rate` of its demonstrations, slips once by
+1 at a random step and carries the wrong running total on (a self-consistent chain, wrong answer).
Which split a problem belongs to is fixed by a hash of its terms (not the seed), so train and held-out
never overlap; the seed only picks which problems of a split are drawn.

  task.name = "oapl_jax.tasks.chain_task:from_config"
  task fields: num_terms, num_digits (default 2), num_train, num_held_out, seed, teacher_slip_rate
"""
from __future__ import annotations

import hashlib
from typing import Any, Mapping, Optional, Sequence

import dataclasses

import numpy as np

from oapl_jax import sections
from oapl_jax.tasks import base, char_tokenizer, rewards, synthetic_draw
from oapl_jax.tasks.char_tokenizer import EOS

CHARS = "0123456789+=;#"
SPLITS = synthetic_draw.SPLITS


class CharTokenizer(char_tokenizer.CharTokenizer):
  """<pad>=0, <bos>=1, <eos>=2, then one id per character of CHARS; padded to 32 ids."""
  chars, vocab_size, name = CHARS, 32, "chain"


def is_held_out(terms: Sequence[int], held_out_fraction: float) -> bool:
  digest = hashlib.blake2b("+".join(map(str, terms)).encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") < held_out_fraction * 2**64


def solution(terms: Sequence[int], slip_step: Optional[int] = None) -> str:
  """The worked chain "t0+t1=s1;s1+t2=s2;...#total". slip_step i (0-based) adds 1 to that step's
  result, and every later step carries the wrong total on."""
  if len(terms) < 2:
    raise ValueError(f"a chain needs at least 2 terms, got {list(terms)}")
  if slip_step is not None and not 0 <= slip_step < len(terms) - 1:
    raise ValueError(f"slip_step must be in [0, {len(terms) - 1}), got {slip_step}")
  total, steps = terms[0], []
  for i, term in enumerate(terms[1:]):
    new = total + term + (1 if i == slip_step else 0)
    steps.append(f"{total}+{term}={new};")
    total = new
  return "".join(steps) + f"#{total}"


def max_completion_len(num_terms: int, num_digits: int) -> int:
  """Longest completion in tokens, eos included (all terms at 10**d - 1, plus a slip's +1)."""
  return len(solution([10**num_digits - 1] * num_terms, slip_step=0)) + 1


def make_problems(num: int, split: str = "train", *, seed: int = 0, num_terms: int = 7, num_digits: int = 2,
                  held_out_fraction: float = 0.1, tokenizer: CharTokenizer | None = None) -> list[base.Problem]:
  """`num` distinct problems of `split`, deterministic given the arguments."""
  synthetic_draw.check_split(split)
  if num_terms < 2 or num_digits < 1:
    raise ValueError(f"num_terms must be >= 2 and num_digits >= 1, got {num_terms} and {num_digits}")
  tokenizer = tokenizer or CharTokenizer()
  draw = lambda rng: tuple(int(x) for x in rng.integers(10**num_digits, size=num_terms))  # noqa: E731
  problems = []
  for terms in synthetic_draw.draw_distinct(
      num, split, seed, draw, lambda terms: is_held_out(terms, held_out_fraction),
      f"num_terms={num_terms}, num_digits={num_digits}, held_out_fraction={held_out_fraction}"):
    prompt = "+".join(map(str, terms)) + "="
    problems.append(base.Problem(prompt=prompt, answer=str(sum(terms)),
                                 prompt_tokens=(tokenizer.bos_id, *tokenizer.encode(prompt))))
  return problems


def terms_of(problem: base.Problem) -> list[int]:
  return [int(t) for t in problem.prompt.rstrip("=").split("+")]


def sft_examples(problems: Sequence[base.Problem], tokenizer: CharTokenizer | None = None, *,
                 slip_rate: float = 0.0, seed: int = 0) -> list[base.Demonstration]:
  """Worked chains + eos; `slip_rate` of them slip once, at a step drawn uniformly."""
  tokenizer = tokenizer or CharTokenizer()
  rng = np.random.default_rng(seed)
  slips, where = rng.random(len(problems)) < slip_rate, rng.random(len(problems))
  out = []
  for problem, slip, u in zip(problems, slips, where):
    terms = terms_of(problem)
    text = solution(terms, int(u * (len(terms) - 1)) if slip else None)
    out.append(base.Demonstration(problem.prompt_tokens, (*tokenizer.encode(text), tokenizer.eos_id)))
  return out


def final_answer(completion: str) -> Optional[str]:
  """What follows the last '#' of a completion that ended with eos; None if it did not end or has no '#'."""
  head, eos, _ = completion.partition(EOS)
  if not eos or "#" not in head:
    return None
  return head.rpartition("#")[2]


def score(completion: str, answer: str) -> float:
  """1.0 iff the final answer (after the last '#', before eos) is exactly `answer`."""
  return float(final_answer(completion) == answer)


def make_task(num_train: int = 4096, num_held_out: int = 256, *, seed: int = 0, num_terms: int = 7,
              num_digits: int = 2, held_out_fraction: float = 0.1, teacher_slip_rate: float = 0.0) -> base.Task:
  """Train problems, one eval set 'held_out', the final-answer reward, and warm-start demonstrations
  from a teacher that slips on `teacher_slip_rate` of them."""
  tokenizer = CharTokenizer()
  kw = dict(seed=seed, num_terms=num_terms, num_digits=num_digits, held_out_fraction=held_out_fraction,
            tokenizer=tokenizer)
  train, held_out = make_problems(num_train, "train", **kw), make_problems(num_held_out, "held_out", **kw)
  return base.Task(
      name="chain", tokenizer=tokenizer, train=train, eval_sets={"held_out": held_out},
      reward_fn=rewards.Guarded(rewards.ItemReward(score)),
      demonstrations=lambda demo_seed: sft_examples(train, tokenizer, slip_rate=teacher_slip_rate, seed=demo_seed))


@dataclasses.dataclass(frozen=True)
class ChainSettings(synthetic_draw.SyntheticSettings):
  """task.name='chain'."""
  name: str = "chain"  # task.name: this task
  num_terms: int = sections.rule(7, low=2)  # terms summed, one worked step each after the first
  num_digits: int = sections.rule(2, low=1)  # digits per term


def from_config(cfg: ChainSettings) -> base.Task:
  return make_task(cfg.num_train, cfg.num_held_out, seed=cfg.seed, num_terms=cfg.num_terms, num_digits=cfg.num_digits,
                   teacher_slip_rate=cfg.teacher_slip_rate)


from_config.settings = ChainSettings  # task.name='oapl_jax.tasks.chain_task:from_config' also gets typed settings
