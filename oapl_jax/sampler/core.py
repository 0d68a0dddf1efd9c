"""The sampler's jitted core: bucketed prefill, slot insert, decode steps. No JetStream import here.

    sampler = Sampler(model, num_slots=64, max_prefill_length=512)   # model: a models.api.CausalLM
    params = sampler.refresh(trainer_params)          # device-side reshard + cast, version += 1
    state = sampler.init_decode_state(SamplingSettings(max_new_tokens=128, temperature=1.0))
    prefix = sampler.prefill(params, [[1, 2, 3], [4, 5]])  # one bucketed batch of prompts
    state = sampler.insert(prefix, state, slots=[0, 1], rows=[0, 1], keys=sampler.sample_keys(0, [0, 1], [0, 0]))
    state = sampler.decode(params, state, num_steps=16)    # up to 16 steps on device, no host trip

Prefill writes the whole padded prompt into a cache but samples nothing: the first new token is
drawn by the first decode step, which re-feeds the last prompt token at its position (rewriting the
same key/value). So every generated token comes from the same code path, a prefix can be inserted
into many slots (G samples of one prompt share one prefill), and JetStream's `generate` returns
every token. Cache key index == absolute position (see models/api.py): right padding and stale
entries past a slot's position are invisible, so insert never has to clear anything.

Sample s draws step t by inverting uniform t of the N that insert draws from key_s, where key_s
comes from (seed, prompt id, sample id): a sample's tokens do not depend on which slot it runs in
or what runs beside it, and a decode step spends nothing on random numbers.
"""
import functools
import time
from typing import NamedTuple, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from oapl_jax import parallel
from oapl_jax.models import vocab_logprobs
from oapl_jax.models.api import Cache, CausalLM
from oapl_jax.parallel import Layout
from oapl_jax.sampler import api, rollout
from oapl_jax.sampler.buckets import pow2, prefill_bucket
from oapl_jax.sampler.sampling import sample_tokens
from oapl_jax.sampler.settings import SamplingSettings



class Prefix(NamedTuple):
  """A prefilled batch of prompts: a cache of length T (a length bucket) for B rows."""

  cache: Cache
  last_token_B: jax.Array  # int32, each prompt's last token (fed again by the first decode step)
  length_B: jax.Array  # int32, true prompt lengths


class DecodeState(NamedTuple):
  """Everything a decode step reads and writes, for S slots and N new tokens at most."""

  cache: Cache  # S rows of L positions (the model's layout); L <= max_len
  tokens_S: jax.Array  # int32, token fed at the next step (last prompt token, then last sampled)
  positions_S: jax.Array  # int32, absolute position of tokens_S
  num_generated_S: jax.Array  # int32, tokens sampled so far
  max_new_S: jax.Array  # int32, this slot's budget of new tokens
  done_S: jax.Array  # bool, stopped, out of budget, or empty
  uniforms_SxN: jax.Array  # float32, the running sample's uniform for each step, drawn at insert
  out_tokens_SxN: jax.Array  # int32, sampled tokens
  out_logp_SxN: jax.Array  # float32, their log-probs under the sampling distribution
  stop_tokens_X: jax.Array  # int32, padded with -1
  temperature: jax.Array  # float32 scalar, 0 = greedy
  top_p: jax.Array  # float32 scalar
  top_k: jax.Array  # int32 scalar, 0 = off
  max_len: jax.Array  # int32 scalar: the cache length the state may grow to, which caps the budgets


# ---------------------------------------------------------------- pure functions (jitted below)
def prefill_fn(model: CausalLM, params, tokens_BxT, lengths_B) -> Prefix:
  B, T = tokens_BxT.shape
  valid_BxT = jnp.arange(T)[None, :] < lengths_B[:, None]
  tokens_BxT = jnp.where(valid_BxT, tokens_BxT, 0)  # keep padding finite (no out-of-range ids)
  positions_BxT = jnp.broadcast_to(jnp.arange(T), (B, T))
  _, cache = model.forward_with_cache(params, tokens_BxT, positions_BxT, model.init_cache(B, T))
  last_B = jnp.take_along_axis(tokens_BxT, (lengths_B - 1)[:, None], axis=1)[:, 0]
  return Prefix(cache, last_B, lengths_B)


