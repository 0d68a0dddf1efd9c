"""SamplerEngine: JetStream's Engine API as a thin face over sampler/core.py.

    engine = SamplerEngine.from_checkpoint("/ckpt/Qwen3-4B", max_concurrent_decodes=64)
    params = engine.load_params()                 # HF weights straight onto the sampler mesh
    params = engine.refresh(trainer_params)       # later: new snapshot, snapshot_version += 1

The engine has its own mesh and logical-axis rules (they may differ from the trainer's); `refresh`
reshards the trainer's params onto them device-side. JetStream's orchestrator drives it through
prefill / insert / generate (see oapl_jax/sampler/server.py); the RL loop uses sampler/rollout.py, which
takes this engine or its `.sampler`.

Per-request sampling settings do not exist in JetStream 0.2.2's API, so temperature / top-p /
top-k / stop tokens are engine settings; `insert` gives each request its own key from (seed, n).

JetStream kills its whole process when an engine call raises in one of its threads, so a server
checks each request first (`check_prompt_ids`, `check_prompt_text`, `check_max_tokens`, raising
InvalidRequest) and `prefill` applies the same prompt check as a last guard.
"""
from typing import Any, Optional

import jax
import numpy as np

from oapl_jax.sampler import jetstream_compat  # noqa: F401  (jax.tree_map for jetstream.core)
from jetstream.engine import engine_api, tokenizer_api, tokenizer_pb2  # noqa: E402

from oapl_jax.models.api import CausalLM  # noqa: E402
from oapl_jax.parallel import Layout  # noqa: E402
from oapl_jax.sampler import api, core  # noqa: E402
from oapl_jax.sampler.settings import SamplingSettings  # noqa: E402
from oapl_jax.sampler.tokenizers import NO_BOS, HFTokenizer, TokenIdTokenizer  # noqa: E402


def load_tokenizer(path: str) -> Any:
  """The `transformers` tokenizer of an HF directory, or None when it has no tokenizer files."""
  from oapl_jax.models import hf
  if not hf.tokenizer_files(path):
    return None
  import transformers
  return transformers.AutoTokenizer.from_pretrained(path)


class InvalidRequest(ValueError):
  """A request this engine cannot serve as asked; the message says why and what would be served."""


