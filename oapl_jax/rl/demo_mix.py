"""Demonstrations in the buffer (loop.demo_fraction): in every rollout group whose prompt has demonstrations,
the last k = round(demo_fraction x G) samples are replaced by demonstrations of that prompt before the group is
scored, so each is rewarded by the task like any response and enters V*(x) and the regression with its group.

Their pi_sampler log-probs are the frozen snapshot's own (the sampler's `score` at the rollout temperature), as
the sampled responses' are: OAPL's regression target beta2 * log(pi / pi_sampler) stays anchored to the
snapshot that made the window's data. Which demonstration fills a slot is drawn from (seed, version, chunk),
so a resumed run mixes the same ones. The paper names this as future work (OAPL, §6).
"""
import dataclasses
from typing import Sequence

import numpy as np

from oapl_jax.sampler import api
from oapl_jax.sampler.api import RolloutGroups
from oapl_jax.tasks.base import Demonstration


@dataclasses.dataclass
class DemoMixer:
  per_group: int  # k: samples of each group that become demonstrations
  temperature: float  # the rollouts' sampling temperature (the sampler's log-probs are taken at it)
  by_prompt: dict  # prompt tokens (tuple) -> [completion tokens (tuple), ...]
  as_sft: bool = False  # loop.demo_use='sft': the chunk marks the slots (demo_slots [P,G]) for the trainer's NLL

  @classmethod
  def build(cls, demonstrations: Sequence[Demonstration], fraction: float, group_size: int, temperature: float,
            max_new_tokens: int, as_sft: bool = False) -> "DemoMixer":
    """Demonstrations longer than the rollouts' max_new_tokens are left out (they could not be a sample)."""
    by_prompt: dict = {}
    for d in demonstrations:
      if len(d.completion_tokens) <= max_new_tokens:
        by_prompt.setdefault(tuple(d.prompt_tokens), []).append(tuple(d.completion_tokens))
    if not by_prompt:
      raise ValueError(f"loop.demo_fraction={fraction}: no demonstration fits in sampler.max_new_tokens="
                       f"{max_new_tokens}")
    return cls(max(1, round(fraction * group_size)), temperature, by_prompt, as_sft)

  def mix(self, sampler: api.GroupSampler, groups: RolloutGroups, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Replaces samples of `groups` in place (tokens, mask, lengths, finish reason, sampler log-probs);
    returns the (prompt, sample) slots replaced."""
    P, G, N = groups.response_tokens.shape
    slots, prompts, demos = [], [], []
    for p in range(P):
      prompt = tuple(int(t) for t in groups.prompt_tokens[p, :groups.prompt_lengths[p]])
      choices = self.by_prompt.get(prompt)
      if choices:
        for g in range(G - self.per_group, G):
          slots.append((p, g))
          prompts.append(prompt)
          demos.append(choices[int(rng.integers(len(choices)))])
    if not slots:
      return slots
    logps = sampler.score(sampler.params, prompts, demos, self.temperature)
    for (p, g), demo, logp in zip(slots, demos, logps):
      n = len(demo)
      groups.response_tokens[p, g] = 0
      groups.response_tokens[p, g, :n] = demo
      groups.response_mask[p, g] = np.arange(N) < n
      groups.sampler_logp[p, g] = 0.0
      groups.sampler_logp[p, g, :n] = logp
      groups.lengths[p, g] = n
      groups.finish_reason[p, g] = api.FINISH_STOP
    return slots

  def chunk_fields(self, slots: list[tuple[int, int]], groups: RolloutGroups) -> dict[str, np.ndarray]:
    """What the buffer stores with the chunk beside its groups: demo_slots [P, G] (1.0 on the replaced
    slots) when the trainer takes the demonstrations by SFT, else nothing."""
    if not self.as_sft:
      return {}
    demo_slots_PxG = np.zeros(groups.lengths.shape, np.float32)
    for p, g in slots:
      demo_slots_PxG[p, g] = 1.0
    return {"demo_slots": demo_slots_PxG}
