"""The trainer's current policy, evaluated every `eval.every_steps` trainer steps whatever the lag L.

The loop's eval at window starts scores the sampler's fresh snapshot, so a run with L = 100 gets one
point per 100 steps. This scores the trainer's own params on a fixed step grid (0, N, 2N, ... and the
last step) through the same sampler code, with a temporary copy of the params laid out for decoding
(the sampler's lagged snapshot is untouched), at the run's eval seed: two runs with the same seed draw
the same eval samples whatever their loss or lag.

Entropy probe: the policy's own full-distribution entropy per response token, on one sample per eval
prompt drawn from the policy itself at T = 1, top-p 1 (the trainer's `entropy` metric is measured on
the sampler's responses, which at long lags come from a stale policy).

Keys: policy_eval/<set>/<metric> (pass@k, reward_mean, ... as evaluation.evaluate) and
policy_eval/<set>/token_entropy.
"""
from __future__ import annotations

import logging
from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from oapl_jax import reporting
from oapl_jax.models.api import CausalLM
from oapl_jax.rl.buffer import pack_groups
from oapl_jax.sampler import api
from oapl_jax.sampler.settings import SamplingSettings

PREFIX = "policy_eval/"


class PolicyEval:
  """probe(params) -> {'policy_eval/<set>/<metric>': value}; `due(step)` says where the grid falls."""

  def __init__(self, every_steps: int, evaluate: Callable[..., dict], sampler: api.GroupSampler, model: CausalLM,
               eval_sets: Mapping[str, Sequence], probe_settings: SamplingSettings, seed: int, seq_len: int):
    self.every_steps, self.evaluate, self.sampler, self.model = every_steps, evaluate, sampler, model
    self.eval_sets, self.probe_settings, self.seed, self.seq_len = eval_sets, probe_settings, seed, seq_len
    self._entropy_BxT = jax.jit(lambda params, tokens, targets, positions: model.token_logprobs(
        params, tokens, targets, positions, with_entropy=True)[1], compiler_options=sampler.layout.compiler_options)

  def due(self, step: int) -> bool:
    return step % self.every_steps == 0

  def __call__(self, params, step=None) -> dict[str, float]:
    """With a `step`, the eval's generations are saved as evals/<step>/policy_<set>.jsonl."""
    snapshot = self.sampler.prepare(params)  # a decode-layout copy on the sampler's devices
    out = {PREFIX + k[len("eval/"):]: v for k, v in self.evaluate(snapshot, step=step, prefix="policy_").items()}
    for name, problems in self.eval_sets.items():
      out[f"{PREFIX}{name}/token_entropy"] = self.token_entropy(params, snapshot, problems)
    return out

  def token_entropy(self, params, snapshot, problems: Sequence) -> float:
    """Mean over response tokens of H(pi(. | prefix)), on one T = 1 sample of each prompt from `snapshot`."""
    groups = self.sampler.generate([p.prompt_tokens for p in problems], 1, self.probe_settings, seed=self.seed,
                                   params=snapshot)
    packed = pack_groups(groups, np.zeros(groups.lengths.shape, np.float32), self.seq_len)
    flat = {k: packed[k][:, 0] for k in ("tokens", "targets", "positions", "response_mask")}
    entropy_PxT = np.asarray(self._entropy_BxT(params, flat["tokens"], flat["targets"], flat["positions"]))
    mask_PxT = flat["response_mask"]
    return float((entropy_PxT * mask_PxT).sum() / max(mask_PxT.sum(), 1.0))


def log(step: int, metrics: Mapping[str, float]) -> None:
  logging.info("policy eval at step %d: %s", step,
               {k[len(PREFIX):]: round(v, 4) for k, v in metrics.items() if "pass@1" in k or "entropy" in k})


def report(probe: PolicyEval, reporter: reporting.Reporter, step: int, params) -> None:
  """The trainer's current policy (`params`) on the eval sets, logged and reported at `step`."""
  metrics = probe(params, step)
  log(step, metrics)
  reporter.scalars(step, metrics)
