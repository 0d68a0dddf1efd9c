"""How any model runs, not what it is: dtypes, rematerialisation, MLP pieces, the vocabulary projection's chunks
and the attention kernel. Every family's config carries one `Execution`; two configs with equal architectures and
different executions hold the same weights (a checkpoint trained with one kernel loads with another).

`remat_policy` (below) is the one place a policy name becomes a jax.checkpoint policy.
"""
import dataclasses

import jax
import jax.numpy as jnp

from oapl_jax import sections
from oapl_jax.models.attention import IMPLEMENTATIONS

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
REMAT_POLICIES = ("full", "offload_layer_input", "save_dots_no_batch")  # see remat_policy


@dataclasses.dataclass(frozen=True)
class Execution:
  """How a model runs, not what it is: two configs with equal architectures and different executions
  hold the same weights (a checkpoint trained with one kernel loads with another)."""
  param_dtype: str = sections.rule("float32", choices=tuple(DTYPES))  # master weights
  dtype: str = sections.rule("float32", choices=tuple(DTYPES))  # compute dtype
  remat: bool = False  # rematerialise each layer in the backward pass
  # What a rematerialised layer keeps for its backward (with remat only): "full" keeps its input (the scan stacks
  # it, [layers, B, T, E]) and recomputes the rest; "offload_layer_input" moves that stack to pinned host memory
  # (TPU/GPU; the transfers overlap the layers); "save_dots_no_batch" also keeps its weight matmuls' outputs.
  remat_policy: str = sections.rule("full", choices=REMAT_POLICIES)
  # the MLP runs over the positions in this many pieces, each rematerialised in its own backward: one piece's
  # [B, T / pieces, intermediate] temporaries alive instead of the whole [B, T, intermediate] (1: unchunked)
  mlp_chunks: int = sections.rule(1, low=1)
  # with a needed-positions mask (the trainer's response tokens), skip the projection of positions no one reads
  # (chunks holding none, and `logprob_tail_levels` below). False: every position is projected and the unread
  # ones still give 0, with no reordering or skipped chunks to compile: for a vocabulary so small the projection
  # costs nothing (the demo's 32 words: its train step compiles in 2.8 s instead of 3.6, docs/benchmarks.md)
  logprob_skip_unread: bool = True
  # tokens (rows x positions) per row shard in one chunk of the vocabulary projection: one float32
  # [tokens, vocab] block is alive per device, forward or backward, however many rows a batch has
  logprob_chunk_tokens: int = sections.rule(512, low=1)
  # with a needed-positions mask (the trainer's response tokens), the needed tokens past the last whole chunk run
  # in up to this many smaller chunks (halves, quarters, ... of one) instead of a whole chunk: the projection's
  # excess over the needed tokens falls from up to a chunk to a chunk / 2^levels (0: whole chunks only)
  logprob_tail_levels: int = sections.rule(3, low=0)
  # False: the vocabulary projection's backward reuses the forward's logits instead of recomputing them (one
  # matmul of 2 x tokens x hidden x vocab FLOPs fewer per step, but float32 [tokens, vocab] kept for the whole
  # batch: for small batches on CPU or GPU with memory to spare, not the paper's 16K-token sequences)
  logprob_recompute: bool = True
  # with logprob_recompute, the backward still reuses the forward's logits when the kept float32 blocks of one
  # (micro-)batch take at most this many bytes per device ([tokens per row shard, vocab] float32, every chunk's
  # block and the tails', run or skipped: 1.4 GiB for 2 x 4 x 256 tokens at Qwen's 151,936 words, 11 GiB for one
  # 18K-token sequence): small batches get the faster backward, long sequences the memory saving. 0: always
  # recompute.
  logprob_keep_bytes: int = sections.rule(2 << 30, low=0)
  # Training and prefill attention kernel (models/attention.py): auto | splash | cudnn | blockwise | reference;
  # "auto" picks by the platform of the mesh being traced for (so a TPU compile check gets splash).
  attention: str = sections.rule("auto", choices=IMPLEMENTATIONS)
  attention_block_q: int = sections.rule(512, low=1)  # query positions per block (blockwise and splash kernels)
  attention_block_kv: int = sections.rule(512, low=1)  # key/value positions per block (blockwise and splash)
  # The sampler's decode layout also keeps a tied table's [E, V] transpose for the logits (+V x E of snapshot
  # memory): XLA:CPU runs the float32 dot of 1-64 rows against [V, E] 1.04-2.2x slower than against [E, V]. The
  # sampler turns it on where that holds (sampler/core.TRANSPOSED_TABLE_AT); True forces it anywhere
  decode_transposed_table: bool = False

  def __post_init__(self):
    sections.enforce(self)


EXECUTION_FIELDS = tuple(f.name for f in dataclasses.fields(Execution))


def remat_policy(name: str):
  """Execution.remat_policy -> the jax.checkpoint policy of a rematerialised decoder layer (None: save nothing).
  "offload_layer_input" moves what the layer names `layer_input` (models/decoder.py's checkpoint_name) to host."""
  if name == "offload_layer_input":
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["layer_input"], offload_src="device",
        offload_dst="pinned_host")
  policies = {"full": None, "save_dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
  if name not in policies:
    raise ValueError(f"remat_policy={name!r}: known policies are {sorted(policies) + ['offload_layer_input']}")
  return policies[name]
