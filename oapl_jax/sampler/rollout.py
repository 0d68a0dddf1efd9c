"""Batch driver: prompts -> G completions each, with the sampler's own per-token log-probs.

    groups = generate_groups(sampler, sampler.params, prompts, group_size=8, max_new_tokens=512,
                             seed=step, temperature=1.0, stop_tokens=[eos_id])
    groups.response_tokens  # [P, G, 512], groups.sampler_logp, groups.snapshot_version, ...

Continuous batching over the sampler's slots: whenever slots finish, they are refilled at once
with the next pending (prompt, sample) pairs (prompts are prefilled once, in length buckets, and
shared by their G samples). The device runs `steps_per_sync` decode steps per host visit; the host
reads only the done flags, plus the rows of slots that just finished. Without stop tokens no slot
can finish before its budget runs out, so a visit lasts until the first one does.

With `grow_cache` the KV cache grows with the batch (`core.cache_bucket`): before each visit the
host bounds every slot's position from what it has run, so a young batch attends over a short
cache instead of the full prompt + response length. The price is one decode compile per cache
length (two per doubling); `grow_cache=False` compiles once, at the full length.

Sample g of prompt p draws its uniforms from the key (seed, prompt_ids[p], g) (see core), so results
do not depend on slot assignment, on the number of slots, or on what else is in the batch.
"""
import collections
import dataclasses
import time
from typing import Optional, Sequence

import numpy as np

from oapl_jax.models import qwen
from oapl_jax.sampler import core


@dataclasses.dataclass
class RolloutGroups:
  """G sampled responses for each of P prompts (numpy arrays on host)."""

  prompt_tokens: np.ndarray  # [P, max prompt length] int32, right-padded with 0
  prompt_lengths: np.ndarray  # [P] int32
  response_tokens: np.ndarray  # [P, G, max_new_tokens] int32, 0 where masked
  response_mask: np.ndarray  # [P, G, max_new_tokens] bool; includes the stop token when one ended it
  sampler_logp: np.ndarray  # [P, G, max_new_tokens] float32, 0 where masked
  lengths: np.ndarray  # [P, G] int32, generated tokens (stop token included)
  finish_reason: np.ndarray  # [P, G] int8: core.FINISH_STOP or core.FINISH_LENGTH
  snapshot_version: int  # the sampler snapshot that produced every group (-1: unversioned params)
  seed: int
  temperature: float
  top_p: float
  top_k: int
  wall_seconds: float = 0.0  # whole call, prefill + decode + host work
  num_tokens: int = 0  # generated tokens, summed
  num_decode_calls: int = 0  # host visits to the device decode loop
  num_prefill_calls: int = 0

  @property
  def tokens_per_second(self) -> float:
    return self.num_tokens / self.wall_seconds if self.wall_seconds > 0 else float("nan")

  @property
  def finish_reason_names(self) -> np.ndarray:
    return np.asarray(core.FINISH_NAMES)[self.finish_reason]

  @property
  def sequence_logp(self) -> np.ndarray:
    """[P, G] log pi_sampler(y | x): the sum over response tokens."""
    return self.sampler_logp.sum(axis=-1)


def _sampler_of(engine_or_sampler) -> core.Sampler:
  if isinstance(engine_or_sampler, core.Sampler):
    return engine_or_sampler
  sampler = getattr(engine_or_sampler, "sampler", None)
  if not isinstance(sampler, core.Sampler):
    raise TypeError(f"expected a core.Sampler or an engine with a .sampler, got {type(engine_or_sampler)}")
  return sampler


def validate(sampler: core.Sampler, prompts, group_size: int, max_new_tokens: int, stop_tokens: Sequence[int]):
  """Request checks; the sampling settings are checked by `Sampler.init_decode_state`."""
  vocab = sampler.config.vocab_size
  if group_size < 1:
    raise ValueError(f"group_size must be >= 1, got {group_size}")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  if not len(prompts):
    raise ValueError("prompts is empty: nothing to generate")
  for i, p in enumerate(prompts):
    p = np.asarray(p)
    if p.ndim != 1 or p.size == 0:
      raise ValueError(f"prompt {i} is empty (or not a flat list of token ids): {p.tolist()}")
    if p.size > sampler.max_prefill_length:
      raise ValueError(f"prompt {i} has {p.size} tokens, more than max_prefill_length="
                       f"{sampler.max_prefill_length}")
    if not np.issubdtype(p.dtype, np.integer) or p.min() < 0 or p.max() >= vocab:
      bad = [t for t in p.tolist() if not (isinstance(t, (int, np.integer)) and 0 <= t < vocab)]
      raise ValueError(f"prompt {i} has token ids that are not integers in the vocabulary [0, {vocab}): {bad[:5]}")
  for t in stop_tokens:
    if not 0 <= int(t) < vocab:
      raise ValueError(f"stop token {t} is outside the vocabulary [0, {vocab})")


