"""Batch driver: prompts -> G completions each, with the sampler's own per-token log-probs.

    settings = SamplingSettings(max_new_tokens=512, temperature=1.0, stop_tokens=(eos_id,))
    groups = sampler.generate(prompts, 8, settings, seed=step)      # core.Sampler.generate runs run_groups
    groups.response_tokens  # [P, G, 512], groups.sampler_logp, groups.snapshot_version, ...

Continuous batching over the sampler's slots (`GroupBatcher`): whenever slots finish, they are
refilled at once with the next pending (prompt, sample) pairs (prompts are prefilled once, in length
buckets of at most `max_prefill_batch` prompts a call, and shared by their G samples). The device runs
`steps_per_sync` decode steps per host visit; the host reads only the done flags, plus the rows of
slots that just finished. Without stop tokens no slot can finish before its budget runs out, so a
visit lasts until the first one does.

With `grow_cache` the KV cache grows with the batch (`buckets.cache_bucket`): before each visit the
host bounds every slot's position from what it has run, so a young batch attends over a short
cache instead of the full prompt + response length. The price is one decode compile per cache
length (two per doubling); `grow_cache=False` compiles once, at the full length.

Sample g of prompt p draws its uniforms from the key (seed, prompt_ids[p], g) (see core), so results
do not depend on slot assignment, on the number of slots, or on what else is in the batch.
"""
import collections
import time
from typing import Optional, Sequence

import numpy as np

from oapl_jax.sampler import api, buckets
from oapl_jax.sampler.api import RolloutGroups
from oapl_jax.sampler.settings import SamplingSettings


def generate_groups(engine_or_sampler, params, prompts: Sequence[Sequence[int]], group_size: int,
                    settings: SamplingSettings, *, seed: int, prompt_ids: Optional[Sequence[int]] = None) -> RolloutGroups:
  """`sampler.generate(...)` of any api.GroupSampler, or of a JetStream engine's sampler (params None: the
  sampler's current snapshot)."""
  sampler = engine_or_sampler if isinstance(engine_or_sampler, api.GroupSampler) else \
      getattr(engine_or_sampler, "sampler", None)
  if not isinstance(sampler, api.GroupSampler):
    raise TypeError(f"expected a sampler (sampler/api.GroupSampler) or an engine with a .sampler, got "
                    f"{type(engine_or_sampler)}")
  return sampler.generate(prompts, group_size, settings, seed=seed, prompt_ids=prompt_ids, params=params)


def run_groups(sampler, params, prompts: Sequence[Sequence[int]], group_size: int, settings: SamplingSettings, *,
               seed: int, prompt_ids: Optional[Sequence[int]] = None) -> RolloutGroups:
  """core.Sampler.generate: `group_size` responses per prompt with continuous batching over the sampler's slots.

  params: the snapshot to sample with (None: `sampler.params`; other params, in the trainer's layout or the
  sampler's, are run through `sampler.prepare` and reported with snapshot_version -1).
  prompt_ids: stable ids used for the random keys (default 0..P-1), so a prompt's samples do not
  depend on its position in this call.
  """
  start = time.perf_counter()
  if params is None:
    params = sampler.params
  if params is None:
    raise ValueError("no params: give a snapshot, or call sampler.refresh(...) / sampler.load(...) first")
  api.check_request(prompts, group_size, settings, vocab_size=sampler.vocab_size,
                    max_prefill_length=sampler.max_prefill_length)
  snapshot_version = sampler.snapshot_version if params is sampler.params else -1
  prompts = [[int(t) for t in p] for p in prompts]
  prompt_ids = list(range(len(prompts))) if prompt_ids is None else [int(i) for i in prompt_ids]
  if len(prompt_ids) != len(prompts):
    raise ValueError(f"prompt_ids has {len(prompt_ids)} entries for {len(prompts)} prompts")
  out = RolloutGroups.empty(prompts, group_size, settings, snapshot_version=snapshot_version, seed=seed)
  GroupBatcher(sampler, sampler.prepare(params), prompts, prompt_ids, out).run()
  out.num_tokens = int(out.lengths.sum())
  out.wall_seconds = time.perf_counter() - start
  return out


