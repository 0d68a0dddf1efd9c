"""The model interface: everything `rl/` and `sampler/` may ask of a network, and nothing else.

    model = api.for_config(QwenConfig.tiny())          # a CausalLM bound to its config
    boxed = model.init_params(rng)                      # params with logical axes (see parallel.init_sharded)
    logp_BxT = model.token_logprobs(params, tokens_BxT, targets_BxT, positions_BxT, temperature=1.0)
    snapshot = model.decode_params(params)              # the decode layout (e.g. one tree per layer)
    cache = model.init_cache(batch, max_len)
    hidden_BxTxE, cache = model.forward_with_cache(snapshot, tokens_BxT, positions_BxT, cache)
    logits_BxV = model.logits(snapshot, hidden_BxE)

A family implements `CausalLM` (the shared decoder's: models/decoder_lm.py `DecoderLM`) and registers it in
models/families.py, which `for_config` dispatches through. The trainer and the sampler never import a family
module, so a new family or a new attention kernel changes no code in rl/ or sampler/.
"""
from typing import Any, Protocol

Params = Any  # a pytree of arrays
Cache = Any  # a pytree of arrays; its layout is the family's business


class CausalLM(Protocol):
  """A decoder-only LM bound to one config (architecture + dtypes)."""

  config: Any  # the family's typed config: its architecture and its `execution` (dtypes, remat, kernel)

  # ---- weights
  def init_params(self, rng) -> Params:
    """Boxed params (flax nn.Partitioned, carrying logical axis names)."""

  def param_logical_axes(self) -> Any:
    """PartitionSpecs of logical axis names, matching the (training-layout) params tree."""

  def with_execution(self, **changes) -> "CausalLM":
    """The same architecture run another way: dtypes, remat, kernel (models/execution.Execution's fields)."""

  def same_architecture(self, other: "CausalLM") -> bool:
    """Whether `other`'s weights fit this model (how either runs may differ)."""

  def lora_inputs(self) -> dict[str, tuple[str, ...]]:
    """{projection module name: the logical names of its kernel's input axes}: where LoRA may attach
    (models/lora.py splits each kernel into input and output axes by these)."""

  # ---- training
  def token_logprobs(self, params: Params, tokens_BxT, targets_BxT, positions_BxT=None, *,
                     temperature: float = 1.0, with_entropy: bool = False, lora: Params = None, needed_BxT=None,
                     key_mask_BxT=None, prompt_groups=None):
    """log softmax(logits / temperature)[target] per position, float32 [B, T] (and entropies). `lora`: LoRA
    adapters (models/lora.py's tree, B scaled by alpha / rank) applied inside the layers as x·A·B.
    `needed_BxT` (bool): the positions the caller reads; the others give 0 and may skip the vocabulary
    projection (None: all). `key_mask_BxT`: the keys attention may read (None: all). `prompt_groups`
    (models/prompt_groups.PromptGroups): each row is a group packed by prompt_groups.pack, its prompt run once."""

  # ---- sampling: a decode layout of the params and a KV cache
  def decode_params(self, params: Params) -> Params:
    """Training-layout params -> the decode layout (pure; jit it with decode_logical_axes shardings)."""

  def is_decode_layout(self, params: Params) -> bool: ...

  def decode_logical_axes(self) -> Any:
    """param_logical_axes in the decode layout."""

  def init_cache(self, batch: int, max_len: int) -> Cache: ...

  def cache_logical_axes(self) -> Cache:
    """PartitionSpecs of the cache; each array's leading axis is the batch ('cache_batch')."""

  def cache_length(self, cache: Cache) -> int: ...

  def grow_cache(self, cache: Cache, max_len: int) -> Cache:
    """Zero-pad to max_len positions; attends exactly like the shorter cache."""

  def copy_cache_rows(self, dst: Cache, src: Cache, dst_rows_M, src_rows_M) -> Cache:
    """dst rows dst_rows_M <- src rows src_rows_M over src's positions; out-of-range dst rows are dropped."""

  def decode_constants(self, cache_len: int) -> Any:
    """Per-call constants a decode loop builds once (e.g. a rotary table); None is always allowed."""

  def forward_with_cache(self, params: Params, tokens_BxT, positions_BxT, cache: Cache, constants: Any = None):
    """Prefill or decode in the decode layout: (final hidden [B, T, E], updated cache)."""

  def logits(self, params: Params, hidden_BxE):
    """The vocabulary projection of final hidden states."""


def for_config(config: Any) -> CausalLM:
  """The CausalLM for a family config (models/families.py; TypeError for a config of no family)."""
  from oapl_jax.models import families  # pylint: disable=import-outside-toplevel
  return families.of_config(config).causal_lm(config)
