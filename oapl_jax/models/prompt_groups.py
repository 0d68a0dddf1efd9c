"""Each group's prompt run once in the training forward: G rows that share a prompt packed into one row.

A train batch holds B groups of G rows [B, G, T]; a group's rows carry the same prompt, right-padded behind their
own responses, so the prompt's forward and backward run G times. `pack` lays each group out as one row

    [ prompt slots (P) | sample 0 (R) | sample 1 (R) | ... | sample G-1 (R) ]

  prompt slots: the prompt less its last token, at positions 0 .. p-2 (p: the prompt's length), the rest masked;
  sample g: row g from the prompt's last token on (its tokens, targets and read positions), at p-1 .. p+R-2.

In attention (`attend_grouped`) the prompt slots see each other and each sample's slots see the prompt and their
own, by position as ever: every position of a sample has the keys, and so the hidden state, its full row gives it,
and `unpack` puts its values back at their [B, G, T] places (0 elsewhere). The row is P + G * R positions instead
of G * T: with P = the longest prompt less one and R = T - P, every response fits (it starts at p - 1 <= P).
"""
import dataclasses

import jax
import jax.numpy as jnp

from oapl_jax.models import attention


@dataclasses.dataclass(frozen=True)
class PromptGroups:
  """The packed row's static layout."""
  prompt_slots: int  # P: the longest prompt less its last token
  group_size: int  # G
  sample_slots: int  # R = T - P

  def __post_init__(self):
    if self.prompt_slots < 0 or self.group_size < 1 or self.sample_slots < 1:
      raise ValueError(f"PromptGroups needs P >= 0, G >= 1, R >= 1; got {self}")

  @classmethod
  def for_batch(cls, longest_prompt: int, group_size: int, seq_len: int) -> "PromptGroups":
    """The layout for [B, G, seq_len] batches whose prompts have at most `longest_prompt` tokens."""
    if not 1 <= longest_prompt <= seq_len:
      raise ValueError(f"longest_prompt={longest_prompt} must be in [1, seq_len={seq_len}]")
    return cls(longest_prompt - 1, group_size, seq_len - longest_prompt + 1)

  @property
  def length(self) -> int:
    return self.prompt_slots + self.group_size * self.sample_slots


def first_response_position(layout: PromptGroups, response_mask_BxGxT) -> jax.Array:
  """[B]: p - 1, the first position whose target is a response token in any of the group's rows (0 if none),
  at most the layout's P (prompts no longer than the layout's are at most that); `pack` and `unpack` take it."""
  first_B = jnp.argmax(jnp.any(response_mask_BxGxT > 0, axis=1), axis=-1).astype(jnp.int32)
  return jnp.minimum(first_B, layout.prompt_slots)


def pack(layout: PromptGroups, start_B, tokens_BxGxT, targets_BxGxT, needed_BxGxT, positions_BxGxT=None):
  """-> (tokens, targets, positions, key_mask, needed), each [B, layout.length]; `start_B` is
  first_response_position of the batch; positions default to the index."""
  B, G, T = tokens_BxGxT.shape
  P, R = layout.prompt_slots, layout.sample_slots
  if (G, P + R) != (layout.group_size, T):
    raise ValueError(f"a [B, {G}, {T}] batch does not pack as {layout}")
  slots_BxR = start_B[:, None] + jnp.arange(R)[None, :]  # <= T - 1
  take = lambda x_BxGxT: jnp.take_along_axis(x_BxGxT, jnp.broadcast_to(slots_BxR[:, None, :], (B, G, R)),
                                             axis=2).reshape(B, G * R)  # noqa: E731
  if positions_BxGxT is None:
    positions_BxGxT = jnp.broadcast_to(jnp.arange(T), (B, G, T))
  prompt_valid_BxP = jnp.arange(P)[None, :] < start_B[:, None]
  return (jnp.concatenate([tokens_BxGxT[:, 0, :P], take(tokens_BxGxT)], axis=1),
          jnp.concatenate([jnp.zeros((B, P), targets_BxGxT.dtype), take(targets_BxGxT)], axis=1),
          jnp.concatenate([positions_BxGxT[:, 0, :P], take(positions_BxGxT)], axis=1).astype(jnp.int32),
          jnp.concatenate([prompt_valid_BxP, jnp.ones((B, G * R), bool)], axis=1),
          jnp.concatenate([jnp.zeros((B, P), bool), take(needed_BxGxT.astype(bool))], axis=1))


