"""Sampler core + rollout driver against independent references: the trainer forward (decoder.token_logprobs /
decoder.logits), numpy top-k/top-p renormalisation, a chi-square test, and decoding each sample alone. The draw
alone is tests/sampler_sampling_test.py."""
import functools

import jax
import numpy as np
import pytest
import scipy.special
import scipy.stats

from oapl_jax import parallel
from oapl_jax.models import api, decoder, decoder_cached, hf
from oapl_jax.sampler import api as sampler_api, buckets, core, rollout
from oapl_jax.sampler.sampling import sample_tokens
from oapl_jax.sampler.settings import SamplingSettings
from tests.hf_fixtures import make_hf_checkpoint

PROMPTS = [[5, 17, 33], [200, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [42], [7, 7, 7, 7, 7, 7]]
STOPS = list(range(100, 120))  # ~8% of the vocabulary: some samples stop, some run to the limit


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  path = tmp_path_factory.mktemp("qwen3")
  make_hf_checkpoint(path, "qwen3", seed=0)
  return str(path)


@pytest.fixture(scope="module")
def model(ckpt):
  return hf.load(ckpt)


def _sampler(config, params, **kw):
  kw = dict(num_slots=4, max_prefill_length=16, max_new_tokens=12) | kw
  sampler = core.Sampler(api.for_config(config), **kw)
  sampler.refresh(params)
  return sampler


def _generate(sampler, params, prompts, group_size, *, seed, prompt_ids=None, **settings):
  """generate_groups with the sampling settings as keyword arguments."""
  return rollout.generate_groups(sampler, params, prompts, group_size, SamplingSettings(**settings), seed=seed,
                                 prompt_ids=prompt_ids)


@pytest.fixture(scope="module")
def sampler(model):
  """One f32 sampler (4 slots) shared by the tests, so its jitted functions compile once."""
  return _sampler(*model)


L_REF = 32  # fixed padded length for reference forwards: one compile for all tests


@functools.partial(jax.jit, static_argnums=(1, 3))
def _ref_token_logprobs(params, config, tokens_BxL, temperature):
  return decoder.token_logprobs(params, config, tokens_BxL[:, :-1], tokens_BxL[:, 1:], temperature=temperature)


@functools.partial(jax.jit, static_argnums=(1,))
def _ref_logits(params, config, tokens_BxL):
  return decoder.logits(params, config, tokens_BxL)


def _padded(seqs):
  tokens = np.zeros((buckets.pow2(len(seqs)), L_REF), np.int32)
  for i, seq in enumerate(seqs):
    tokens[i, :len(seq)] = seq
  return tokens


def _sequences(groups, p, g):
  n = groups.lengths[p, g]
  return list(groups.prompt_tokens[p, :groups.prompt_lengths[p]]) + list(groups.response_tokens[p, g, :n])


def _trainer_logp(params, config, groups, temperature):
  """Trainer forward over every (prompt + response), response positions only -> [P, G, N]."""
  P, G, N = groups.response_tokens.shape
  seqs = [_sequences(groups, p, g) for p in range(P) for g in range(G)]
  logp = np.asarray(_ref_token_logprobs(params, config, _padded(seqs), temperature))
  out = np.zeros((P, G, N), np.float32)
  for i, (p, g) in enumerate((p, g) for p in range(P) for g in range(G)):
    start = groups.prompt_lengths[p] - 1
    out[p, g, :groups.lengths[p, g]] = logp[i, start:start + groups.lengths[p, g]]
  return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logp_matches_trainer_forward_f32(model, sampler, temperature):
  config, params = model
  groups = _generate(sampler, sampler.params, PROMPTS, 3, max_new_tokens=12, seed=1,
                                   temperature=temperature, stop_tokens=STOPS, steps_per_sync=5)
  ref = _trainer_logp(params, config, groups, temperature)
  np.testing.assert_allclose(groups.sampler_logp, ref, atol=1e-4)
  # Masks, lengths and finish reasons are consistent with the tokens.
  assert groups.snapshot_version == 1 and groups.num_tokens == groups.lengths.sum()
  for p in range(len(PROMPTS)):
    for g in range(3):
      n = groups.lengths[p, g]
      assert groups.response_mask[p, g].sum() == n and not groups.sampler_logp[p, g, n:].any()
      stopped = groups.response_tokens[p, g, n - 1] in STOPS
      assert not set(groups.response_tokens[p, g, :n - 1]) & set(STOPS)
      assert groups.finish_reason[p, g] == (sampler_api.FINISH_STOP if stopped else sampler_api.FINISH_LENGTH)
      assert stopped or n == 12
  assert {"stop", "length"} <= set(groups.finish_reason_names.ravel())


def test_logp_gap_bf16_sampler(model, record_property):
  """bf16 sampler vs f32 trainer: a metric, not an assertion (beyond finiteness)."""
  config, params = model
  sampler = _sampler(config.replace(param_dtype="bfloat16", dtype="bfloat16"), params)
  groups = _generate(sampler, sampler.params, PROMPTS, 2, max_new_tokens=12, seed=2)
  ref = _trainer_logp(params, config, groups, 1.0)
  gap = np.abs(groups.sampler_logp - ref)[groups.response_mask]
  record_property("bf16_logp_gap_max", float(gap.max()))
  record_property("bf16_logp_gap_mean", float(gap.mean()))
  print(f"bf16 sampler vs f32 trainer token log-prob gap: max {gap.max():.4f}, mean {gap.mean():.5f}")
  assert np.isfinite(gap).all()


def test_continuous_batching_equals_each_sample_alone(model, sampler):
  """Four slots, refilled every 3 steps on a growing cache == one slot on a full-length cache."""
  config, params = model
  many = sampler
  groups = _generate(many, many.params, PROMPTS, 3, max_new_tokens=10, seed=7,
                                   stop_tokens=STOPS, steps_per_sync=3)
  alone = _sampler(config, params, num_slots=1)
  for p, prompt in enumerate(PROMPTS):
    ref = _generate(alone, alone.params, [prompt], 3, max_new_tokens=10, seed=7,
                                  stop_tokens=STOPS, prompt_ids=[p], steps_per_sync=16, grow_cache=False)
    np.testing.assert_array_equal(groups.lengths[p], ref.lengths[0])
    np.testing.assert_array_equal(groups.response_tokens[p], ref.response_tokens[0])
    np.testing.assert_allclose(groups.sampler_logp[p], ref.sampler_logp[0], atol=1e-5)
  assert len({tuple(groups.response_tokens[0, g]) for g in range(3)}) == 3  # samples differ


def test_a_prefill_cap_splits_the_calls_into_few_shapes_and_samples_alike(model):
  """max_prefill_batch = 2: six 1-sample prompts of one length bucket fill 8 slots in three prefill calls of at most
  two rows (not one of 8), the same tokens as without the cap; capped, the eval's, the rollouts' and the probe's
  prefills share one program where uncapped they compile one per power of two of the free slots' prompts."""
  config, params = model
  prompts = [[5, 17, 33], [42], [7, 7, 7, 7, 7, 7], [9, 8], [3, 3, 3], [1, 2, 3, 4, 5]]  # all in bucket 8
  run = lambda s, group: _generate(s, s.params, prompts, group, max_new_tokens=4, seed=3)  # noqa: E731
  capped, wide = (_sampler(config, params, num_slots=8, max_prefill_batch=cap) for cap in (2, 0))
  out_capped, out_wide = run(capped, 1), run(wide, 1)
  assert (out_capped.num_prefill_calls, out_wide.num_prefill_calls) == (3, 1)
  np.testing.assert_array_equal(out_capped.response_tokens, out_wide.response_tokens)
  np.testing.assert_allclose(out_capped.sampler_logp, out_wide.sampler_logp, atol=1e-5)
  for group in (2, 4):  # 4 and 2 prompts fill the 8 slots
    run(capped, group), run(wide, group)
  assert capped._prefill._cache_size() == 1 and wide._prefill._cache_size() == 3  # rows 2 / rows 8, 4, 2
  assert capped._insert._cache_size() == 1 and wide._insert._cache_size() == 3
  assert buckets.prefill_chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
  assert buckets.prefill_chunks([1, 2, 3], 0) == [[1, 2, 3]] and buckets.prefill_chunks([], 4) == []
  keys = capped.slot_keys(3, [4, 5, 6], [0, 1, 2])  # num_slots rows whatever the count: one program
  assert keys.shape == (8, 2)
  np.testing.assert_array_equal(keys[:3], core.sample_keys(3, [4, 5, 6], [0, 1, 2]))
  with pytest.raises(ValueError, match="9 samples for 8 slots"):
    capped.slot_keys(3, range(9), range(9))
  with pytest.raises(ValueError, match="max_prefill_batch=-1"):
    core.Sampler(api.for_config(config), max_prefill_batch=-1)


def test_a_one_slot_sampler_decodes_in_more_rows_where_its_platform_asks_and_samples_alike(model, monkeypatch):
  """MIN_DECODE_ROWS (2 on GPUs, where a one-row step is slower than a two-row one): one slot then decodes in a
  two-row state whose extra row stays empty, with the same tokens and log-probs as a one-row state."""
  config, params = model
  prompts = [[5, 17, 33], [42, 9]]
  run = lambda s: _generate(s, s.params, prompts, 2, max_new_tokens=5, seed=4)  # noqa: E731
  one_row = _sampler(config, params, num_slots=1)
  monkeypatch.setitem(core.MIN_DECODE_ROWS, "cpu", 2)
  two_rows = _sampler(config, params, num_slots=1)
  assert (one_row.decode_rows, two_rows.decode_rows, two_rows.num_slots) == (1, 2, 1)
  assert two_rows.init_decode_state(SamplingSettings(max_new_tokens=5)).done_S.shape == (2,)
  a, b = run(one_row), run(two_rows)
  np.testing.assert_array_equal(a.response_tokens, b.response_tokens)
  np.testing.assert_allclose(a.sampler_logp, b.sampler_logp, atol=1e-5)
  assert two_rows.slot_keys(4, [0], [0]).shape == (2, 2)
  state = two_rows.init_decode_state(SamplingSettings(max_new_tokens=5))
  state = two_rows.insert(two_rows.prefill(two_rows.params, [[5, 17, 33]]), state, [0], [0],
                          two_rows.slot_keys(4, [0], [0]))
  assert np.asarray(state.done_S).tolist() == [False, True]  # the extra row is never filled
  with pytest.raises(ValueError, match="2 samples for 1 slots"):
    two_rows.slot_keys(4, [0, 1], [0, 1])


def test_a_tied_table_is_kept_transposed_for_the_logits_where_the_platform_asks_and_samples_alike(tmp_path,
                                                                                                 monkeypatch):
  """TRANSPOSED_TABLE_AT (float32 on CPU): a tied model's snapshot keeps the table's [E, V] transpose beside it for
  the logits, and samples and scores as from the table itself; the trainer's forward is the log-probs' reference.
  A bfloat16 sampler keeps no copy."""
  make_hf_checkpoint(tmp_path, "qwen3", tie=True, seed=3)
  config, params = hf.load(str(tmp_path))
  assert config.tie_word_embeddings
  run = lambda s: _generate(s, s.params, PROMPTS, 2, max_new_tokens=6, seed=5)  # noqa: E731
  tensor_parallel = parallel.Layout(parallel.make_mesh((1, 1, 2), devices=jax.devices()[6:]))
  transposed = _sampler(config, params, layout=tensor_parallel)  # the copy sharded as the table is, over V
  assert decoder_cached.TRANSPOSED_TABLE not in _sampler(config.replace(param_dtype="bfloat16", dtype="bfloat16"),
                                                  params).params
  monkeypatch.setattr(core, "TRANSPOSED_TABLE_AT", set())
  plain = _sampler(config, params)
  assert decoder_cached.TRANSPOSED_TABLE not in plain.params
  copy = transposed.params[decoder_cached.TRANSPOSED_TABLE]
  np.testing.assert_array_equal(copy, np.asarray(params["embed"]["embedding"]).T)
  assert tuple(copy.sharding.spec) == tuple(transposed.params["embed"]["embedding"].sharding.spec)[::-1]
  a, b = run(plain), run(transposed)
  np.testing.assert_array_equal(a.response_tokens, b.response_tokens)
  np.testing.assert_allclose(b.sampler_logp, a.sampler_logp, atol=1e-5)
  np.testing.assert_allclose(b.sampler_logp, _trainer_logp(params, config, b, 1.0), atol=1e-4)
  score = lambda s: s.score(s.params, PROMPTS[:2], [[3, 4, 5], [6]], 0.8)  # noqa: E731
  for x, y in zip(score(plain), score(transposed)):
    np.testing.assert_allclose(y, x, atol=1e-5)


def _numpy_filtered_logp(logits_V, temperature, top_p, top_k):
  """Reference: temperature, then top-k, then top-p; renormalised log-probs (-inf outside)."""
  z = logits_V.astype(np.float64) / temperature
  order = np.argsort(-z)[:top_k or len(z)]
  p = scipy.special.softmax(z[order])
  n = int(np.sum(np.cumsum(p) - p < top_p)) if top_p < 1 else len(order)
  allowed = order[:max(n, 1)]
  out = np.full_like(z, -np.inf)
  out[allowed] = z[allowed] - scipy.special.logsumexp(z[allowed])
  return out


@pytest.mark.parametrize("top_p,top_k", [(1.0, 5), (0.5, 0), (0.8, 20)])
def test_top_k_top_p_sample_allowed_set_with_renormalised_logp(model, sampler, top_p, top_k):
  config, params = model
  T = 0.8
  groups = _generate(sampler, sampler.params, PROMPTS[:3], 4, max_new_tokens=6, seed=3,
                                   temperature=T, top_p=top_p, top_k=top_k)
  pairs = [(p, g) for p in range(3) for g in range(4)]
  all_logits = np.asarray(_ref_logits(params, config, _padded([_sequences(groups, p, g) for p, g in pairs])))
  checked = 0
  for i, (p, g) in enumerate(pairs):
    start = groups.prompt_lengths[p] - 1
    for t in range(groups.lengths[p, g]):
      ref = _numpy_filtered_logp(all_logits[i, start + t], T, top_p, top_k)
      token = groups.response_tokens[p, g, t]
      assert np.isfinite(ref[token]), f"token {token} outside the top-k/top-p set"
      # A nucleus whose edge lies within float noise of top_p (the sampler's float32 logits and cumulative sum
      # against this float64 reference) may hold one token more or less there: its normaliser is not compared.
      edges = [np.isfinite(_numpy_filtered_logp(all_logits[i, start + t], T, q, top_k)).sum()
               for q in (top_p - 1e-4, min(top_p + 1e-4, 1.0))]
      if edges[0] == edges[1]:
        np.testing.assert_allclose(groups.sampler_logp[p, g, t], ref[token], atol=1e-4)
        checked += 1
  assert checked >= 48  # of the 12 samples' ~70 tokens, nearly all (4 or fewer sit on an edge here)


def test_plain_sampling_matches_model_distribution_chisquare(model):
  config, params = model
  logits_V = np.asarray(decoder.logits(params, config, np.array([PROMPTS[0]])))[0, -1]
  n = 20000
  uniforms = jax.random.uniform(jax.random.PRNGKey(0), (n,))
  tokens, logp = sample_tokens(np.broadcast_to(logits_V, (n, logits_V.size)), uniforms, 1.0, 1.0, 0)
  tokens, logp = np.asarray(tokens), np.asarray(logp)
  probs = scipy.special.softmax(logits_V.astype(np.float64))
  np.testing.assert_allclose(logp, np.log(probs[tokens]), atol=1e-5)
  expected = n * probs
  big = expected >= 5  # pool the rare tokens into one bin
  observed = np.bincount(tokens, minlength=logits_V.size)
  f_obs, f_exp = observed[big], expected[big]
  if (~big).any():
    f_obs, f_exp = np.append(f_obs, observed[~big].sum()), np.append(f_exp, expected[~big].sum())
  assert scipy.stats.chisquare(f_obs, f_exp).pvalue > 1e-3


@pytest.mark.devices(8)
def test_refresh_reshards_trainer_params_and_bumps_version(model, tmp_path):
  config, params1 = model
  make_hf_checkpoint(tmp_path, "qwen3", seed=1)
  trainer_mesh = parallel.make_mesh((1, -1, 1))  # FSDP over all 8 devices
  _, params2 = hf.load(str(tmp_path), mesh=trainer_mesh)
  sampler_mesh = parallel.make_mesh((1, 1, 2), devices=jax.devices()[6:])
  sampler = core.Sampler(api.for_config(config), layout=parallel.Layout(sampler_mesh), num_slots=4,
                         max_prefill_length=16, max_new_tokens=8)
  sampler.refresh(params1)
  before = _generate(sampler, sampler.params, PROMPTS, 1, max_new_tokens=8, seed=0, temperature=0)
  new = sampler.refresh(params2)
  refresh_time = sampler.last_refresh_seconds  # NaN until a refresh has been measured
  assert sampler.snapshot_version == 2 and np.isfinite(refresh_time)
  assert sampler.last_refresh_bytes == sum(x.nbytes for x in jax.tree.leaves(params2))  # one copy of the weights
  leaf = new["layers"][0]["mlp"]["up_proj"]["kernel"]  # the snapshot holds one tree per layer
  assert leaf.sharding.mesh.devices.tolist() == sampler_mesh.devices.tolist()
  after = _generate(sampler, sampler.params, PROMPTS, 2, max_new_tokens=8, seed=0)
  assert after.snapshot_version == 2
  np.testing.assert_allclose(after.sampler_logp, _trainer_logp(params2, config, after, 1.0), atol=1e-4)
  greedy = _generate(sampler, sampler.params, PROMPTS, 1, max_new_tokens=8, seed=0, temperature=0)
  assert (greedy.response_tokens != before.response_tokens).any()
  other_params = jax.device_put(params1, sampler.param_shardings)
  other = _generate(sampler, other_params, PROMPTS[:1], 1, max_new_tokens=2, seed=0)
  assert other.snapshot_version == -1  # params that are not the sampler's snapshot are unversioned


@pytest.mark.parametrize("prompts,group_size,match", [
    ([[1, 2], []], 2, "prompt 1 is empty"),
    ([list(range(17))], 2, "more than max_prefill_length"),
    ([[1, 2]], 0, "group_size"),
    ([[1, 256]], 2, "vocabulary"),
    ([[-1, 3]], 2, "vocabulary"),
    ([], 2, "prompts is empty"),
])
def test_bad_inputs_raise_clear_errors(sampler, prompts, group_size, match):
  with pytest.raises(ValueError, match=match):
    _generate(sampler, sampler.params, prompts, group_size, max_new_tokens=4, seed=0)


def test_snapshot_is_per_layer_and_the_jitted_core_refuses_the_trainer_layout(model, sampler):
  config, params = model
  snapshot = sampler.params
  assert len(snapshot["layers"]) == config.num_layers
  np.testing.assert_array_equal(snapshot["layers"][1]["mlp"]["down_proj"]["kernel"],
                                params["layers"]["mlp"]["down_proj"]["kernel"][1])
  assert sampler.prepare(snapshot) is snapshot  # already in the sampler's layout
  with pytest.raises(ValueError, match="decode layout"):
    sampler.prefill(params, [[1, 2, 3]])


def test_decoding_on_a_growing_cache_equals_decoding_on_the_full_one(sampler):
  """Same prompts, seeds and steps: a state whose cache starts at 16 positions and is grown
  twice mid-flight yields the tokens and log-probs of a state holding all 40 from the start."""
  prefix = sampler.prefill(sampler.params, PROMPTS)
  keys = sampler.sample_keys(3, range(4), [0] * 4)

  def run(cache_len, plan):
    state = sampler.init_decode_state(SamplingSettings(max_new_tokens=24), max_len=40, cache_len=cache_len)
    state = sampler.insert(prefix, state, range(4), range(4), keys)
    for grow_to, steps in plan:
      state = sampler.grow_cache(state, grow_to)
      state = sampler.decode(sampler.params, state, steps)
    assert sampler.cache_length(state) == 40 and bool(np.asarray(state.done_S).all())
    return np.asarray(state.out_tokens_SxN), np.asarray(state.out_logp_SxN)

  # The longest prompt has 11 tokens, so the first step writes position 10; the last, 10 + 23 = 33.
  grown = run(16, [(16, 5), (24, 8), (40, 11)])
  full = run(40, [(40, 24)])
  np.testing.assert_array_equal(grown[0], full[0])
  np.testing.assert_allclose(grown[1], full[1], atol=1e-5)
  with pytest.raises(ValueError, match="cache_len"):
    sampler.init_decode_state(SamplingSettings(max_new_tokens=12), max_len=40, cache_len=41)


def test_scoring_memory_is_bounded_by_the_chunk_not_by_rows_times_positions():
  """Sampler.score projects onto the vocabulary in chunks of logprob_chunk_tokens: one [64, V] float32 block
  is 8 MiB at V = 32768, and scoring 16 rows instead of 4 adds less than half of one block
  to XLA's temporary memory, where whole [B, T, V] logits would add 48 blocks (T = 65: 64 scored positions)."""
  from oapl_jax.models.qwen.config import QwenConfig
  V, T = 32768, 65
  config = QwenConfig.tiny(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                           num_kv_heads=1, head_dim=16, logprob_chunk_tokens=64)
  model = api.for_config(config)
  snapshot = jax.eval_shape(lambda: model.decode_params(model.init_params(jax.random.PRNGKey(0))))
  snapshot = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), snapshot,
                          is_leaf=lambda x: hasattr(x, "shape"))
  score = jax.jit(functools.partial(core.score_fn, model), static_argnums=(2,))

  def temp(rows):
    tokens = jax.ShapeDtypeStruct((rows, T), np.int32)
    return score.lower(snapshot, tokens, 1.0).compile().memory_analysis().temp_size_in_bytes

  block = 64 * V * 4
  temp_4, temp_16 = temp(4), temp(16)
  assert temp_4 > block  # the block is really in the measure
  assert temp_16 - temp_4 < block / 2, (temp_4, temp_16)


