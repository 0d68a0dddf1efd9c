"""Tokenizers for the JetStream engine: jetstream's tokenizer_api over an HF tokenizer, or ids only.

JetStream prepends `bos_id` to every fresh request. Qwen has no BOS token, so these tokenizers
report NO_BOS (-1) and SamplerEngine.prefill drops a leading NO_BOS: the model never sees it.
`prompt_ids(text)` gives the ids the model will see for a text request (so oapl-serve can check a
request before it reaches JetStream's threads).
"""
import functools
import threading
from typing import Iterable, Optional

import numpy as np
from jetstream.engine import token_utils, tokenizer_api

NO_BOS = -1


class TokenIdTokenizer(tokenizer_api.Tokenizer):
  """No vocabulary: text is whitespace-separated token ids ("12 7 93"), decode prints ids back.
  Used when a checkpoint ships no tokenizer; clients then send token ids."""

  def __init__(self, stop_tokens: Iterable[int] = (), pad_id: int = 0):
    self._stop = set(int(t) for t in stop_tokens)
    self._pad = int(pad_id)

  def prompt_ids(self, s: str) -> list[int]:
    """The ids in `s`; ValueError (saying how to send a prompt) when it holds anything else."""
    ids, bad = [], []
    for word in s.split():
      try:
        ids.append(int(word))
      except ValueError:
        bad.append(word)
    if bad:
      raise ValueError(f"this server has no tokenizer files: send token_content (token ids), or text of "
                       f"whitespace-separated token ids; the text holds {bad[:3]}")
    return ids

  def encode(self, s: str, **kwargs):
    ids = np.array(self.prompt_ids(s), np.int32)
    return token_utils.pad_tokens(ids, NO_BOS, self._pad, is_bos=False,
                                  max_prefill_length=kwargs.get("max_prefill_length"),
                                  jax_padding=kwargs.get("jax_padding", True))

  def decode(self, token_ids: list[int], **kwargs) -> str:
    return "".join(f"{t} " for t in token_ids)  # space-terminated, so streamed pieces concatenate

  @property
  def pad_id(self) -> int:
    return self._pad

  @property
  def eos_id(self) -> int:
    return min(self._stop) if self._stop else -1

  @property
  def bos_id(self) -> int:
    return NO_BOS

  @property
  def stop_tokens(self) -> set[int]:
    return set(self._stop)


class HFTokenizer(tokenizer_api.Tokenizer):
  """jetstream's Tokenizer API over a `transformers` tokenizer (no BOS added for Qwen). The
  server's request check and JetStream's threads share it, so every use holds one lock."""

  def __init__(self, hf_tokenizer, stop_tokens: Optional[Iterable[int]] = None):
    self.hf = hf_tokenizer
    self._lock = threading.Lock()
    eos = hf_tokenizer.eos_token_id
    self._stop = set(int(t) for t in stop_tokens) if stop_tokens is not None else ({eos} if eos is not None else set())

  @functools.cached_property
  def max_token_bytes(self) -> int:
    """The most UTF-8 bytes one token of the vocabulary stands for (added tokens included): a text of more than
    n times this has more than n tokens, so a prompt that long is refused before it is tokenized."""
    with self._lock:
      pieces = self.hf.batch_decode([[i] for i in range(len(self.hf))])
    return max(1, max(len(p.encode("utf-8")) for p in pieces))

  def prompt_ids(self, s: str) -> list[int]:
    """What a fresh text request puts before the model: its tokens after the BOS, if there is one. ValueError
    when the tokenizer cannot encode it (a character tokenizer's character outside its vocabulary)."""
    with self._lock:
      try:
        ids = self.hf.encode(s, add_special_tokens=False)
      except Exception as e:  # the `tokenizers` library raises a bare Exception  # pylint: disable=broad-except
        raise ValueError(f"the text cannot be encoded (a character outside the vocabulary?): {e}") from None
    return ([self.bos_id] if self.bos_id != NO_BOS else []) + [int(t) for t in ids]

  def encode(self, s: str, **kwargs):
    with self._lock:
      ids = np.array(self.hf.encode(s, add_special_tokens=False), np.int32)
    return token_utils.pad_tokens(ids, self.bos_id, self.pad_id,
                                  is_bos=kwargs.get("is_bos", True) and self.bos_id != NO_BOS,
                                  max_prefill_length=kwargs.get("max_prefill_length"),
                                  jax_padding=kwargs.get("jax_padding", True))

  def decode(self, token_ids: list[int], **kwargs) -> str:
    with self._lock:
      return self.hf.decode(token_ids)

  @property
  def pad_id(self) -> int:
    pad = self.hf.pad_token_id
    return int(pad if pad is not None else (self.hf.eos_token_id or 0))

  @property
  def eos_id(self) -> int:
    eos = self.hf.eos_token_id
    return int(eos) if eos is not None else -1

  @property
  def bos_id(self) -> int:
    bos = self.hf.bos_token_id
    return int(bos) if bos is not None else NO_BOS

  @property
  def stop_tokens(self) -> set[int]:
    return set(self._stop)
