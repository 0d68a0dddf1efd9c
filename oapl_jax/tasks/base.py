"""The task interface: problems, tokenizers, reward results, and the Task that ties them.

A reward function maps decoded completions and gold answers to a RewardResult:

    reward_fn(completions: list[str], answers: list[str]) -> RewardResult

Completions reach it through `Task.completion_text`, which cuts the sampled tokens at the
first eos (kept, so a task whose tokenizer renders it can insist that the model stopped).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, Sequence

import numpy as np


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
class Task:
  """A prompt source (train and held-out problems), its tokenizer and its reward."""
  name: str
  tokenizer: Tokenizer
  train: Sequence[Problem]
  held_out: Sequence[Problem]
  reward_fn: RewardFn

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
