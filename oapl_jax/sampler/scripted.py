"""A sampling backend that decodes nothing: the second implementation of sampler/api.GroupSampler.

    sampler = ScriptedSampler(vocab_size=64, max_prefill_length=16, max_new_tokens=8)
    sampler.refresh(trainer_params)                 # keeps a copy (the trainer donates its own)
    groups = sampler.generate(prompts, 4, settings, seed=3)

Response g of prompt p is a pure function of (seed, prompt id, g) and of the snapshot (a checksum of its
params), as api.GroupSampler asks and as a real sampler's are: a resume that restored the wrong snapshot writes
other responses, so a test of the loop's contract sees it. By default the responses are
uniform tokens over the vocabulary, 1..max_new_tokens of them, cut after the first stop token; its log-probs are
that uniform policy's own, exactly -log(V) per token, so OAPL's and GRPO's sums are those of a real (if
ignorant) sampler. A `script(prompt_tokens, prompt_id, sample, rng) -> token ids` replaces the draw (a test
that needs rewards writes answers). No compile and no decode: a loop test pays only for the trainer.
`sampler.backend = 'scripted'` picks it in a run config (tests only: it learns nothing).
"""
import hashlib
import math
import time
from typing import Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from oapl_jax.parallel import Layout
from oapl_jax.sampler import api
from oapl_jax.sampler.settings import SamplingSettings

Script = Callable[[list, int, int, np.random.Generator], Sequence[int]]


def fingerprint(params) -> int:
  """A checksum of a params tree: the float64 sum of each leaf's float32 values, hashed."""
  sums = np.array([np.asarray(x, np.float32).astype(np.float64).sum() for x in jax.tree.leaves(params)])
  return int.from_bytes(hashlib.sha256(sums.tobytes()).digest()[:8], "little")


class ScriptedSampler(api.GroupSampler):

  def __init__(self, vocab_size: int, *, layout: Optional[Layout] = None, max_prefill_length: int = 256,
               max_new_tokens: int = 256, snapshot_version: int = 0, script: Optional[Script] = None):
    if vocab_size < 1 or max_prefill_length < 1 or max_new_tokens < 1:
      raise ValueError(f"vocab_size={vocab_size}, max_prefill_length={max_prefill_length} and "
                       f"max_new_tokens={max_new_tokens} must all be >= 1")
    self._vocab_size = int(vocab_size)
    self.layout = layout or Layout.single_device()
    self.max_prefill_length, self.max_new_tokens = int(max_prefill_length), int(max_new_tokens)
    self.snapshot_version = int(snapshot_version)
    self.script = script or self._uniform
    self.params, self._fingerprint = None, 0
    self.last_refresh_seconds, self.last_refresh_bytes = float("nan"), 0
    self.calls = []  # (snapshot_version, seed, prompt ids) of every generate call: what a test checks

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  def prepare(self, trainer_params):
    return jax.tree.map(jnp.copy, nn.unbox(trainer_params))

  def refresh(self, trainer_params, *, version: Optional[int] = None):
    start = time.perf_counter()
    self.params = jax.block_until_ready(self.prepare(trainer_params))
    self._fingerprint = fingerprint(self.params)
    self.last_refresh_seconds = time.perf_counter() - start
    self.last_refresh_bytes = sum(x.nbytes for x in jax.tree.leaves(self.params))
    self.snapshot_version = self.snapshot_version + 1 if version is None else int(version)
    return self.params

  def _uniform(self, prompt_tokens, prompt_id: int, sample: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, self._vocab_size, size=int(rng.integers(1, self.max_new_tokens + 1)))

  def generate(self, prompts, group_size: int, settings: SamplingSettings, *, seed: int,
               prompt_ids: Optional[Sequence[int]] = None, params=None) -> api.RolloutGroups:
    start = time.perf_counter()
    if params is None and self.params is None:
      raise ValueError("no params: call sampler.refresh(...) first")
    api.check_request(prompts, group_size, settings, vocab_size=self._vocab_size,
                      max_prefill_length=self.max_prefill_length)
    prompt_ids = list(range(len(prompts))) if prompt_ids is None else [int(i) for i in prompt_ids]
    current = params is None or params is self.params
    version, snapshot = (self.snapshot_version, self._fingerprint) if current else (-1, fingerprint(params))
    out = api.RolloutGroups.empty(prompts, group_size, settings, snapshot_version=version, seed=seed)
    stops, N = set(settings.stop_tokens), settings.max_new_tokens
    for p, (prompt, pid) in enumerate(zip(prompts, prompt_ids)):
      self.check_interrupt()
      for g in range(group_size):
        tokens = [int(t) for t in self.script(list(prompt), pid, g, np.random.default_rng([seed, pid, g, snapshot]))][:N]
        if not tokens:
          raise ValueError(f"the script wrote no token for prompt id {pid}, sample {g}: a response has at least one")
        cut = next((i + 1 for i, t in enumerate(tokens) if t in stops), None)
        tokens = tokens[:cut] if cut else tokens
        k = len(tokens)
        out.response_tokens[p, g, :k] = tokens
        out.response_mask[p, g, :k] = True
        out.sampler_logp[p, g, :k] = -math.log(self._vocab_size)
        out.lengths[p, g] = k
        out.finish_reason[p, g] = api.FINISH_STOP if cut else api.FINISH_LENGTH
    self.calls.append((version, int(seed), tuple(prompt_ids)))
    out.num_tokens = int(out.lengths.sum())
    out.wall_seconds = time.perf_counter() - start
    return out

  def score(self, params, prompts, responses, temperature: float) -> list[np.ndarray]:
    if not responses or min(len(r) for r in responses) < 1 or temperature <= 0:
      raise ValueError("score needs responses of >= 1 token and a temperature > 0")
    return [np.full((len(r),), -math.log(self._vocab_size), np.float32) for r in responses]
