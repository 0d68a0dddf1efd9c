"""Rollouts on disk for the offline mode: one directory per stage, one Parquet file per chunk.

    store = RolloutStore.create_or_resume(directory, header)   # resumes when the header matches
    store.write_chunk(store.num_complete, groups, rewards_PxG, problems, prompt_indices, responses)
    chunk = store.read_chunk(c)        # StoredChunk: the exact RolloutGroups, rewards, prompts back
    rewards_PxG = store.read_rewards(c)  # the rewards column only (the offline filter)

Layout: <directory>/header.json (what produced the rollouts, `StoreHeader`) and chunk-00000.parquet,
chunk-00001.parquet, ... A chunk is written to a temporary file, synced and renamed when whole, so a
killed generate leaves only whole chunks; `num_complete` counts them and generation resumes there.

One row per prompt: prompt_index (into the task's training prompts; also the sampler's key id),
prompt, answer, prompt_tokens, response_tokens and sampler_logp (G unpadded lists each), responses
(the G decoded texts), rewards (G), finish_reason (G), snapshot_version. Per-chunk values (seed,
reward failure counts, the sampler call's statistics) sit in the file's schema metadata.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from oapl_jax.sampler.api import RolloutGroups
from oapl_jax.sampler.settings import SamplingSettings
from oapl_jax.tasks.base import Problem

HEADER = "header.json"
_META_KEY = b"oapl_chunk"
_STATS = ("seed", "wall_seconds", "num_tokens", "num_decode_calls", "num_prefill_calls")
SCHEMA = pa.schema([
    ("prompt_index", pa.int64()), ("prompt", pa.string()), ("answer", pa.string()),
    ("prompt_tokens", pa.list_(pa.int32())), ("response_tokens", pa.list_(pa.list_(pa.int32()))),
    ("sampler_logp", pa.list_(pa.list_(pa.float32()))), ("responses", pa.list_(pa.string())),
    ("rewards", pa.list_(pa.float32())), ("finish_reason", pa.list_(pa.int8())), ("snapshot_version", pa.int64())])


@dataclasses.dataclass(frozen=True)
class StoreHeader:
  """What produced a stage's rollouts; a resumed generate must match it field for field."""
  task: str
  stage: int
  snapshot_version: int  # the sampler snapshot every group comes from
  policy_step: int  # the trainer checkpoint step whose params that snapshot holds
  group_size: int
  num_prompts: int
  chunk_prompts: int
  seed: int
  settings: SamplingSettings

  @property
  def num_chunks(self) -> int:
    return math.ceil(self.num_prompts / self.chunk_prompts)

  def to_json(self) -> dict[str, Any]:
    return dict(dataclasses.asdict(self), settings=dataclasses.asdict(self.settings))

  @classmethod
  def from_json(cls, values: dict[str, Any]) -> "StoreHeader":
    return cls(**dict(values, settings=SamplingSettings(**values["settings"])))


@dataclasses.dataclass
class StoredChunk:
  groups: RolloutGroups
  rewards_PxG: np.ndarray  # float32
  prompt_indices: np.ndarray  # int64 [P]
  prompts: list[str]
  answers: list[str]
  responses: list[list[str]]
  num_failed: int  # reward failures and timeouts of the chunk, as scored
  num_timeout: int


def take_groups(groups: RolloutGroups, rows: Sequence[int]) -> RolloutGroups:
  """The groups `rows` (in that order) of a RolloutGroups."""
  rows = np.asarray(rows, np.int64)
  per_prompt = ("prompt_tokens", "prompt_lengths", "response_tokens", "response_mask", "sampler_logp", "lengths",
                "finish_reason")
  return dataclasses.replace(groups, **{name: getattr(groups, name)[rows] for name in per_prompt})


