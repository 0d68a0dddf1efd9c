"""The sampler's jitted core: bucketed prefill, slot insert, decode steps. No JetStream import here.

    sampler = Sampler(config, num_slots=64, max_prefill_length=512)
    params = sampler.refresh(trainer_params)          # device-side reshard + cast, version += 1
    state = sampler.init_decode_state(max_new_tokens=128, temperature=1.0)
    prefix = sampler.prefill(params, [[1, 2, 3], [4, 5]])  # one bucketed batch of prompts
    state = sampler.insert(prefix, state, slots=[0, 1], rows=[0, 1], keys=sampler.sample_keys(0, [0, 1], [0, 0]))
    state = sampler.decode(params, state, num_steps=16)    # up to 16 steps on device, no host trip

Prefill writes the whole padded prompt into a cache but samples nothing: the first new token is
drawn by the first decode step, which re-feeds the last prompt token at its position (rewriting the
same key/value). So every generated token comes from the same code path, a prefix can be inserted
into many slots (G samples of one prompt share one prefill), and JetStream's `generate` returns
every token. Cache key index == absolute position (see models/qwen.py): right padding and stale
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
from jax.sharding import NamedSharding, PartitionSpec

from oapl_jax import parallel
from oapl_jax.models import qwen
from oapl_jax.models.config import QwenConfig
from oapl_jax.sampler.sampling import sample_tokens

FINISH_NONE, FINISH_STOP, FINISH_LENGTH = 0, 1, 2
FINISH_NAMES = ("none", "stop", "length")
MIN_PREFILL_BUCKET = 8
MIN_CACHE_BUCKET = 16


class Prefix(NamedTuple):
  """A prefilled batch of prompts: a per-layer cache of length T (a length bucket) for B rows."""

  cache: qwen.Cache
  last_token_B: jax.Array  # int32, each prompt's last token (fed again by the first decode step)
  length_B: jax.Array  # int32, true prompt lengths


class DecodeState(NamedTuple):
  """Everything a decode step reads and writes, for S slots and N new tokens at most."""

  cache: qwen.Cache  # per layer: k [S, kv_heads, head_dim, L], v [S, kv_heads, L, head_dim]; L <= max_len
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


def prefill_bucket(length: int, max_prefill_length: int) -> int:
  """Powers of two (at least MIN_PREFILL_BUCKET), capped at max_prefill_length."""
  bucket = max(MIN_PREFILL_BUCKET, 1 << max(0, int(length) - 1).bit_length())
  return min(bucket, max_prefill_length)


def pow2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def cache_bucket(length: int, max_len: int) -> int:
  """Cache lengths a decode state grows through: 16, 24, 32, 48, 64, 96, ... (powers of two and
  1.5x them), capped at max_len. Attention costs what the cache holds, so a young batch runs on a
  short cache; two lengths per doubling bound the padding to a third, and the compiles to two."""
  p = pow2(max(length, MIN_CACHE_BUCKET))
  return min(p * 3 // 4 if MIN_CACHE_BUCKET < length <= p * 3 // 4 else p, int(max_len))


# ---------------------------------------------------------------- pure functions (jitted below)
def prefill_fn(config: QwenConfig, params, tokens_BxT, lengths_B) -> Prefix:
  B, T = tokens_BxT.shape
  valid_BxT = jnp.arange(T)[None, :] < lengths_B[:, None]
  tokens_BxT = jnp.where(valid_BxT, tokens_BxT, 0)  # keep padding finite (no out-of-range ids)
  positions_BxT = jnp.broadcast_to(jnp.arange(T), (B, T))
  _, cache = qwen.forward_with_cache(params, config, tokens_BxT, positions_BxT, qwen.init_cache(config, B, T))
  last_B = jnp.take_along_axis(tokens_BxT, (lengths_B - 1)[:, None], axis=1)[:, 0]
  return Prefix(cache, last_B, lengths_B)


def insert_fn(prefix: Prefix, state: DecodeState, slots_M, rows_M, keys_Mx2, max_new_M) -> DecodeState:
  """Rows `rows_M` of `prefix` start fresh samples in `slots_M`; slot index >= S is ignored (padding)."""
  T, N = qwen.cache_length(prefix.cache), state.out_tokens_SxN.shape[1]
  cache = tuple(qwen.KVCache(dst.k.at[slots_M, :, :, :T].set(src.k[rows_M], mode="drop"),
                             dst.v.at[slots_M, :, :T].set(src.v[rows_M], mode="drop"))
                for dst, src in zip(state.cache, prefix.cache))
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


def step_fn(config: QwenConfig, params, state: DecodeState, rope_table=None):
  """One token for every slot. Returns (state, sampled tokens_S, active_S = slot was live)."""
  hidden_Sx1xE, cache = qwen.forward_with_cache(params, config, state.tokens_S[:, None], state.positions_S[:, None],
                                                state.cache, rope_table)
  logits_SxV = qwen.Qwen(config).apply({"params": params}, hidden_Sx1xE[:, 0], method=qwen.Qwen.logits)
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


def decode_fn(config: QwenConfig, params, state: DecodeState, num_steps) -> DecodeState:
  """Up to `num_steps` steps in one device loop; stops early once every slot is done."""
  def cond(carry):
    i, s = carry
    return (i < num_steps) & jnp.any(~s.done_S)

  rope_table = qwen.rotary_table(config, qwen.cache_length(state.cache))  # once, outside the loop

  def body(carry):
    i, s = carry
    return i + 1, step_fn(config, params, s, rope_table)[0]

  return jax.lax.while_loop(cond, body, (jnp.int32(0), state))[1]


def generate_fn(config: QwenConfig, params, state: DecodeState):
  """One step, plus JetStream's result layout: [S, 3] = (token, valid, length so far). No rotary
  table (JetStream calls this once per step, so one would be rebuilt every call)."""
  state, tokens_S, active_S = step_fn(config, params, state)
  return state, jnp.stack([tokens_S, active_S.astype(jnp.int32), state.num_generated_S], axis=1)


def init_state_fn(config: QwenConfig, num_slots, cache_len, max_new_tokens, max_len, stop_tokens_X,
                  temperature, top_p, top_k) -> DecodeState:
  S, N = num_slots, max_new_tokens
  return DecodeState(
      cache=qwen.init_cache(config, S, cache_len), tokens_S=jnp.zeros((S,), jnp.int32),
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
class Sampler:
  """The jitted core bound to one model config, one (sampler) mesh and its logical-axis rules.

  Holds the current parameter snapshot (`params`, in the `qwen.unstack_layers` layout: one tree
  per layer) and its `snapshot_version`; `refresh` replaces both. Every method that takes a
  DecodeState donates it: use the returned state.
  """

  def __init__(self, config: QwenConfig, *, mesh: Optional[jax.sharding.Mesh] = None, rules=None,
               num_slots: int = 8, max_prefill_length: int = 256, max_new_tokens: int = 256):
    self.config = config
    self.mesh = mesh or parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1])
    self.rules = tuple(rules or parallel.DEFAULT_RULES)
    self.num_slots = int(num_slots)
    self.max_prefill_length = int(max_prefill_length)
    self.max_new_tokens = int(max_new_tokens)
    if self.num_slots < 1 or self.max_prefill_length < 1 or self.max_new_tokens < 1:
      raise ValueError(f"num_slots={num_slots}, max_prefill_length={max_prefill_length} and "
                       f"max_new_tokens={max_new_tokens} must all be >= 1")
    batch_shards = self._batch_shards()
    if self.num_slots % batch_shards:
      raise ValueError(f"num_slots={num_slots} must be a multiple of the {batch_shards} devices the "
                       f"sampler mesh {dict(self.mesh.shape)} splits the slot axis over")
    self.params = None
    self.snapshot_version = 0
    self.last_refresh_seconds = float("nan")

    # The trainer's (stacked) layout on this mesh, and the snapshot's per-layer layout.
    self.param_shardings = parallel.logical_to_sharding(qwen.param_logical_axes(config), self.mesh, self.rules)
    self.snapshot_shardings = parallel.logical_to_sharding(qwen.unstacked_logical_axes(config), self.mesh,
                                                           self.rules)
    spec = lambda *names: parallel.logical_to_sharding(PartitionSpec(*names), self.mesh, self.rules)  # noqa: E731
    repl = NamedSharding(self.mesh, PartitionSpec())
    slot_axis = "cache_batch"
    cache_state = qwen.KVCache(*(spec(*axes) for axes in qwen.CACHE_LOGICAL_AXES))
    cache_prefix = qwen.KVCache(*(spec(None, *axes[1:]) for axes in qwen.CACHE_LOGICAL_AXES))
    layers = range(config.num_layers)
    per_slot, per_slot_row = spec(slot_axis), spec(slot_axis, None)
    self.state_shardings = DecodeState(
        cache=tuple(cache_state for _ in layers), tokens_S=per_slot, positions_S=per_slot,
        num_generated_S=per_slot, max_new_S=per_slot, done_S=per_slot, uniforms_SxN=per_slot_row,
        out_tokens_SxN=per_slot_row, out_logp_SxN=per_slot_row, stop_tokens_X=repl, temperature=repl,
        top_p=repl, top_k=repl, max_len=repl)
    self.prefix_shardings = Prefix(tuple(cache_prefix for _ in layers), repl, repl)

    c = config
    self._prefill = jax.jit(functools.partial(prefill_fn, c), out_shardings=self.prefix_shardings)
    self._insert = jax.jit(insert_fn, donate_argnums=(1,), out_shardings=self.state_shardings)
    self._decode = jax.jit(functools.partial(decode_fn, c), donate_argnums=(1,), out_shardings=self.state_shardings)
    self._generate = jax.jit(functools.partial(generate_fn, c), donate_argnums=(1,),
                             out_shardings=(self.state_shardings, repl))
    self._init_state = jax.jit(functools.partial(init_state_fn, c), static_argnums=(0, 1, 2),
                               out_shardings=self.state_shardings)
    self._grow = jax.jit(lambda s, n: s._replace(cache=qwen.grow_cache(s.cache, n)), static_argnums=1,
                         out_shardings=self.state_shardings)
    self._gather = jax.jit(lambda s, idx: (s.out_tokens_SxN[idx], s.out_logp_SxN[idx], s.num_generated_S[idx]))
    self._cast = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(c.jnp_param_dtype), p))
    self._unstack = jax.jit(qwen.unstack_layers, out_shardings=self.snapshot_shardings)

  def _batch_shards(self) -> int:
    return parallel.axis_size(self.mesh, self.rules, "cache_batch")

  def _ctx(self):
    return parallel.sharding_context(self.mesh, self.rules)

  @staticmethod
  def _check_layout(params):
    if not qwen.is_per_layer(params):
      raise ValueError("params are not in the sampler's per-layer layout: use sampler.params, or "
                       "sampler.prepare(trainer_params)")

  # ---- parameters
  def refresh(self, trainer_params):
    """New snapshot from the trainer's params (see `prepare`). Bumps `snapshot_version` and records
    the wall time (blocked until the copy is done) in `last_refresh_seconds`."""
    start = time.perf_counter()
    return self._install(self.prepare(trainer_params), start)

  def prepare(self, trainer_params):
    """Trainer-layout params -> the sampler's: cast to the sampler dtype, a device-to-device
    reshard onto the sampler mesh (never through host memory), then split into per-layer trees.
    Params already in the sampler's layout are returned as they are."""
    if qwen.is_per_layer(trainer_params):
      return trainer_params
    trainer_params = nn.unbox(trainer_params)
    if jax.tree.structure(trainer_params) != jax.tree.structure(self.param_shardings):
      raise ValueError("the params tree does not match the sampler's model config "
                       f"(expected {jax.tree.structure(self.param_shardings)})")
    needs_cast = any(x.dtype != self.config.jnp_param_dtype for x in jax.tree.leaves(trainer_params))
    params = parallel.reshard(self._cast(trainer_params) if needs_cast else trainer_params, self.param_shardings)
    return self._unstack(params)

  def load(self, path: str):
    """Load an HF checkpoint straight onto the sampler mesh as a new snapshot."""
    from oapl_jax.models import hf  # local: only needed when loading from disk
    start = time.perf_counter()
    config, params = hf.load(path, mesh=self.mesh, dtype=self.config.param_dtype,
                             compute_dtype=self.config.dtype, rules=self.rules)
    arch = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
            "head_dim", "tie_word_embeddings", "qkv_bias", "qk_norm")
    if any(getattr(config, f) != getattr(self.config, f) for f in arch):
      raise ValueError(f"{path}: checkpoint architecture {config} does not match the sampler's {self.config}")
    return self._install(self._unstack(params), start)

  def _install(self, params, start: float):
    """Make `params` the current snapshot: wait for the copy, record its time, bump the version."""
    jax.block_until_ready(params)
    self.last_refresh_seconds = time.perf_counter() - start
    self.params = params
    self.snapshot_version += 1
    return params

  # ---- decode state
  def init_decode_state(self, *, max_len: Optional[int] = None, max_new_tokens: Optional[int] = None,
                        temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                        stop_tokens: Sequence[int] = (), cache_len: Optional[int] = None) -> DecodeState:
    """All slots empty. max_len (the longest prompt + response a slot holds) defaults to
    max_prefill_length + max_new_tokens. The cache starts at cache_len positions (default max_len)
    and must be grown (`grow_cache`) before any slot's position reaches its length."""
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
      raise ValueError(f"need temperature >= 0, 0 < top_p <= 1, top_k >= 0; got {temperature}, {top_p}, {top_k}")
    n = int(max_new_tokens or self.max_new_tokens)
    max_len = int(max_len or self.max_prefill_length + n)
    cache_len = int(cache_len or max_len)
    if not 1 <= cache_len <= max_len:
      raise ValueError(f"cache_len={cache_len} must be in [1, max_len={max_len}]")
    stops = np.full((max(1, len(stop_tokens)),), -1, np.int32)
    stops[:len(stop_tokens)] = list(stop_tokens)
    with self._ctx():
      return self._init_state(self.num_slots, cache_len, n, max_len, stops, temperature, top_p, top_k)

  def grow_cache(self, state: DecodeState, cache_len: int) -> DecodeState:
    """The same state with its cache zero-padded to cache_len positions (no-op if already that long)."""
    if cache_len <= qwen.cache_length(state.cache):
      return state
    with self._ctx():
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
    with self._ctx():
      return self._prefill(params, tokens, lengths_B)

  def insert(self, prefix: Prefix, state: DecodeState, slots, rows, keys, max_new=None) -> DecodeState:
    """Start samples: prefix row rows[i] -> slot slots[i] with base key keys[i]. Donates `state`."""
    slots, rows = np.asarray(slots, np.int32), np.asarray(rows, np.int32)
    if len(slots) > self.num_slots:
      raise ValueError(f"insert: {len(slots)} samples for {self.num_slots} slots")
    if qwen.cache_length(prefix.cache) > qwen.cache_length(state.cache):
      raise ValueError(f"insert: a prefix of {qwen.cache_length(prefix.cache)} positions does not fit the state's "
                       f"cache of {qwen.cache_length(state.cache)}: grow_cache first")
    pad = self.num_slots - len(slots)  # always S entries: one compile per prefix shape
    max_new = np.broadcast_to(np.asarray(state.out_tokens_SxN.shape[1] if max_new is None else max_new,
                                         np.int32), slots.shape)
    slots = np.concatenate([slots, np.full((pad,), self.num_slots, np.int32)])
    rows = np.concatenate([rows, np.zeros((pad,), np.int32)])
    keys = jnp.concatenate([jnp.asarray(keys, jnp.uint32).reshape(-1, 2), jnp.zeros((pad, 2), jnp.uint32)])
    max_new = np.concatenate([max_new, np.zeros((pad,), np.int32)])
    with self._ctx():
      return self._insert(prefix, state, slots, rows, keys, max_new)

  def decode(self, params, state: DecodeState, num_steps: int) -> DecodeState:
    """Up to num_steps decode steps on device (early exit when all slots are done). Donates `state`."""
    self._check_layout(params)
    with self._ctx():
      return self._decode(params, state, np.int32(num_steps))

  def generate(self, params, state: DecodeState):
    """One step; returns (state, data [S, 3] int32 = token, valid, length). Donates `state`."""
    self._check_layout(params)
    with self._ctx():
      return self._generate(params, state)

  def gather(self, state: DecodeState, slots: Sequence[int]):
    """Host copies of (tokens [M, N], logp [M, N], num_generated [M]) for `slots`."""
    idx = np.zeros((pow2(len(slots)),), np.int32)
    idx[:len(slots)] = slots
    tokens, logp, n = jax.device_get(self._gather(state, idx))
    return tokens[:len(slots)], logp[:len(slots)], n[:len(slots)]

  sample_keys = staticmethod(sample_keys)