class GroupBatcher:
  """The continuous-batching driver of one `generate_groups` call; fills `out` as samples finish.

  Host-side state: which (prompt, sample) each slot runs, an upper bound on each occupied slot's
  position and on its steps to go, and the prefixes of prompts whose samples are not all placed.
  """

  def __init__(self, sampler, params, prompts: list[list[int]], prompt_ids: list[int],
               out: RolloutGroups):
    self.sampler, self.params, self.prompts, self.prompt_ids, self.out = sampler, params, prompts, prompt_ids, out
    self.settings = settings = out.settings
    P, self.G = out.response_tokens.shape[:2]
    S = sampler.num_slots
    longest = max(len(p) for p in prompts)
    longest_bucket = buckets.prefill_bucket(longest, sampler.max_prefill_length)
    self.max_len = longest_bucket + settings.max_new_tokens
    # The first cache already holds every prompt bucket (inserts never need a grow) and a first visit.
    first_reach = max(longest_bucket, longest - 1 + settings.steps_per_sync)
    cache_len = buckets.cache_bucket(first_reach, self.max_len) if settings.grow_cache else self.max_len
    self.state = sampler.init_decode_state(settings, max_len=self.max_len, cache_len=cache_len)
    self.stop_set = set(settings.stop_tokens)
    self.pending = collections.deque((p, g) for p in range(P) for g in range(self.G))
    self.prefixes = {}  # prompt index -> (Prefix, row); dropped once the prompt's last sample is placed
    self.occupant = [None] * S  # slot -> (p, g)
    self.last_position = [0] * S  # an upper bound on each occupied slot's position so far
    self.budget = [0] * S  # an upper bound on each occupied slot's steps to go

  def run(self) -> None:
    while self.pending or any(o is not None for o in self.occupant):
      self.sampler.check_interrupt()
      free = [s for s, o in enumerate(self.occupant) if o is None]
      if free and self.pending:
        self._start([self.pending.popleft() for _ in range(min(len(free), len(self.pending)))], free)
      self._visit()
      self._collect()

  def _start(self, batch: list[tuple[int, int]], free: list[int]) -> None:
    """Prefill the prompts `batch` needs (bucketed by length) and insert its samples into `free`."""
    sampler, prompts = self.sampler, self.prompts
    by_bucket = collections.defaultdict(list)
    for p in sorted({p for p, _ in batch if p not in self.prefixes}):
      by_bucket[buckets.prefill_bucket(len(prompts[p]), sampler.max_prefill_length)].append(p)
    for ps in (chunk for bucket in by_bucket.values() for chunk in buckets.prefill_chunks(bucket,
                                                                                            sampler.max_prefill_batch)):
      prefix = sampler.prefill(self.params, [prompts[p] for p in ps])
      self.out.num_prefill_calls += 1
      for row, p in enumerate(ps):
        self.prefixes[p] = (prefix, row)
    by_prefix = collections.defaultdict(list)  # id(prefix) -> [(prefix, slot, row, p, g)]
    for slot, (p, g) in zip(free, batch):
      prefix, row = self.prefixes[p]
      by_prefix[id(prefix)].append((prefix, slot, row, p, g))
    for items in by_prefix.values():
      prefix, slots, rows, ps, gs = items[0][0], *list(zip(*items))[1:]
      keys = sampler.slot_keys(self.out.seed, [self.prompt_ids[p] for p in ps], gs)
      self.state = sampler.insert(prefix, self.state, slots, rows, keys)
    for slot, (p, g) in zip(free, batch):
      self.occupant[slot] = (p, g)
      self.last_position[slot], self.budget[slot] = len(prompts[p]) - 1, self.settings.max_new_tokens
      if g == self.G - 1:
        self.prefixes.pop(p, None)

  def _visit(self) -> None:
    """One host visit: grow the cache if this visit could pass its end, then decode on device."""
    live = [s for s, o in enumerate(self.occupant) if o is not None]
    last = max(self.last_position[s] for s in live)
    # A visit of n steps writes positions up to last + n - 1 (the first step rewrites the last prompt token).
    if self.settings.grow_cache:
      self.state = self.sampler.grow_cache(self.state, buckets.cache_bucket(last + self.settings.steps_per_sync,
                                                                         self.max_len))
    steps = self.settings.steps_per_sync
    if not self.stop_set:
      steps = max(steps, min(min(self.budget[s] for s in live), self.sampler.cache_length(self.state) - last))
    self.state = self.sampler.decode(self.params, self.state, steps)
    for s in live:
      self.last_position[s] += steps
      self.budget[s] -= steps
    self.out.num_decode_calls += 1

  def _collect(self) -> None:
    """Copy out the samples whose slots are done (the one host sync per visit) and free the slots."""
    done = np.asarray(self.state.done_S)
    finished = [s for s, o in enumerate(self.occupant) if o is not None and done[s]]
    if not finished:
      return
    tokens, logp, n = self.sampler.gather(self.state, finished)
    out = self.out
    for i, s in enumerate(finished):
      (p, g), self.occupant[s] = self.occupant[s], None
      k = int(n[i])
      out.response_tokens[p, g, :k] = tokens[i, :k]
      out.sampler_logp[p, g, :k] = logp[i, :k]
      out.response_mask[p, g, :k] = True
      out.lengths[p, g] = k
      stopped = k > 0 and int(tokens[i, k - 1]) in self.stop_set
      out.finish_reason[p, g] = api.FINISH_STOP if stopped else api.FINISH_LENGTH