def _ragged(values_PxGxN: np.ndarray, lengths_PxG: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
  """[P, G, N] right-padded arrays -> list<list<value>> of P rows of G unpadded lists."""
  P, G, N = values_PxGxN.shape
  flat = values_PxGxN[np.arange(N) < lengths_PxG[..., None]]  # row-major: prompt, sample, token
  inner = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(lengths_PxG.reshape(-1))]), pa.int32()),
                                   pa.array(flat, value_type))
  return pa.ListArray.from_arrays(pa.array(np.arange(P + 1) * G, pa.int32()), inner)


def _padded(column: pa.ChunkedArray, G: int, N: int, dtype) -> tuple[np.ndarray, np.ndarray]:
  """Inverse of `_ragged`: (values [P, G, N] zero-padded, lengths [P, G])."""
  outer = column.combine_chunks()
  P = len(outer)
  inner = outer.flatten()
  lengths_PxG = np.diff(inner.offsets.to_numpy()).reshape(P, G).astype(np.int32)
  values = np.zeros((P, G, N), dtype)
  values[np.arange(N) < lengths_PxG[..., None]] = inner.flatten().to_numpy(zero_copy_only=False)
  return values, lengths_PxG


class RolloutStore:
  """A stage's rollouts: header.json and chunk-NNNNN.parquet files in `directory` (local paths)."""

  def __init__(self, directory: str, header: StoreHeader):
    self.directory, self.header = directory, header

  @classmethod
  def open(cls, directory: str) -> "RolloutStore":
    path = os.path.join(directory, HEADER)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"no rollout store in {directory} (no {HEADER}): run the generate stage first")
    with open(path) as f:
      return cls(directory, StoreHeader.from_json(json.load(f)))

  @classmethod
  def create_or_resume(cls, directory: str, header: StoreHeader) -> "RolloutStore":
    """A new store, or the one in `directory` if it was made by the same header (else ValueError)."""
    if os.path.isfile(os.path.join(directory, HEADER)):
      store = cls.open(directory)
      if store.header != header:
        old, new = store.header.to_json(), header.to_json()
        changed = [f"{k}: {old[k]!r} on disk, {new[k]!r} now" for k in old if old[k] != new[k]]
        raise ValueError(f"the rollout store in {directory} was made differently ({'; '.join(changed)}); "
                         "move it away to generate afresh")
      return store
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, HEADER + ".tmp")
    with open(tmp, "w") as f:
      json.dump(header.to_json(), f, indent=1)
    os.replace(tmp, os.path.join(directory, HEADER))
    return cls(directory, header)

  def chunk_path(self, chunk: int) -> str:
    return os.path.join(self.directory, f"chunk-{chunk:05d}.parquet")

  @property
  def num_complete(self) -> int:
    """Whole chunks on disk, counted from chunk 0 (generation resumes after the last)."""
    n = 0
    while n < self.header.num_chunks and os.path.isfile(self.chunk_path(n)):
      n += 1
    return n

  @property
  def complete(self) -> bool:
    return self.num_complete == self.header.num_chunks

  def write_chunk(self, chunk: int, groups: RolloutGroups, rewards_PxG: np.ndarray, problems: Sequence[Problem],
                  prompt_indices: Sequence[int], responses: Sequence[Sequence[str]], num_failed: int = 0,
                  num_timeout: int = 0) -> None:
    """Writes chunk `chunk` (the next one: chunks are written in order) atomically."""
    if chunk != self.num_complete:
      raise ValueError(f"chunk {chunk} written out of order: the store holds {self.num_complete} whole chunks")
    P, G, N = groups.response_tokens.shape
    h = self.header
    if (G, N, groups.settings, groups.snapshot_version) != (h.group_size, h.settings.max_new_tokens, h.settings,
                                                           h.snapshot_version):
      raise ValueError(f"chunk {chunk}: groups of G={G}, {N} tokens, {groups.settings}, snapshot "
                       f"{groups.snapshot_version} do not match the store's header {h}")
    rewards_PxG = np.asarray(rewards_PxG, np.float32)
    if rewards_PxG.shape != (P, G) or len(problems) != P or len(prompt_indices) != P or len(responses) != P:
      raise ValueError(f"chunk {chunk}: {P} groups of {G} but rewards {rewards_PxG.shape}, {len(problems)} problems,"
                       f" {len(prompt_indices)} prompt indices, {len(responses)} response lists")
    ragged = lambda x, t: _ragged(x, groups.lengths, t)  # noqa: E731
    prompt_tokens = pa.ListArray.from_arrays(
        pa.array(np.concatenate([[0], np.cumsum(groups.prompt_lengths)]), pa.int32()),
        pa.array(groups.prompt_tokens[np.arange(groups.prompt_tokens.shape[1]) < groups.prompt_lengths[:, None]],
                 pa.int32()))
    table = pa.Table.from_arrays([
        pa.array(np.asarray(prompt_indices, np.int64)), pa.array([p.prompt for p in problems], pa.string()),
        pa.array([p.answer for p in problems], pa.string()), prompt_tokens,
        ragged(groups.response_tokens, pa.int32()), ragged(groups.sampler_logp, pa.float32()),
        pa.array([list(r) for r in responses], pa.list_(pa.string())),
        pa.array(list(rewards_PxG), pa.list_(pa.float32())), pa.array(list(groups.finish_reason), pa.list_(pa.int8())),
        pa.array(np.full(P, groups.snapshot_version, np.int64))], schema=SCHEMA)
    meta = {name: getattr(groups, name) for name in _STATS}
    meta.update(num_failed=int(num_failed), num_timeout=int(num_timeout))
    table = table.replace_schema_metadata({_META_KEY: json.dumps(meta)})
    path = self.chunk_path(chunk)
    pq.write_table(table, path + ".tmp")
    with open(path + ".tmp", "rb") as f:
      os.fsync(f.fileno())
    os.replace(path + ".tmp", path)

  def read_rewards(self, chunk: int) -> np.ndarray:
    """[P, G] float32 rewards of a chunk (reads that column only)."""
    column = pq.read_table(self.chunk_path(chunk), columns=["rewards"]).column("rewards").combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), self.header.group_size).astype(np.float32)

  def read_chunk(self, chunk: int) -> StoredChunk:
    table = pq.read_table(self.chunk_path(chunk))
    meta = json.loads(table.schema.metadata[_META_KEY])
    h = self.header
    G, N = h.group_size, h.settings.max_new_tokens
    response_tokens, lengths = _padded(table.column("response_tokens"), G, N, np.int32)
    sampler_logp, _ = _padded(table.column("sampler_logp"), G, N, np.float32)
    prompts_P = table.column("prompt_tokens").to_pylist()
    prompt_tokens = np.zeros((len(prompts_P), max(len(p) for p in prompts_P)), np.int32)
    for i, p in enumerate(prompts_P):
      prompt_tokens[i, :len(p)] = p
    versions = set(table.column("snapshot_version").to_pylist())
    if versions != {h.snapshot_version}:
      raise ValueError(f"{self.chunk_path(chunk)}: snapshot versions {versions}, the header says {h.snapshot_version}")
    groups = RolloutGroups(
        prompt_tokens=prompt_tokens, prompt_lengths=np.array([len(p) for p in prompts_P], np.int32),
        response_tokens=response_tokens, response_mask=np.arange(N) < lengths[..., None], sampler_logp=sampler_logp,
        lengths=lengths, finish_reason=np.array(table.column("finish_reason").to_pylist(), np.int8).reshape(-1, G),
        snapshot_version=h.snapshot_version, settings=h.settings, **{name: meta[name] for name in _STATS})
    return StoredChunk(groups, self.read_rewards(chunk), table.column("prompt_index").to_numpy(),
                       table.column("prompt").to_pylist(), table.column("answer").to_pylist(),
                       table.column("responses").to_pylist(), meta["num_failed"], meta["num_timeout"])
