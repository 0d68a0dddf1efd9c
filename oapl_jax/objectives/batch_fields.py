"""The trainer's batch, stated once: each field's dtype, whether it is per position [B, G, T] or per sequence
[B, G], and whether every batch holds it. B prompts, G samples per prompt, T positions, right-padded.

The losses check shapes from it (objectives.compute_loss), rl/buffer packs it, rl/batch_spec declares it to the
compile check and the train benchmarks. It sits here, the lowest floor that reads the batch: rl/ may import
objectives/, never the reverse. tokens, targets and positions are the model's inputs, read by the trainer, not
by a loss; they are stated here so that the batch is stated once.
"""
import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Field:
  dtype: type  # numpy scalar type, as the buffer packs it and the spec declares it
  per_position: bool  # [B, G, T], aligned with targets; else one value per sequence, [B, G]
  optional: bool = False  # only some runs' batches hold it (see its comment)

  def shape(self, B: int, G: int, T: int) -> tuple[int, ...]:
    return (B, G, T) if self.per_position else (B, G)


FIELDS: dict[str, Field] = {
    "tokens": Field(np.int32, True),  # prompt + response, less the last token: the model's input
    "targets": Field(np.int32, True),  # the next tokens: targets[t] = sequence[t + 1]
    "positions": Field(np.int32, True),  # 0 .. T-1
    "response_mask": Field(np.float32, True),  # 1 where the target is a response token
    "sampler_token_logp": Field(np.float32, True),  # the sampler's own log-probs of the targets, 0 off the response
    "rewards": Field(np.float32, False),
    # GRPO: pi_old's log-probs of the targets, scored at the start of the chunk's round (rl/windows.py)
    "old_policy_token_logp": Field(np.float32, True, optional=True),
    # loop.demo_use='sft': 1 on demonstrations, trained by NLL and left out of OAPL's V* and regression
    "demo_slots": Field(np.float32, False, optional=True),
}
