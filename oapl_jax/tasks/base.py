"""The task interface: problems, tokenizers, reward results, and the Task that ties them.

A reward function maps decoded completions and gold answers to a RewardResult:

    reward_fn(completions: list[str], answers: list[str]) -> RewardResult

Completions reach it through `Task.completion_text`, which cuts the sampled tokens at the
first eos (kept, so a task whose tokenizer renders it can insist that the model stopped).
"""
from __future__ import annotations

import dataclasses
import logging
import traceback
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

log = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class Problem:
  """One prompt: its text, its gold answer, and its tokens (already templated)."""
  prompt: str
  answer: str
  prompt_tokens: tuple[int, ...]


class Tokenizer(Protocol):
  vocab_size: int
  pad_id: int
  eos_id: int
  bos_id: int | None

  def encode(self, text: str) -> list[int]:
    ...

  def decode(self, ids: Sequence[int]) -> str:
    ...


@dataclasses.dataclass(frozen=True)
class RewardResult:
  """Per-completion rewards and how many items failed (raised) or timed out (scored 0)."""
  rewards: np.ndarray  # float32 [N]
  num_failed: int = 0
  num_timeout: int = 0


RewardFn = Callable[[list[str], list[str]], RewardResult]


@dataclasses.dataclass(frozen=True)
class Demonstration:
  """One supervised warm-start example: prompt tokens, then the completion to imitate (eos included)."""
  prompt_tokens: tuple[int, ...]
  completion_tokens: tuple[int, ...]


class RewardError(RuntimeError):
  """The task's reward fails on a probe response, before any compute."""


class _FirstError(logging.Handler):
  """Keeps the first logged failure (its traceback when one was logged)."""

  def __init__(self):
    super().__init__(logging.WARNING)
    self.first = None

  def emit(self, record):
    if self.first is None:
      text = record.getMessage()
      if record.exc_info:
        text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
      self.first = text


@dataclasses.dataclass(frozen=True)
class Task:
  """Everything the loop needs of a task, and nothing it must know about it: training prompts,
  named evaluation sets, the tokenizer, the reward, and optionally warm-start demonstrations."""
  name: str
  tokenizer: Tokenizer
  train: Sequence[Problem]
  eval_sets: Mapping[str, Sequence[Problem]]
  reward_fn: RewardFn
  demonstrations: Callable[[int], list[Demonstration]] | None = None  # seed -> examples; None: no warm start
  # (completion text, gold answer) -> what the reward read of it (e.g. the extracted answer), shown beside saved
  # generations (oapl_jax/generations.py); None: the task offers none
  reward_detail: Callable[[str, str], str] | None = None

  def completion_text(self, tokens: Sequence[int]) -> str:
    """Decodes sampled tokens (unpadded) up to and including the first eos."""
    ids = [int(t) for t in tokens]
    if self.tokenizer.eos_id in ids:
      ids = ids[: ids.index(self.tokenizer.eos_id) + 1]
    return self.tokenizer.decode(ids)

  def reward(self, completion_tokens: Sequence[Sequence[int]],
             problems: Sequence[Problem]) -> RewardResult:
    """Scores sampled completions of `problems` (same order, same length)."""
    texts = [self.completion_text(t) for t in completion_tokens]
    return self.reward_fn(texts, [p.answer for p in problems])

  def score_groups(self, problems: Sequence[Problem], response_tokens_PxGxN: np.ndarray,
                   lengths_PxG: np.ndarray) -> tuple[np.ndarray, RewardResult]:
    """Rewards [P, G] of G sampled responses per problem (one reward call for the whole batch)."""
    P, G = lengths_PxG.shape
    completions = [response_tokens_PxGxN[p, g, :lengths_PxG[p, g]] for p in range(P) for g in range(G)]
    result = self.reward(completions, [problems[p] for p in range(P) for _ in range(G)])
    return result.rewards.reshape(P, G), result

  def probe_reward(self) -> RewardResult:
    """Scores one response before any compute: a demonstration's completion (else the first problem's gold
    answer as the response) for the first training problem. A reward that fails on it raises RewardError
    once, with the first traceback, instead of failing every item of the run later; one that times out on it
    is reported in one warning line (a timeout scores 0 and is counted, in the run as here)."""
    problem = self.train[0]
    tokens = self.demonstrations(0)[0].completion_tokens if self.demonstrations is not None else \
        self.tokenizer.encode(problem.answer)
    catcher = _FirstError()
    logger = logging.getLogger("oapl_jax.tasks")
    logger.addHandler(catcher)
    propagate, logger.propagate = logger.propagate, False  # what the reward logs here, the probe reports once
    try:
      result = self.reward([tokens], [problem])
    finally:
      logger.removeHandler(catcher)
      logger.propagate = propagate
    where = f"(problem {problem.prompt!r}, response {self.completion_text(tokens)!r})"
    if result.num_failed:
      raise RewardError(f"task {self.name!r}: the reward failed on a probe before training {where}; fix it before "
                        f"training:\n{catcher.first or '(no traceback was logged)'}")
    if result.num_timeout:
      log.warning("task %r: the reward timed out on a probe before training %s (%s); in training every timeout "
                  "scores 0 and counts in rollout/reward_failures", self.name, where, catcher.first or "timed out")
    return result

  def close(self) -> None:
    """Release what the reward holds (worker processes, sandboxes)."""
    close = getattr(self.reward_fn, "close", None)
    if close is not None:
      close()
