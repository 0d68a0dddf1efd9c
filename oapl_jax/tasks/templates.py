"""Chat templating through a Hugging Face tokenizer directory (local files only)."""
from __future__ import annotations

import os
from typing import Mapping, Sequence

from oapl_jax.tasks import base

# The instruction DeepScaleR-style math training appends to each problem.
BOXED_INSTRUCTION = " Let's think step by step and output the final answer within \\boxed{}."


class ChatTokenizer:
  """An HF tokenizer behind the `base.Tokenizer` protocol, plus its chat template."""

  def __init__(self, path: str | os.PathLike):
    import transformers  # pylint: disable=import-outside-toplevel
    path = os.fspath(path)
    if not os.path.isdir(path):
      raise FileNotFoundError(f"tokenizer directory not found: {path}")
    self.hf = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    if not self.hf.chat_template:
      raise ValueError(f"tokenizer at {path} has no chat_template (tokenizer_config.json or "
                       f"chat_template.jinja); the prompts cannot be templated")
    if self.hf.eos_token_id is None:
      raise ValueError(f"tokenizer at {path} has no eos token")
    self.eos_id: int = self.hf.eos_token_id
    self.pad_id: int = self.eos_id if self.hf.pad_token_id is None else self.hf.pad_token_id
    self.bos_id: int | None = self.hf.bos_token_id
    self.vocab_size: int = len(self.hf)  # added tokens included; the model may pad past it

  def encode(self, text: str) -> list[int]:
    return self.hf.encode(text, add_special_tokens=False)

  def decode(self, ids: Sequence[int]) -> str:
    return self.hf.decode([int(i) for i in ids], skip_special_tokens=True)

  def prompt_text(self, problem: str, system: str | None = None,
                  instruction_suffix: str = BOXED_INSTRUCTION) -> str:
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": problem + instruction_suffix})
    return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

  def prompt_tokens(self, problem: str, system: str | None = None,
                    instruction_suffix: str = BOXED_INSTRUCTION) -> tuple[int, ...]:
    # The rendered template carries its own special tokens (bos included, if any).
    return tuple(self.encode(self.prompt_text(problem, system, instruction_suffix)))

  def problems(self, records: Sequence[Mapping[str, str]], system: str | None = None,
               instruction_suffix: str = BOXED_INSTRUCTION) -> list[base.Problem]:
    """Templated problems from `sources` records ({"problem", "answer"})."""
    return [base.Problem(prompt=r["problem"], answer=r["answer"],
                         prompt_tokens=self.prompt_tokens(r["problem"], system,
                                                          instruction_suffix))
            for r in records]
