"""The rollout buffer D of Algorithm 1: groups from ONE sampler snapshot, packed for the trainer.

Packed as objectives/batch_fields.FIELDS states the batch: every field it names, in its dtype; the optional ones
come beside a chunk (`add`'s fields, `annotate`).

The sampler thread `add`s rollout groups (tagged with their snapshot version); the trainer
`sample`s batches of B groups; every L steps the loop `reset`s it to the new version, dropping
everything. A group from any other version is refused, so V* is always estimated within one
sampling policy.

Determinism: groups arrive in chunks (one `add` per sampler call). Trainer step s of a window
draws only from the first `chunks_visible(s)` chunks and waits until they exist, so what a step
sees does not depend on how fast the sampler ran; within that set the least-used groups are
drawn first (ties broken by the step's rng).
"""
import threading
from typing import Optional

import numpy as np

from oapl_jax.objectives.batch_fields import FIELDS
from oapl_jax.sampler.api import RolloutGroups


def pack_sequences(prompts, responses, response_logps, seq_len: int) -> dict[str, np.ndarray]:
  """Prompt + response per sample -> right-padded next-token arrays [N, seq_len].

  tokens[t] is fed to the model, targets[t] = sequence[t + 1]; response_mask and
  sampler_token_logp are aligned with targets (response token j sits at t = prompt_len - 1 + j).
  `response_logps` may be None (demonstrations: zeros).
  """
  N = len(prompts)
  out = {k: np.zeros((N, seq_len), FIELDS[k].dtype)
         for k in ("tokens", "targets", "positions", "response_mask", "sampler_token_logp")}
  out["positions"][:] = np.arange(seq_len)
  for i, (prompt, response) in enumerate(zip(prompts, responses)):
    n_prompt, n_resp = len(prompt), len(response)
    seq = np.concatenate([np.asarray(prompt, np.int32), np.asarray(response, np.int32)])
    if len(seq) - 1 > seq_len:
      raise ValueError(f"prompt ({n_prompt}) + response ({n_resp}) tokens exceed the trainer's "
                       f"sequence length {seq_len} + 1")
    out["tokens"][i, :len(seq) - 1] = seq[:-1]
    out["targets"][i, :len(seq) - 1] = seq[1:]
    out["response_mask"][i, n_prompt - 1:n_prompt - 1 + n_resp] = 1.0
    if response_logps is not None:
      out["sampler_token_logp"][i, n_prompt - 1:n_prompt - 1 + n_resp] = response_logps[i]
  return out


def sequence_length(longest_prompt: int, max_new_tokens: int) -> int:
  """T of the trainer's [B, G, T] batch: prompt + response, less the last token (it is no input)."""
  return longest_prompt + max_new_tokens - 1


