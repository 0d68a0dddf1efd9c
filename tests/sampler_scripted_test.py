"""The sampler interface (sampler/api.py) and its scripted backend: the contract both backends keep (versions kept
inside, one refusal for a bad request, a sample that depends only on its key and the snapshot), and the scripted
sampler's log-probs, which are exactly those of the uniform policy it samples from."""
import math

import jax.numpy as jnp
import numpy as np
import pytest

from oapl_jax.models import api as model_api
from oapl_jax.models.families import preset
from oapl_jax.sampler import api, core, scripted
from oapl_jax.sampler.settings import SamplingSettings

V = 16
SETTINGS = SamplingSettings(max_new_tokens=6, stop_tokens=(3,))
PROMPTS = [[1, 5, 7], [2, 9], [4, 4, 4, 4]]


def _params(scale=1.0):
  return {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4) * scale, "b": jnp.ones((4,), jnp.float32)}


def _scripted(**kw):
  sampler = scripted.ScriptedSampler(V, max_prefill_length=8, max_new_tokens=6, **kw)
  sampler.refresh(_params())
  return sampler


def test_both_backends_are_group_samplers():
  model = model_api.for_config(preset("tiny", vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=1,
                                      num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=32))
  assert isinstance(core.Sampler(model, num_slots=2, max_prefill_length=8, max_new_tokens=4), api.GroupSampler)
  assert isinstance(_scripted(), api.GroupSampler)


def test_versions_live_inside_the_sampler():
  sampler = scripted.ScriptedSampler(V, max_prefill_length=8, max_new_tokens=6, snapshot_version=4)
  assert sampler.snapshot_version == 4 and sampler.params is None  # a resumed run's count goes on from its meta
  sampler.refresh(_params())
  assert sampler.snapshot_version == 5
  sampler.refresh(_params(2.0), version=9)  # a saved snapshot comes back at its own version
  assert sampler.snapshot_version == 9
  assert sampler.generate(PROMPTS, 2, SETTINGS, seed=0).snapshot_version == 9
  other = sampler.generate(PROMPTS, 2, SETTINGS, seed=0, params=_params(3.0))
  assert other.snapshot_version == -1  # params that are not the snapshot: unversioned, as core.Sampler's


def test_a_sample_depends_on_its_key_and_the_snapshot_only():
  sampler = _scripted()
  whole = sampler.generate(PROMPTS, 3, SETTINGS, seed=5, prompt_ids=[10, 11, 12])
  alone = sampler.generate(PROMPTS[1:2], 3, SETTINGS, seed=5, prompt_ids=[11])
  np.testing.assert_array_equal(alone.response_tokens[0], whole.response_tokens[1])
  assert not np.array_equal(sampler.generate(PROMPTS, 3, SETTINGS, seed=6, prompt_ids=[10, 11, 12]).response_tokens,
                            whole.response_tokens)
  sampler.refresh(_params(1.5))  # another snapshot writes other responses (a wrong restore is visible)
  assert not np.array_equal(sampler.generate(PROMPTS, 3, SETTINGS, seed=5, prompt_ids=[10, 11, 12]).response_tokens,
                            whole.response_tokens)
  sampler.refresh(_params())  # the same params again: the same responses
  np.testing.assert_array_equal(sampler.generate(PROMPTS, 3, SETTINGS, seed=5, prompt_ids=[10, 11, 12]).response_tokens,
                                whole.response_tokens)


def test_responses_stop_at_a_stop_token_with_the_uniform_policys_log_probs():
  groups = _scripted().generate(PROMPTS * 20, 4, SETTINGS, seed=1)
  stopped = groups.finish_reason == api.FINISH_STOP
  assert stopped.any() and (~stopped).any()
  for p, g in zip(*np.nonzero(groups.lengths)):
    k = groups.lengths[p, g]
    tokens = groups.response_tokens[p, g, :k].tolist()
    assert 1 <= k <= SETTINGS.max_new_tokens
    assert (3 in tokens) == stopped[p, g] and (3 not in tokens[:-1])  # cut right after the first stop token
    assert groups.response_mask[p, g].sum() == k and not groups.response_tokens[p, g, k:].any()
  np.testing.assert_allclose(groups.sequence_logp, -groups.lengths * math.log(V), rtol=1e-6)
  scores = _scripted().score(None, PROMPTS, [[1, 2], [3]], temperature=1.0)
  np.testing.assert_allclose(np.concatenate(scores), [-math.log(V)] * 3, rtol=1e-6)


def test_the_snapshot_is_a_copy_the_trainer_cannot_donate_away():
  sampler = scripted.ScriptedSampler(V, max_prefill_length=8, max_new_tokens=6)
  params = _params()
  sampler.refresh(params)
  for x in params.values():
    x.delete()  # what a donating train step does to the trainer's buffers
  assert float(sampler.params["w"].sum()) == 66.0


@pytest.mark.parametrize("prompts, message", [([[1, 99]], "not integers in the vocabulary"),
                                              ([list(range(1, 10))], "more than max_prefill_length=8"),
                                              ([[]], "is empty")])
def test_a_bad_request_is_refused_before_any_work(prompts, message):
  with pytest.raises(ValueError, match=message):
    _scripted().generate(prompts, 2, SETTINGS, seed=0)


def test_a_script_writes_the_responses():
  sampler = _scripted(script=lambda prompt, pid, g, rng: [pid % V, g + 4, 3, 9])
  groups = sampler.generate(PROMPTS, 2, SETTINGS, seed=0, prompt_ids=[7, 8, 9])
  assert groups.response_tokens[2, 1, :groups.lengths[2, 1]].tolist() == [9, 5, 3]  # cut after the stop token 3
  with pytest.raises(ValueError, match="no token"):
    _scripted(script=lambda *a: []).generate(PROMPTS, 1, SETTINGS, seed=0)
