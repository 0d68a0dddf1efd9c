"""Deterministic draws of distinct synthetic problems for a split (arithmetic, chain, code_synthetic)."""
import dataclasses
from typing import Callable, Hashable, TypeVar

import numpy as np

from oapl_jax import sections

SPLITS = ("train", "held_out")
Key = TypeVar("Key", bound=Hashable)


@dataclasses.dataclass(frozen=True)
class SyntheticSettings:
  """The fields every synthetic task's section has: split sizes, the draw's seed, and the warm-start
  teacher's slip rate (the fraction of demonstrations it gets wrong)."""
  num_train: int = sections.rule(4096, low=1)  # training problems
  num_held_out: int = sections.rule(256, low=1)  # problems of the eval set 'held_out' (none shared with train)
  seed: int = sections.rule(0, low=0)  # the problems' draw
  teacher_slip_rate: float = sections.rule(0.0, low=0, high=1)  # the fraction of demonstrations that are wrong

  def __post_init__(self):
    sections.enforce(self)


def check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def draw_distinct(num: int, split: str, seed: int, draw: Callable[[np.random.Generator], Key],
                  held_out: Callable[[Key], bool], settings: str) -> list[Key]:
  """`num` distinct keys `draw(rng)` whose `held_out(key)` matches `split`, in draw order; the rng is
  seeded by (seed, split). `settings` names the task's arguments in the error when too few exist."""
  rng = np.random.default_rng([seed, SPLITS.index(split)])
  seen, keys, draws = set(), [], 0
  while len(keys) < num:
    draws += 1
    if draws > 100 * num + 10_000:
      raise ValueError(f"could not draw {num} distinct {split} problems with {settings}")
    key = draw(rng)
    if key in seen or held_out(key) != (split == "held_out"):
      continue
    seen.add(key)
    keys.append(key)
  return keys