def pack_groups(groups: RolloutGroups, rewards_PxG: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
  """A chunk of rollout groups -> trainer arrays [P, G, seq_len] (see `pack_sequences`) + rewards."""
  P, G, _ = groups.response_tokens.shape
  pg = [(p, g) for p in range(P) for g in range(G)]
  lengths = [int(groups.lengths[p, g]) for p, g in pg]
  packed = pack_sequences(
      [groups.prompt_tokens[p, :groups.prompt_lengths[p]] for p, _ in pg],
      [groups.response_tokens[p, g, :n] for (p, g), n in zip(pg, lengths)],
      [groups.sampler_logp[p, g, :n] for (p, g), n in zip(pg, lengths)], seq_len)
  out = {k: v.reshape(P, G, seq_len) for k, v in packed.items()}
  out["rewards"] = np.asarray(rewards_PxG, FIELDS["rewards"].dtype)
  return out


def _as_field(name: str, values) -> np.ndarray:
  """`values` in batch field `name`'s stated dtype; a name FIELDS does not state is refused."""
  if name not in FIELDS:
    raise ValueError(f"{name!r} is no field of the trainer's batch (objectives/batch_fields.FIELDS: {sorted(FIELDS)})")
  return np.asarray(values, FIELDS[name].dtype)


class RolloutBuffer:
  """Thread-safe store of packed groups from the current snapshot version only."""

  def __init__(self, seq_len: int):
    self.seq_len = seq_len
    self._cond = threading.Condition()
    self._version = 0
    self._chunks: list[dict[str, np.ndarray]] = []
    self._uses: list[np.ndarray] = []  # per chunk: times each group was drawn
    self._closed = False

  @property
  def version(self) -> int:
    return self._version

  def reset(self, version: int) -> None:
    """Drop every group and accept only `version` from now on (the sync of Algorithm 1)."""
    with self._cond:
      self._version = version
      self._chunks, self._uses = [], []
      self._cond.notify_all()

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._cond.notify_all()

  def add(self, groups: RolloutGroups, rewards_PxG: np.ndarray, fields: Optional[dict] = None) -> bool:
    """Add one chunk of groups (with per-group `fields` [P, ...] beside them, e.g. demo_slots); returns False
    (and drops it) if it is from another version."""
    packed = pack_groups(groups, rewards_PxG, self.seq_len)
    packed.update({k: _as_field(k, v) for k, v in (fields or {}).items()})
    packed["version"] = np.full(len(rewards_PxG), groups.snapshot_version, np.int64)
    with self._cond:
      if groups.snapshot_version != self._version:
        return False
      self._chunks.append(packed)
      self._uses.append(np.zeros(len(rewards_PxG), np.int64))
      self._cond.notify_all()
      return True

  def num_chunks(self) -> int:
    with self._cond:
      return len(self._chunks)

  def num_groups(self) -> int:
    with self._cond:
      return sum(len(u) for u in self._uses)

  def versions(self) -> set[int]:
    with self._cond:
      return {int(v) for c in self._chunks for v in c["version"]}

  def chunk(self, index: int, timeout: Optional[float] = None) -> Optional[dict[str, np.ndarray]]:
    """Chunk `index`'s packed arrays (waits for it); None if the buffer closed first."""
    with self._cond:
      if not self._cond.wait_for(lambda: self._closed or len(self._chunks) > index, timeout) or \
          len(self._chunks) <= index:
        return None
      return dict(self._chunks[index])

  def annotate(self, index: int, key: str, values: np.ndarray) -> None:
    """Attach per-group arrays to chunk `index` (e.g. GRPO's pi_old log-probs for its round)."""
    with self._cond:
      if len(values) != len(self._uses[index]):
        raise ValueError(f"{key}: {len(values)} rows for a chunk of {len(self._uses[index])} groups")
      self._chunks[index][key] = _as_field(key, values)

  def sample(self, batch_groups: int, chunks_visible: int, rng: np.random.Generator,
             timeout: Optional[float] = None, rows: slice = slice(None)) -> Optional[dict[str, np.ndarray]]:
    """B groups from the first `chunks_visible` chunks, least-used first; waits for the chunks.

    The draw is over all B (the same on every process); the arrays hold only batch rows `rows`
    (a process's share, `parallel.process_rows`), 'reuse' and 'version' all B.
    Returns None if the buffer was closed (or `timeout` passed) before the chunks arrived.
    """
    with self._cond:
      ready = self._cond.wait_for(lambda: self._closed or len(self._chunks) >= chunks_visible, timeout)
      if not ready or len(self._chunks) < chunks_visible:
        return None
      chunks, uses = self._chunks[:chunks_visible], self._uses[:chunks_visible]
      flat_uses = np.concatenate(uses)
      if len(flat_uses) < batch_groups:
        raise ValueError(f"the first {chunks_visible} rollout chunks hold {len(flat_uses)} groups, "
                         f"fewer than the trainer batch of {batch_groups} groups")
      order = np.lexsort((rng.random(len(flat_uses)), flat_uses))[:batch_groups]
      owner = np.repeat(np.arange(len(chunks)), [len(u) for u in uses])
      offset = np.concatenate([[0], np.cumsum([len(u) for u in uses])])
      picks = [(owner[i], i - offset[owner[i]]) for i in np.sort(order)]
      for c, j in picks:
        uses[c][j] += 1
      mine = picks[rows]
      batch = {k: np.stack([chunks[c][k][j] for c, j in mine]) for k in chunks[0] if k != "version"}
      batch["version"] = np.array([chunks[c]["version"][j] for c, j in picks], np.int64)
      batch["reuse"] = np.array([uses[c][j] for c, j in picks], np.int64)
      return batch
