"""Evaluation: the unbiased pass@k estimator (Chen et al. 2021, arXiv 2107.03374) and eval runs."""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from oapl_jax import generations, sections
from oapl_jax.sampler import api
from oapl_jax.sampler.settings import SamplingFields, SamplingSettings

SEED_OFFSET = 7919  # an eval's sampling seed is the run's seed + this (apart from the rollouts' draws)


@dataclasses.dataclass(frozen=True)
class EvalConfig(SamplingFields):
  """The `eval` section: pass@k on the task's eval sets at these sampling settings (sampler/settings.SamplingFields;
  the paper's eval differs in T 0.6 and top-p 0.95)."""
  temperature: float = sections.rule(0.6, low=0)
  top_p: float = sections.rule(0.95, low=0, high=1, low_open=True)
  num_prompts: int = sections.rule(1_000_000, low=1)  # the first this many prompts of each eval set
  samples: int = sections.rule(10, low=1)  # samples per prompt
  ks: tuple[int, ...] = sections.rule((1, 5, 10), low=1, nonempty=True)  # pass@k for each k
  # N > 0: also score the trainer's current policy every N trainer steps, whatever the lag (rl/policy_eval.py)
  every_steps: int = sections.rule(0, low=0)
  # N: keep on disk the generations of the first N prompts of each set (all their samples) and of each window's
  # rollouts (oapl_jax/generations.py; 0: none)
  save_prompts: int = sections.rule(8, low=0)

  def __post_init__(self):
    super().__post_init__()
    if max(self.ks) > self.samples:
      raise ValueError(f"eval.ks={self.ks}: pass@k needs k <= eval.samples={self.samples}")

  def probe_sampling(self, stop_tokens=()) -> SamplingSettings:
    """The entropy probe's: the policy itself, T = 1, top-p 1, no top-k, the eval's length budget."""
    return self.sampling(stop_tokens, temperature=1.0, top_p=1.0, top_k=0)


def _pass_at_k_P(n: int, c_P: np.ndarray, k: int) -> np.ndarray:
  """1 - C(n-c, k) / C(n, k) per prompt, as 1 - prod_{i=n-c+1}^{n} (1 - k/i)."""
  c_P = np.asarray(c_P)
  if not np.issubdtype(c_P.dtype, np.integer):
    if not np.all(c_P == np.round(c_P)):
      raise ValueError(f"correct counts must be integers, got {c_P}")
    c_P = c_P.astype(np.int64)
  if n < 1:
    raise ValueError(f"n must be >= 1, got {n}")
  if not 1 <= k <= n:
    raise ValueError(f"k must be in [1, n={n}], got {k}")
  if c_P.size and (c_P.min() < 0 or c_P.max() > n):
    raise ValueError(f"correct counts must be in [0, n={n}], got min {c_P.min()} max {c_P.max()}")
  i_N = np.arange(1, n + 1, dtype=np.float64)
  # Factor (1 - k/i) for i > n - c, else 1; shape [P, n].
  in_range_PxN = i_N[None, :] > (n - c_P)[:, None]
  factors_PxN = np.where(in_range_PxN, 1.0 - k / i_N[None, :], 1.0)
  return np.where(n - c_P < k, 1.0, 1.0 - np.prod(factors_PxN, axis=-1))


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples of which c are correct."""
  return float(_pass_at_k_P(n, np.array([c]), k)[0])


def pass_at_k_mean(correct_counts_P: Sequence[int] | np.ndarray, n: int,
                   ks: Sequence[int]) -> dict[str, float]:
  """pass@k averaged over prompts, for each k in ks: {"pass@k": value}."""
  c_P = np.asarray(correct_counts_P).reshape(-1)
  if c_P.size == 0:
    raise ValueError("correct_counts_P is empty")
  return {f"pass@{k}": float(np.mean(_pass_at_k_P(n, c_P, k))) for k in ks}


def evaluate_sets(sampler, params, task, eval_sets: Mapping[str, Sequence], config: EvalConfig,
                  settings: SamplingSettings, seed: int) -> tuple[dict[str, dict[str, float]], dict[str, list[dict]]]:
  """`evaluate_saved` on the first config.num_prompts of each named set: ({set name: metrics}, {set name: the
  generations of its first config.save_prompts prompts})."""
  out = {name: evaluate_saved(sampler, params, task, problems[:config.num_prompts], samples=config.samples,
                              ks=config.ks, settings=settings, seed=seed, save_prompts=config.save_prompts)
         for name, problems in eval_sets.items()}
  return {name: metrics for name, (metrics, _) in out.items()}, {name: saved for name, (_, saved) in out.items()}


def evaluate(sampler, params, task, problems: Sequence, *, samples: int, ks: Sequence[int],
             settings: SamplingSettings, seed: int) -> dict[str, float]:
  """pass@k over `problems` with `samples` draws each at the eval sampling `settings`.

  Also the mean response length, the mean sequence entropy estimate E[-log p(y|x)] (from the
  sampler's own log-probs of what it drew) and the fraction cut off at max_new_tokens.
  """
  return evaluate_saved(sampler, params, task, problems, samples=samples, ks=ks, settings=settings, seed=seed)[0]


def evaluate_saved(sampler, params, task, problems: Sequence, *, samples: int, ks: Sequence[int],
                   settings: SamplingSettings, seed: int, save_prompts: int = 0) -> tuple[dict[str, float], list[dict]]:
  """`evaluate`'s metrics and the generations of the first `save_prompts` problems (generations.records)."""
  groups = sampler.generate([p.prompt_tokens for p in problems], samples, settings, seed=seed, params=params)
  rewards_PxG, result = task.score_groups(problems, groups.response_tokens, groups.lengths)
  correct_P = (rewards_PxG > 0.5).sum(axis=-1)
  metrics = pass_at_k_mean(correct_P, samples, [k for k in ks if k <= samples])
  metrics.update({
      "reward_mean": float(rewards_PxG.mean()),
      "response_length": float(groups.lengths.mean()),
      "sequence_entropy": float(-groups.sequence_logp.mean()),
      "truncated_fraction": float((groups.finish_reason == api.FINISH_LENGTH).mean()),
      "reward_failures": float(result.num_failed + result.num_timeout),
  })
  return metrics, generations.records(task, problems, groups, rewards_PxG, save_prompts)