def score_fn(model: CausalLM, params, tokens_BxT, temperature: float):
  """log softmax(logits / temperature) of each next token under the snapshot, float32 [B, T - 1]: the
  sampler's own log-probs of given sequences (the same forward as prefill; no top-p / top-k filter). The
  vocabulary projection runs in chunks of the model's `logprob_chunk_tokens` (models/vocab_logprobs.py), so
  [chunk, V] of logits is alive, not [B, T, V]."""
  B, T = tokens_BxT.shape
  positions_BxT = jnp.broadcast_to(jnp.arange(T), (B, T))
  hidden_BxTxE, _ = model.forward_with_cache(params, tokens_BxT, positions_BxT, model.init_cache(B, T))
  return vocab_logprobs.token_logprobs(model.logits, params, hidden_BxTxE[:, :-1], tokens_BxT[:, 1:],
                                       chunk_tokens=model.config.logprob_chunk_tokens, temperature=temperature)


def insert_fn(model: CausalLM, prefix: Prefix, state: DecodeState, slots_M, rows_M, keys_Mx2,
              max_new_M) -> DecodeState:
  """Rows `rows_M` of `prefix` start fresh samples in `slots_M`; slot index >= S is ignored (padding)."""
  N = state.out_tokens_SxN.shape[1]
  cache = model.copy_cache_rows(state.cache, prefix.cache, slots_M, rows_M)
  length_M = prefix.length_B[rows_M]
  max_new_M = jnp.minimum(max_new_M, jnp.minimum(N, state.max_len - length_M + 1))
  uniforms_MxN = jax.vmap(lambda key: jax.random.uniform(key, (N,), jnp.float32))(keys_Mx2)
  put = lambda dst, src: dst.at[slots_M].set(src, mode="drop")  # noqa: E731
  return state._replace(
      cache=cache, tokens_S=put(state.tokens_S, prefix.last_token_B[rows_M]),
      positions_S=put(state.positions_S, length_M - 1),
      num_generated_S=put(state.num_generated_S, jnp.zeros_like(slots_M)),
      max_new_S=put(state.max_new_S, max_new_M), done_S=put(state.done_S, max_new_M <= 0),
      uniforms_SxN=put(state.uniforms_SxN, uniforms_MxN))


def step_fn(model: CausalLM, params, state: DecodeState, constants=None):
  """One token for every slot. Returns (state, sampled tokens_S, active_S = slot was live)."""
  hidden_Sx1xE, cache = model.forward_with_cache(params, state.tokens_S[:, None], state.positions_S[:, None],
                                                 state.cache, constants)
  logits_SxV = model.logits(params, hidden_Sx1xE[:, 0])
  S, N = state.out_tokens_SxN.shape
  step_S = jnp.minimum(state.num_generated_S, N - 1)[:, None]
  u_S = jnp.take_along_axis(state.uniforms_SxN, step_S, axis=1)[:, 0]
  tokens_S, logp_S = sample_tokens(logits_SxV, u_S, state.temperature, state.top_p, state.top_k)

  active_S = ~state.done_S
  col_S = jnp.where(active_S, state.num_generated_S, N)  # N is out of range: dropped
  rows_S = jnp.arange(S)
  num_generated_S = state.num_generated_S + active_S
  stopped_S = jnp.isin(tokens_S, state.stop_tokens_X)
  done_S = state.done_S | (active_S & (stopped_S | (num_generated_S >= state.max_new_S)))
  state = state._replace(
      cache=cache, tokens_S=jnp.where(active_S, tokens_S, state.tokens_S),
      positions_S=state.positions_S + active_S, num_generated_S=num_generated_S, done_S=done_S,
      out_tokens_SxN=state.out_tokens_SxN.at[rows_S, col_S].set(tokens_S, mode="drop"),
      out_logp_SxN=state.out_logp_SxN.at[rows_S, col_S].set(logp_S, mode="drop"))
  return state, tokens_S, active_S


def decode_fn(model: CausalLM, params, state: DecodeState, num_steps) -> DecodeState:
  """Up to `num_steps` steps in one device loop; stops early once every slot is done."""
  def cond(carry):
    i, s = carry
    return (i < num_steps) & jnp.any(~s.done_S)

  constants = model.decode_constants(model.cache_length(state.cache))  # once, outside the loop

  def body(carry):
    i, s = carry
    return i + 1, step_fn(model, params, s, constants)[0]

  return jax.lax.while_loop(cond, body, (jnp.int32(0), state))[1]


def generate_fn(model: CausalLM, params, state: DecodeState):
  """One step, plus JetStream's result layout: [S, 3] = (token, valid, length so far). No decode
  constants (JetStream calls this once per step, so they would be rebuilt every call)."""
  state, tokens_S, active_S = step_fn(model, params, state)
  return state, jnp.stack([tokens_S, active_S.astype(jnp.int32), state.num_generated_S], axis=1)