def unpack(layout: PromptGroups, start_B, x_BxL, seq_len: int):
  """A packed row's per-position values -> [B, G, seq_len] at the rows' own positions, 0 off the samples."""
  B = x_BxL.shape[0]
  P, G, R = layout.prompt_slots, layout.group_size, layout.sample_slots
  samples_BxGxR = x_BxL[:, P:].reshape(B, G, R)
  offset_BxT = jnp.arange(seq_len)[None, :] - start_B[:, None]
  inside_BxT = (offset_BxT >= 0) & (offset_BxT < R)
  index = jnp.broadcast_to(jnp.clip(offset_BxT, 0, R - 1)[:, None, :], (B, G, seq_len))
  return jnp.where(inside_BxT[:, None, :], jnp.take_along_axis(samples_BxGxR, index, axis=2), 0)


def require_position_kernel(implementation: str, platform=None) -> None:
  """ValueError unless `implementation` resolves (on `platform`) to a kernel that reads positions: splash and cuDNN
  apply the index's causal mask, which packed rows break."""
  kernel = attention.resolve_implementation(implementation, platform)
  if kernel not in ("reference", "blockwise"):
    raise ValueError(f"trainer.share_prompts needs an attention kernel that reads positions: model.attention "
                     f"'reference' or 'blockwise' (it resolves to {kernel!r} here)")


def attend_grouped(layout: PromptGroups, q_BxLxHxD, k_BxLxKxD, v_BxLxKxD, positions_BxL, key_mask_BxL, **kernel):
  """attention.attend over packed rows: the prompt slots among themselves, each sample's slots over the prompt's
  keys and their own. One call: the prompt is segment 0 and the samples 1..G, each segment's queries over the
  prompt's keys then its own (segment 0's own keys masked, its queries see the prompt's); segments padded to
  max(P, R). Positions are read (not the index), so only the kernels that honour them apply."""
  require_position_kernel(kernel.get("implementation", "auto"), kernel.get("platform"))
  B, L, H, D = q_BxLxHxD.shape
  P, G, R = layout.prompt_slots, layout.group_size, layout.sample_slots
  if L != layout.length:
    raise ValueError(f"packed rows of {L} positions, the layout has {layout.length}")
  S = max(P, R)

  def segments(x_BxL_):
    """[B, L, ...] -> [B * (G + 1), S, ...]: the prompt, then each sample, each padded to S."""
    pad = lambda x, n: jnp.pad(x, [(0, 0), (0, 0), (0, S - n)] + [(0, 0)] * (x.ndim - 3))  # noqa: E731
    prompt = pad(x_BxL_[:, None, :P], P)
    samples = pad(x_BxL_[:, P:].reshape(B, G, R, *x_BxL_.shape[2:]), R)
    return jnp.concatenate([prompt, samples], axis=1).reshape(B * (G + 1), S, *x_BxL_.shape[2:])

  def with_prompt(x_BxL_, own):
    """Each segment's keys: the prompt's (P), then `own` ([B * (G + 1), S, ...])."""
    return jnp.concatenate([jnp.repeat(x_BxL_[:, :P], G + 1, axis=0), own], axis=1)

  own_valid = jnp.concatenate([jnp.zeros((B, 1, S), bool),
                               jnp.broadcast_to(jnp.arange(S) < R, (B, G, S))], axis=1).reshape(B * (G + 1), S)
  positions = segments(positions_BxL)
  out = attention.attend(segments(q_BxLxHxD), with_prompt(k_BxLxKxD, segments(k_BxLxKxD)),
                         with_prompt(v_BxLxKxD, segments(v_BxLxKxD)), q_positions_BxT=positions,
                         kv_positions_BxS=with_prompt(positions_BxL, positions),
                         kv_valid_BxS=with_prompt(key_mask_BxL, own_valid), **kernel)
  out = out.reshape(B, G + 1, S, H, D)
  return jnp.concatenate([out[:, 0, :P], out[:, 1:, :R].reshape(B, G * R, H, D)], axis=1)
