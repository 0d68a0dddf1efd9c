"""A group's prompt run once (models/prompt_groups.py): on every response position the packed forward gives the
log-probs, entropies and gradients of the G full rows it replaces."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oapl_jax.models import decoder
from oapl_jax.models.prompt_groups import PromptGroups, first_response_position, pack, unpack
from oapl_jax.models.qwen.config import QwenConfig

LONGEST, NEW = 5, 4  # prompt and response budgets: T = LONGEST + NEW - 1, the trainer's rule


def _batch(B, G, vocab, seed=0):
  """Right-padded [B, G, T] rows as the buffer packs them: prompt lengths 1..LONGEST (one of each end), response
  lengths 0..NEW (an empty one included), random padding after the sequence."""
  rng = np.random.RandomState(seed)
  T = LONGEST + NEW - 1
  tokens, targets = rng.randint(0, vocab, (2, B, G, T))
  mask = np.zeros((B, G, T), np.float32)
  for b in range(B):
    p = [1, LONGEST, 3][b % 3]
    prompt = rng.randint(0, vocab, p)
    for g in range(G):
      n = 0 if (b, g) == (0, 1) else rng.randint(1, NEW + 1)
      seq = np.concatenate([prompt, rng.randint(0, vocab, n)])
      tokens[b, g, :len(seq) - 1], targets[b, g, :len(seq) - 1] = seq[:-1], seq[1:]
      mask[b, g, p - 1:p - 1 + n] = 1.0
  return jnp.asarray(tokens), jnp.asarray(targets), jnp.asarray(mask)


def _both(config, tokens, targets, mask, w, u):
  """(full rows, packed groups) -> each (logp, entropy) [B, G, T] and the gradient of sum(w logp + u entropy)."""
  B, G, T = tokens.shape
  layout = PromptGroups.for_batch(LONGEST, G, T)

  def full(params):
    out = decoder.token_logprobs(params, config, tokens.reshape(B * G, T), targets.reshape(B * G, T),
                                 with_entropy=True, needed_BxT=mask.reshape(B * G, T) > 0)
    return jax.tree.map(lambda x: x.reshape(B, G, T), out)

  def packed(params):
    start = first_response_position(layout, mask)
    tok, tgt, pos, keys, needed = pack(layout, start, tokens, targets, mask)
    out = decoder.token_logprobs(params, config, tok, tgt, pos, key_mask_BxS=keys, with_entropy=True,
                                 needed_BxT=needed, prompt_groups=layout)
    return jax.tree.map(lambda x: unpack(layout, start, x, T), out)

  def with_grad(fn):
    def total(params):
      logp, entropy = fn(params)
      return jnp.sum(w * mask * logp) + jnp.sum(u * mask * entropy), (logp, entropy)
    return jax.jit(jax.value_and_grad(total, has_aux=True))

  return with_grad(full), with_grad(packed)


@pytest.mark.parametrize("attention, block", [("reference", 512), ("blockwise", 2)])
def test_packed_groups_give_the_full_rows_values_and_gradients(attention, block):
  config = QwenConfig.tiny(num_layers=2, attention=attention, attention_block_q=block, attention_block_kv=block)
  params = nn.unbox(decoder.init_params(config, jax.random.PRNGKey(0)))
  tokens, targets, mask = _batch(3, 4, config.vocab_size)
  rng = np.random.RandomState(1)
  w, u = (jnp.asarray(rng.normal(size=mask.shape), jnp.float32) for _ in range(2))
  full, packed = _both(config, tokens, targets, mask, w, u)
  (want, (want_logp, want_entropy)), want_grads = full(params)
  (got, (logp, entropy)), grads = packed(params)
  read = np.asarray(mask) > 0
  assert read.sum() > 20 and not read[0, 1].any()  # an empty response among them
  np.testing.assert_allclose(np.asarray(logp)[read], np.asarray(want_logp)[read], atol=2e-5, rtol=0)
  np.testing.assert_allclose(np.asarray(entropy)[read], np.asarray(want_entropy)[read], atol=2e-5, rtol=0)
  assert not np.asarray(logp)[~read].any()  # off the responses: 0, as the full rows' unread positions
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, wg in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(g, wg, atol=2e-5, rtol=1e-4)


def test_the_packed_row_is_shorter_by_the_repeated_prompts():
  layout = PromptGroups.for_batch(longest_prompt=7, group_size=8, seq_len=13)  # the demo's batch
  assert (layout.prompt_slots, layout.sample_slots, layout.length) == (6, 7, 62)  # against 8 x 13 = 104
  with pytest.raises(ValueError, match="longest_prompt"):
    PromptGroups.for_batch(longest_prompt=14, group_size=8, seq_len=13)


def test_kernels_that_ignore_positions_are_refused():
  config = QwenConfig.tiny(num_layers=1, attention="splash")
  params = nn.unbox(decoder.init_params(config, jax.random.PRNGKey(0)))
  tokens, targets, mask = _batch(2, 2, config.vocab_size)
  layout = PromptGroups.for_batch(LONGEST, 2, tokens.shape[-1])
  tok, tgt, pos, keys, needed = pack(layout, first_response_position(layout, mask), tokens, targets, mask)
  with pytest.raises(ValueError, match="reads positions"):
    decoder.token_logprobs(params, config, tok, tgt, pos, key_mask_BxS=keys, needed_BxT=needed,
                           prompt_groups=layout)