# The fewest rows a decode state has, by platform. On an H200 (JAX 0.11.2, Qwen3-0.6B in bf16, 28 layers) a
# one-row step took 2.40 ms and a two-row step 1.50 ms (docs/benchmarks.md, GPU): one empty row more is faster.
MIN_DECODE_ROWS = {"gpu": 2}
# Where the decode layout keeps a tied table's [E, V] transpose for the logits (models/execution.py,
# decode_transposed_table), by platform and compute dtype: XLA:CPU's float32 dot of the decode's hidden rows against
# Qwen3-0.6B's [151,936, 1,024] table took 20.9 / 50.5 / 67.3 / 126.6 ms at 1 / 2 / 16 / 64 rows against 18.1 /
# 23.3 / 43.6 / 121.2 ms on the [E, V] copy; in bfloat16 the copy was no faster (AMD EPYC host, 2026-11-30)
TRANSPOSED_TABLE_AT = {("cpu", "float32")}


def init_state_fn(model: CausalLM, num_slots, cache_len, max_new_tokens, max_len, knobs) -> DecodeState:
  """knobs: (stop_tokens_X, temperature, top_p, top_k), the sampling settings as arrays."""
  S, N = num_slots, max_new_tokens
  stop_tokens_X, temperature, top_p, top_k = knobs
  return DecodeState(
      cache=model.init_cache(S, cache_len), tokens_S=jnp.zeros((S,), jnp.int32),
      positions_S=jnp.zeros((S,), jnp.int32), num_generated_S=jnp.zeros((S,), jnp.int32),
      max_new_S=jnp.zeros((S,), jnp.int32), done_S=jnp.ones((S,), bool),
      uniforms_SxN=jnp.zeros((S, N), jnp.float32), out_tokens_SxN=jnp.zeros((S, N), jnp.int32),
      out_logp_SxN=jnp.zeros((S, N), jnp.float32), stop_tokens_X=stop_tokens_X.astype(jnp.int32),
      temperature=jnp.asarray(temperature, jnp.float32), top_p=jnp.asarray(top_p, jnp.float32),
      top_k=jnp.asarray(top_k, jnp.int32), max_len=jnp.asarray(max_len, jnp.int32))


@jax.jit
def _sample_keys(seed, prompt_ids_M, sample_ids_M):
  base = jax.random.PRNGKey(seed)
  one = lambda p, g: jax.random.fold_in(jax.random.fold_in(base, p), g)  # noqa: E731
  return jax.vmap(one)(prompt_ids_M, sample_ids_M)


def sample_keys(seed: int, prompt_ids, sample_ids) -> jax.Array:
  """Base key of each (prompt id, sample id) pair: [M, 2] uint32."""
  return _sample_keys(np.int32(seed), np.asarray(prompt_ids, np.int32), np.asarray(sample_ids, np.int32))