def generate_groups(engine_or_sampler, params, prompts: Sequence[Sequence[int]], group_size: int, *,
                    max_new_tokens: int, seed: int, temperature: float = 1.0, top_p: float = 1.0,
                    top_k: int = 0, stop_tokens: Sequence[int] = (),
                    prompt_ids: Optional[Sequence[int]] = None, steps_per_sync: int = 16,
                    grow_cache: bool = True) -> RolloutGroups:
  """Sample `group_size` responses per prompt with continuous batching over the sampler's slots.

  params: the snapshot to sample with (normally `sampler.params`; other params, in the trainer's
  layout or the sampler's, are run through `sampler.prepare` and reported with snapshot_version -1).
  prompt_ids: stable ids used for the random keys
  (default 0..P-1), so a prompt's samples do not depend on its position in this call.
  """
  start = time.perf_counter()
  sampler = _sampler_of(engine_or_sampler)
  if params is None:
    params = sampler.params
  if params is None:
    raise ValueError("no params: give a snapshot, or call sampler.refresh(...) / sampler.load(...) first")
  validate(sampler, prompts, group_size, max_new_tokens, stop_tokens)
  snapshot_version = sampler.snapshot_version if params is sampler.params else -1
  params = sampler.prepare(params)
  prompts = [[int(t) for t in p] for p in prompts]
  P, G, N, S = len(prompts), group_size, max_new_tokens, sampler.num_slots
  prompt_ids = list(range(P)) if prompt_ids is None else [int(i) for i in prompt_ids]
  if len(prompt_ids) != P:
    raise ValueError(f"prompt_ids has {len(prompt_ids)} entries for {P} prompts")

  longest = max(len(p) for p in prompts)
  longest_bucket = core.prefill_bucket(longest, sampler.max_prefill_length)
  max_len = longest_bucket + N
  # The first cache already holds every prompt bucket (inserts never need a grow) and a first visit.
  first_reach = max(longest_bucket, longest - 1 + steps_per_sync)
  cache_len = core.cache_bucket(first_reach, max_len) if grow_cache else max_len
  state = sampler.init_decode_state(max_len=max_len, cache_len=cache_len, max_new_tokens=N, temperature=temperature,
                                    top_p=top_p, top_k=top_k, stop_tokens=stop_tokens)
  out = RolloutGroups(
      prompt_tokens=np.zeros((P, longest), np.int32), prompt_lengths=np.array([len(p) for p in prompts], np.int32),
      response_tokens=np.zeros((P, G, N), np.int32), response_mask=np.zeros((P, G, N), bool),
      sampler_logp=np.zeros((P, G, N), np.float32), lengths=np.zeros((P, G), np.int32),
      finish_reason=np.zeros((P, G), np.int8),
      snapshot_version=snapshot_version,
      seed=int(seed), temperature=float(temperature), top_p=float(top_p), top_k=int(top_k))
  for i, p in enumerate(prompts):
    out.prompt_tokens[i, :len(p)] = p
  stop_set = set(int(t) for t in stop_tokens)

  pending = collections.deque((p, g) for p in range(P) for g in range(G))
  prefixes = {}  # prompt index -> (Prefix, row); dropped once the prompt's last sample is placed
  occupant = [None] * S  # slot -> (p, g)
  last_position = [0] * S  # an upper bound on each occupied slot's position so far
  budget = [0] * S  # an upper bound on each occupied slot's steps to go
  while pending or any(o is not None for o in occupant):
    free = [s for s in range(S) if occupant[s] is None]
    if free and pending:
      batch = [pending.popleft() for _ in range(min(len(free), len(pending)))]
      state = _start(sampler, params, state, prompts, prompt_ids, prefixes, batch, free, seed, G, out)
      for s, (p, g) in zip(free, batch):
        occupant[s] = (p, g)
        last_position[s], budget[s] = len(prompts[p]) - 1, N
    live = [s for s in range(S) if occupant[s] is not None]
    last = max(last_position[s] for s in live)
    # A visit of n steps writes positions up to last + n - 1 (the first step rewrites the last prompt token).
    if grow_cache:
      state = sampler.grow_cache(state, core.cache_bucket(last + steps_per_sync, max_len))
    steps = steps_per_sync
    if not stop_set:
      steps = max(steps, min(min(budget[s] for s in live), qwen.cache_length(state.cache) - last))
    state = sampler.decode(params, state, steps)
    for s in live:
      last_position[s] += steps
      budget[s] -= steps
    out.num_decode_calls += 1
    done = np.asarray(state.done_S)  # the one host sync per chunk
    finished = [s for s in range(S) if occupant[s] is not None and done[s]]
    if finished:
      tokens, logp, n = sampler.gather(state, finished)
      for i, s in enumerate(finished):
        p, g = occupant[s]
        occupant[s] = None
        k = int(n[i])
        out.response_tokens[p, g, :k] = tokens[i, :k]
        out.sampler_logp[p, g, :k] = logp[i, :k]
        out.response_mask[p, g, :k] = True
        out.lengths[p, g] = k
        stopped = k > 0 and int(tokens[i, k - 1]) in stop_set
        out.finish_reason[p, g] = core.FINISH_STOP if stopped else core.FINISH_LENGTH
  out.num_tokens = int(out.lengths.sum())
  out.wall_seconds = time.perf_counter() - start
  return out


def _start(sampler, params, state, prompts, prompt_ids, prefixes, batch, free, seed, G, out):
  """Prefill the prompts `batch` needs (bucketed by length) and insert its samples into `free`."""
  needed = sorted({p for p, _ in batch if p not in prefixes})
  by_bucket = collections.defaultdict(list)
  for p in needed:
    by_bucket[core.prefill_bucket(len(prompts[p]), sampler.max_prefill_length)].append(p)
  for ps in by_bucket.values():
    prefix = sampler.prefill(params, [prompts[p] for p in ps])
    out.num_prefill_calls += 1
    for row, p in enumerate(ps):
      prefixes[p] = (prefix, row)
  by_prefix = collections.defaultdict(list)  # id(prefix) -> [(slot, row, p, g)]
  for slot, (p, g) in zip(free, batch):
    prefix, row = prefixes[p]
    by_prefix[id(prefix)].append((prefix, slot, row, p, g))
  for items in by_prefix.values():
    prefix = items[0][0]
    _, slots, rows, ps, gs = zip(*items)
    keys = sampler.sample_keys(seed, [prompt_ids[p] for p in ps], gs)
    state = sampler.insert(prefix, state, slots, rows, keys)
  for p, g in batch:
    if g == G - 1:
      prefixes.pop(p, None)
  return state