class SamplerEngine(engine_api.Engine):
  """A models.api.CausalLM (any family in models/families.py) behind JetStream's Engine API; one sample per slot."""

  def __init__(self, model: CausalLM, *, checkpoint: Optional[str] = None, params: Any = None,
               tokenizer: Any = None, layout: Optional[Layout] = None, max_concurrent_decodes: int = 8,
               max_prefill_length: int = 256, settings: Optional[SamplingSettings] = None, seed: int = 0):
    """settings: temperature / top-p / top-k / max_new_tokens (= JetStream's max_decode_length) for
    every request; with no stop tokens in it, the tokenizer's stop tokens are used."""
    if max_prefill_length < 16 or max_prefill_length & (max_prefill_length - 1):
      raise ValueError(f"max_prefill_length={max_prefill_length}: JetStream pads requests to powers of two "
                       "from 16, so it must be one of 16, 32, 64, ...")
    settings = settings or SamplingSettings(max_new_tokens=256, temperature=0.0)
    self.sampler = core.Sampler(model, layout=layout, num_slots=max_concurrent_decodes,
                                max_prefill_length=max_prefill_length, max_new_tokens=settings.max_new_tokens)
    if tokenizer is None:
      tokenizer = TokenIdTokenizer(settings.stop_tokens)
    elif not isinstance(tokenizer, tokenizer_api.Tokenizer):
      tokenizer = HFTokenizer(tokenizer, settings.stop_tokens or None)
    self._tokenizer = tokenizer
    stops = settings.stop_tokens or tokenizer.stop_tokens
    self.settings = settings.replace(
        stop_tokens=sorted(int(t) for t in stops if 0 <= int(t) < model.config.vocab_size))
    self._checkpoint = checkpoint
    self._initial_params = params
    self._seed = int(seed)
    self._num_inserted = 0

  @property
  def stop_tokens(self) -> tuple[int, ...]:
    return self.settings.stop_tokens

  @classmethod
  def from_checkpoint(cls, path: str, *, dtype: str = "bfloat16", tokenizer: Any = None, **kwargs) -> "SamplerEngine":
    """Engine for an HF checkpoint dir of any registered family (models/hf.read_config picks it by config.json's
    model_type); uses its tokenizer files when present (else token ids only)."""
    from oapl_jax.models import api, hf
    model = api.for_config(hf.read_config(path, param_dtype=dtype, dtype=dtype))
    tokenizer = load_tokenizer(path) if tokenizer is None else tokenizer
    return cls(model, checkpoint=path, tokenizer=tokenizer, **kwargs)

  # ---- parameters and snapshots
  def load_params(self, params: Any = None, *args, **kwargs):
    """Given params: a refresh. Otherwise the checkpoint (or constructor params) as snapshot 1."""
    if params is not None:
      return self.refresh(params)
    if self.sampler.params is not None:
      return self.sampler.params
    if self._initial_params is not None:
      return self.refresh(self._initial_params)
    if self._checkpoint is not None:
      return self.sampler.load(self._checkpoint)
    raise ValueError("SamplerEngine.load_params: no checkpoint, no params given")

  def refresh(self, trainer_params):
    """Device-side reshard + cast of the trainer's params onto the sampler mesh; bumps the version."""
    return self.sampler.refresh(trainer_params)

  @property
  def snapshot_version(self) -> int:
    return self.sampler.snapshot_version

  @property
  def last_refresh_seconds(self) -> float:
    return self.sampler.last_refresh_seconds

  # ---- request checks (InvalidRequest; nothing is truncated or clamped)
  def check_prompt_ids(self, token_ids) -> list[int]:
    """The prompt as the model will see it, or InvalidRequest: empty, more than max_prefill_length
    tokens, or ids that are not in the vocabulary."""
    try:
      api.check_request([token_ids], 1, self.settings, vocab_size=self.sampler.vocab_size,
                        max_prefill_length=self.sampler.max_prefill_length)
    except ValueError as e:
      raise InvalidRequest(str(e).replace("prompt 0 ", "the prompt ", 1)) from None
    return [int(t) for t in token_ids]

  def check_prompt_text(self, text: str) -> list[int]:
    """`text` through the engine's tokenizer, then `check_prompt_ids`."""
    if not text:
      raise InvalidRequest("the prompt text is empty")
    per_token = getattr(self._tokenizer, "max_token_bytes", None)  # text of ids: no bound (split is cheap)
    limit = None if per_token is None else per_token * self.sampler.max_prefill_length
    if limit is not None and len(text) > limit // 4 and len(text.encode("utf-8")) > limit:  # refused untokenized
      raise InvalidRequest(f"the prompt text has {len(text.encode('utf-8'))} bytes, more than max_prefill_length="
                           f"{self.sampler.max_prefill_length} tokens of at most {per_token} bytes each can hold")
    try:
      token_ids = self._tokenizer.prompt_ids(text)
    except ValueError as e:
      raise InvalidRequest(str(e)) from None
    return self.check_prompt_ids(token_ids)

  @property
  def max_request_bytes(self) -> Optional[int]:
    """A size no valid request reaches: twice the longest prompt, as text (max_prefill_length tokens of the
    vocabulary's longest) or as token ids (10 bytes each at most), plus 64 KiB. The server has gRPC refuse a
    larger message by its length (RESOURCE_EXHAUSTED) before it is read. None with a tokenizer of ids, whose
    text has no bound (gRPC's own 4 MiB applies)."""
    per_token = getattr(self._tokenizer, "max_token_bytes", None)
    return None if per_token is None else 2 * max(per_token, 10) * self.sampler.max_prefill_length + (64 << 10)

  def check_max_tokens(self, max_tokens: int) -> int:
    if not 1 <= max_tokens <= self.max_decode_length:
      raise InvalidRequest(f"max_tokens={max_tokens}: this server generates 1..{self.max_decode_length} tokens "
                           "per request (its max_decode_length)")
    return int(max_tokens)

  # ---- the Engine API
  def prefill(self, *, params, existing_prefix=None, padded_tokens, true_length: int) -> core.Prefix:
    if existing_prefix is not None:
      raise NotImplementedError("SamplerEngine.prefill: existing_prefix (multi-turn prefix reuse) is not supported")
    tokens = np.asarray(padded_tokens).reshape(-1)
    tokens = tokens[:min(int(true_length), tokens.size)]
    if tokens.size and tokens[0] == NO_BOS:  # JetStream prepends bos_id; Qwen has none
      tokens = tokens[1:]
    return self.sampler.prefill(params, [self.check_prompt_ids(tokens)])

  def insert(self, prefix: core.Prefix, decode_state: core.DecodeState, slot: int) -> core.DecodeState:
    key = core.sample_keys(self._seed, [self._num_inserted], [0])
    self._num_inserted += 1
    return self.sampler.insert(prefix, decode_state, [slot], [0], key)

  def generate(self, params, decode_state: core.DecodeState):
    state, data_Sx3 = self.sampler.generate_step(params, decode_state)
    return state, engine_api.ResultTokens(data=data_Sx3, tokens_idx=(0, 1), valid_idx=(1, 2),
                                          length_idx=(2, 3), samples_per_slot=1)

  def init_decode_state(self, *args, **kwargs) -> core.DecodeState:
    return self.sampler.init_decode_state(self.settings)

  def get_prefix_destination_sharding(self) -> Any:
    return self.sampler.prefix_shardings

  def get_tokenizer(self) -> tokenizer_pb2.TokenizerParameters:
    return tokenizer_pb2.TokenizerParameters(path=self._checkpoint or "")

  def build_tokenizer(self, metadata: tokenizer_pb2.TokenizerParameters) -> tokenizer_api.Tokenizer:
    return self._tokenizer

  @property
  def max_concurrent_decodes(self) -> int:
    return self.sampler.num_slots

  @property
  def samples_per_slot(self) -> int:
    return 1

  @property
  def max_prefill_length(self) -> int:
    return self.sampler.max_prefill_length

  @property
  def max_decode_length(self) -> int:
    return self.sampler.max_new_tokens

  @property
  def mesh(self) -> jax.sharding.Mesh:
    return self.sampler.mesh

  @property
  def colocated_cpus(self) -> None:
    return None