# ---------------------------------------------------------------- the bound, sharded sampler
class Sampler(api.GroupSampler):
  """The jitted core bound to one model (a models.api.CausalLM) and one layout (the sampler's mesh
  and its logical-axis rules): the JAX backend of sampler/api.GroupSampler.

  Holds the current parameter snapshot (`params`, in the model's decode layout, e.g. one tree per
  layer) and its `snapshot_version` (starting at `snapshot_version`, a resumed run's); `refresh` replaces
  both. Every method that takes a DecodeState donates it: use the returned state.
  """

  def __init__(self, model: CausalLM, *, layout: Optional[Layout] = None, num_slots: int = 8,
               max_prefill_length: int = 256, max_new_tokens: int = 256, max_prefill_batch: int = 0,
               snapshot_version: int = 0):
    self.layout = layout or Layout.single_device()
    if (self.layout.platform, model.config.dtype) in TRANSPOSED_TABLE_AT:  # the model copies a tied table only
      model = model.with_execution(decode_transposed_table=True)
    self.model, self.config = model, model.config
    self.num_slots = int(num_slots)
    self.max_prefill_length = int(max_prefill_length)
    self.max_new_tokens = int(max_new_tokens)
    self.max_prefill_batch = int(max_prefill_batch)  # prompts per prefill call in `generate` (0: no cap)
    if self.num_slots < 1 or self.max_prefill_length < 1 or self.max_new_tokens < 1:
      raise ValueError(f"num_slots={num_slots}, max_prefill_length={max_prefill_length} and "
                       f"max_new_tokens={max_new_tokens} must all be >= 1")
    if self.max_prefill_batch < 0:
      raise ValueError(f"max_prefill_batch={max_prefill_batch} must be >= 0 (0: no cap)")
    # The decode state's rows: num_slots, or more where a one-row decode step is slow (the extra rows stay empty)
    self.decode_rows = max(self.num_slots, MIN_DECODE_ROWS.get(self.layout.platform, 1))
    batch_shards = self.layout.axis_size("cache_batch")
    if self.num_slots % batch_shards:
      raise ValueError(f"num_slots={num_slots} must be a multiple of the {batch_shards} devices the "
                       f"sampler mesh {dict(self.mesh.shape)} splits the slot axis over")
    self.params = None
    self.snapshot_version = int(snapshot_version)
    self.last_refresh_seconds = float("nan")
    self.last_refresh_bytes = 0  # bytes of the snapshot installed by the last refresh (all devices)

    # The trainer's layout of the params on this mesh, and the snapshot's decode layout.
    lay = self.layout
    self.param_shardings = lay.sharding(model.param_logical_axes())
    self.snapshot_shardings = lay.sharding(model.decode_logical_axes())
    cache_axes = model.cache_logical_axes()
    unbatched = jax.tree.map(lambda spec: PartitionSpec(None, *spec[1:]), cache_axes,
                             is_leaf=lambda x: isinstance(x, PartitionSpec))
    per_slot, per_slot_row, repl = lay.sharding(PartitionSpec("cache_batch")), \
        lay.sharding(PartitionSpec("cache_batch", None)), lay.replicated
    self.state_shardings = DecodeState(
        cache=lay.sharding(cache_axes), tokens_S=per_slot, positions_S=per_slot,
        num_generated_S=per_slot, max_new_S=per_slot, done_S=repl, uniforms_SxN=per_slot_row,
        out_tokens_SxN=per_slot_row, out_logp_SxN=per_slot_row, stop_tokens_X=repl, temperature=repl,
        top_p=repl, top_k=repl, max_len=repl)
    self.prefix_shardings = Prefix(lay.sharding(unbatched), repl, repl)

    bind = lambda fn: functools.partial(fn, model)  # noqa: E731
    jit = functools.partial(jax.jit, compiler_options=lay.compiler_options)  # mesh.cpu_compile's options
    self._prefill = jit(bind(prefill_fn), out_shardings=self.prefix_shardings)
    self._score = jit(bind(score_fn), static_argnums=(2,), out_shardings=repl)
    self._insert = jit(bind(insert_fn), donate_argnums=(1,), out_shardings=self.state_shardings)
    self._decode = jit(bind(decode_fn), donate_argnums=(1,), out_shardings=self.state_shardings)
    self._generate = jit(bind(generate_fn), donate_argnums=(1,), out_shardings=(self.state_shardings, repl))
    self._init_state = jit(bind(init_state_fn), static_argnums=(0, 1, 2), out_shardings=self.state_shardings)
    self._grow = jit(lambda s, n: s._replace(cache=model.grow_cache(s.cache, n)), static_argnums=1,
                     out_shardings=self.state_shardings)
    self._gather = jit(lambda s, idx: (s.out_tokens_SxN[idx], s.out_logp_SxN[idx], s.num_generated_S[idx]),
                       out_shardings=repl)
    self._cast = jit(lambda p: jax.tree.map(lambda x: x.astype(model.config.jnp_param_dtype), p))
    self._to_decode_layout = jit(model.decode_params, out_shardings=self.snapshot_shardings)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def mesh(self) -> jax.sharding.Mesh:
    return self.layout.mesh

  def cache_length(self, state_or_prefix) -> int:
    return self.model.cache_length(state_or_prefix.cache)

  def _check_layout(self, params):
    if not self.model.is_decode_layout(params):
      raise ValueError("params are not in the sampler's decode layout: use sampler.params, or "
                       "sampler.prepare(trainer_params)")

  # ---- parameters
  def refresh(self, trainer_params, *, version: Optional[int] = None):
    """New snapshot from the trainer's params (see `prepare`), at `version` (default: the last + 1).
    Records the wall time (blocked until the copy is done) in `last_refresh_seconds`."""
    start = time.perf_counter()
    return self._install(self.prepare(trainer_params), start, version)

  def prepare(self, trainer_params):
    """Trainer-layout params -> the sampler's: cast to the sampler dtype, a device-to-device
    reshard onto the sampler mesh (never through host memory), then the decode layout.
    Params already in the decode layout are returned as they are."""
    if self.model.is_decode_layout(trainer_params):
      return trainer_params
    trainer_params = nn.unbox(trainer_params)
    if jax.tree.structure(trainer_params) != jax.tree.structure(self.param_shardings):
      raise ValueError("the params tree does not match the sampler's model config "
                       f"(expected {jax.tree.structure(self.param_shardings)})")
    needs_cast = any(x.dtype != self.config.jnp_param_dtype for x in jax.tree.leaves(trainer_params))
    params = parallel.transfer(self._cast(trainer_params) if needs_cast else trainer_params, self.param_shardings)
    return self._to_decode_layout(params)

  def load(self, path: str):
    """Load an HF checkpoint straight onto the sampler mesh as a new snapshot."""
    from oapl_jax.models import factory  # local: only needed when loading from disk
    start = time.perf_counter()
    model, params = factory.load_pretrained(path, self.layout, param_dtype=self.config.param_dtype,
                                            dtype=self.config.dtype)
    if not self.model.same_architecture(model):
      raise ValueError(f"{path}: checkpoint architecture {model.config} does not match the sampler's {self.config}")
    return self._install(self._to_decode_layout(params), start)

  def _install(self, params, start: float, version: Optional[int] = None):
    """Make `params` the current snapshot: wait for the copy, record its time, set the version."""
    jax.block_until_ready(params)
    self.last_refresh_seconds = time.perf_counter() - start
    self.last_refresh_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    self.params = params
    self.snapshot_version = self.snapshot_version + 1 if version is None else int(version)
    return params

  # ---- groups (sampler/rollout.py: continuous batching over the slots)
  def generate(self, prompts, group_size: int, settings: SamplingSettings, *, seed: int,
               prompt_ids: Optional[Sequence[int]] = None, params=None) -> api.RolloutGroups:
    """api.GroupSampler.generate: params other than `self.params` (in either layout) go through `prepare`."""
    return rollout.run_groups(self, params, prompts, group_size, settings, seed=seed, prompt_ids=prompt_ids)

  # ---- decode state
  def init_decode_state(self, settings: SamplingSettings, *, max_len: Optional[int] = None,
                        cache_len: Optional[int] = None) -> DecodeState:
    """All slots empty, sampling with `settings` (its max_new_tokens, temperature, top-p, top-k and
    stop tokens). max_len (the longest prompt + response a slot holds) defaults to
    max_prefill_length + max_new_tokens. The cache starts at cache_len positions (default max_len)
    and must be grown (`grow_cache`) before any slot's position reaches its length."""
    n = settings.max_new_tokens
    max_len = int(max_len or self.max_prefill_length + n)
    cache_len = int(cache_len or max_len)
    if not 1 <= cache_len <= max_len:
      raise ValueError(f"cache_len={cache_len} must be in [1, max_len={max_len}]")
    stops = np.full((max(1, len(settings.stop_tokens)),), -1, np.int32)
    stops[:len(settings.stop_tokens)] = settings.stop_tokens
    knobs = (stops, np.float32(settings.temperature), np.float32(settings.top_p), np.int32(settings.top_k))
    with self.layout.context():
      return self._init_state(self.decode_rows, cache_len, n, max_len, knobs)

  def grow_cache(self, state: DecodeState, cache_len: int) -> DecodeState:
    """The same state with its cache zero-padded to cache_len positions (no-op if already that long)."""
    if cache_len <= self.cache_length(state):
      return state
    with self.layout.context():
      return self._grow(state, int(cache_len))

  # ---- the three jitted operations
  def prefill(self, params, prompts: Sequence[Sequence[int]]) -> Prefix:
    """One bucketed batch: length padded to a power of two, batch padded to a power of two
    (extra rows are dummies). Row i of the prefix is prompts[i]."""
    lengths = [len(p) for p in prompts]
    if not prompts or min(lengths) < 1 or max(lengths) > self.max_prefill_length:
      raise ValueError(f"prefill needs 1..{self.max_prefill_length} tokens per prompt; got lengths {lengths}")
    T = prefill_bucket(max(lengths), self.max_prefill_length)
    tokens = np.zeros((pow2(len(prompts)), T), np.int32)
    lengths_B = np.ones((tokens.shape[0],), np.int32)
    for i, p in enumerate(prompts):
      tokens[i, :len(p)] = p
      lengths_B[i] = len(p)
    self._check_layout(params)
    with self.layout.context():
      return self._prefill(params, tokens, lengths_B)

  def score(self, params, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
            temperature: float) -> list[np.ndarray]:
    """The snapshot's per-token log-probs (float32, at `temperature`, unfiltered) of each response after its
    prompt, e.g. a demonstration put into the buffer. Bucketed like prefill (powers of two)."""
    if not responses or min(len(r) for r in responses) < 1 or temperature <= 0:
      raise ValueError("score needs responses of >= 1 token and a temperature > 0")
    sequences = [list(p) + list(r) for p, r in zip(prompts, responses)]
    tokens = np.zeros((pow2(len(sequences)), pow2(max(len(q) for q in sequences))), np.int32)
    for i, q in enumerate(sequences):
      tokens[i, :len(q)] = q
    self._check_layout(params)
    with self.layout.context():
      logp_BxT = np.asarray(self._score(params, tokens, float(temperature)))
    return [logp_BxT[i, len(p) - 1:len(p) - 1 + len(r)] for i, (p, r) in enumerate(zip(prompts, responses))]

  def slot_keys(self, seed: int, prompt_ids, sample_ids) -> jax.Array:
    """sample_keys of up to num_slots samples as [decode_rows, 2] (the rows past them padding), one program for any
    count: `insert` takes them as they are."""
    if len(prompt_ids) > self.num_slots:
      raise ValueError(f"slot_keys: {len(prompt_ids)} samples for {self.num_slots} slots")
    ids = np.zeros((2, self.decode_rows), np.int32)
    ids[0, :len(prompt_ids)], ids[1, :len(sample_ids)] = prompt_ids, sample_ids
    return sample_keys(seed, *ids)

  def insert(self, prefix: Prefix, state: DecodeState, slots, rows, keys, max_new=None) -> DecodeState:
    """Start samples: prefix row rows[i] -> slot slots[i] with base key keys[i] (one key per sample, or
    `slot_keys`' num_slots rows). Donates `state`."""
    slots, rows = np.asarray(slots, np.int32), np.asarray(rows, np.int32)
    if len(slots) > self.num_slots:
      raise ValueError(f"insert: {len(slots)} samples for {self.num_slots} slots")
    if self.cache_length(prefix) > self.cache_length(state):
      raise ValueError(f"insert: a prefix of {self.cache_length(prefix)} positions does not fit the state's "
                       f"cache of {self.cache_length(state)}: grow_cache first")
    S = self.decode_rows
    pad = S - len(slots)  # always S entries: one compile per prefix shape
    max_new = np.broadcast_to(np.asarray(state.out_tokens_SxN.shape[1] if max_new is None else max_new,
                                         np.int32), slots.shape)
    slots = np.concatenate([slots, np.full((pad,), S, np.int32)])  # S is out of range: dropped
    rows = np.concatenate([rows, np.zeros((pad,), np.int32)])
    keys = jnp.asarray(keys, jnp.uint32).reshape(-1, 2)
    if not len(slots) - pad <= keys.shape[0] <= S:
      raise ValueError(f"insert: {keys.shape[0]} keys for {len(slots) - pad} samples and {self.num_slots} slots")
    if keys.shape[0] < S:  # slot_keys' are S rows already: no program per M here
      keys = jnp.concatenate([keys, jnp.zeros((S - keys.shape[0], 2), jnp.uint32)])
    max_new = np.concatenate([max_new, np.zeros((pad,), np.int32)])
    with self.layout.context():
      return self._insert(prefix, state, slots, rows, keys, max_new)

  def decode(self, params, state: DecodeState, num_steps: int) -> DecodeState:
    """Up to num_steps decode steps on device (early exit when all slots are done). Donates `state`."""
    self._check_layout(params)
    with self.layout.context():
      return self._decode(params, state, np.int32(num_steps))

  def generate_step(self, params, state: DecodeState):
    """One step (JetStream's `generate`); returns (state, data [S, 3] int32 = token, valid, length). Donates `state`."""
    self._check_layout(params)
    with self.layout.context():
      return self._generate(params, state)

  def gather(self, state: DecodeState, slots: Sequence[int]):
    """Host copies of (tokens [M, N], logp [M, N], num_generated [M]) for `slots`."""
    idx = np.zeros((pow2(len(slots)),), np.int32)
    idx[:len(slots)] = slots
    tokens, logp, n = jax.device_get(self._gather(state, idx))
    return tokens[:len(slots)], logp[:len(slots)], n[:len(slots)]

  sample_keys = staticmethod(sample_keys)