def test_an_interrupt_ends_generate_between_decode_visits_and_leaves_the_sampler_whole(sampler):
  """`interrupt` is asked before every visit to the decode loop: True ends the call with Interrupted (here at
  its second visit of three), and the next call, uninterrupted, gives what it gives alone."""
  want = _generate(sampler, None, PROMPTS, 3, seed=11, max_new_tokens=12)
  asked = []
  sampler.interrupt = lambda: asked.append(1) or len(asked) > 1
  try:
    with pytest.raises(sampler_api.Interrupted):
      _generate(sampler, None, PROMPTS, 3, seed=11, max_new_tokens=12)
  finally:
    sampler.interrupt = None
  assert len(asked) == 2 and want.num_decode_calls == 3
  got = _generate(sampler, None, PROMPTS, 3, seed=11, max_new_tokens=12)
  np.testing.assert_array_equal(got.response_tokens, want.response_tokens)


def test_cpu_compile_options_reach_the_samplers_programs_and_fast_start_decodes_alike(model, sampler, monkeypatch):
  """The layout's XLA options (mesh.cpu_compile) reach the sampler's programs (an unknown option fails the first
  one), and a 'fast_start' sampler decodes the same tokens with the same log-probs as XLA's defaults."""
  config, params = model
  monkeypatch.setenv("XLA_FLAGS", "")  # no flag of the environment's to win over the layout's (the suite sets -O0)
  fast = _sampler(config, params, layout=parallel.Layout(parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1]),
                                                          cpu_compile="fast_start"))
  a, b = (_generate(s, s.params, PROMPTS, 2, max_new_tokens=6, seed=3, temperature=0.8) for s in (sampler, fast))
  np.testing.assert_array_equal(a.response_tokens, b.response_tokens)
  np.testing.assert_allclose(a.sampler_logp, b.sampler_logp, atol=1e-5)
  monkeypatch.setitem(parallel.CPU_COMPILE, "bogus", {"xla_no_such_option": True})
  bogus = parallel.Layout(parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1]), cpu_compile="bogus")
  with pytest.raises(Exception, match="xla_no_such_option"):
    _sampler(config, params, layout=bogus)
