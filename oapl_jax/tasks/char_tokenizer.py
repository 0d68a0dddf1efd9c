"""A character-level tokenizer for the synthetic tasks: <pad>=0, <bos>=1, <eos>=2, then one id per character."""
from typing import Sequence

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


class CharTokenizer:
  """Subclasses set `chars`, `vocab_size` (>= len(chars) + 3, padded for the model) and `name`."""
  chars: str = ""
  vocab_size: int = 0
  name: str = "character"
  pad_id, bos_id, eos_id = 0, 1, 2

  def __init__(self):
    self._id_of = {c: i + 3 for i, c in enumerate(self.chars)}
    self._text_of = {0: PAD, 1: BOS, 2: EOS, **{i: c for c, i in self._id_of.items()}}

  def encode(self, text: str) -> list[int]:
    try:
      return [self._id_of[c] for c in text]
    except KeyError as e:
      raise ValueError(f"character {e.args[0]!r} is not in the {self.name} vocabulary {self.chars!r}") from None

  def decode(self, ids: Sequence[int]) -> str:
    # Special tokens stay visible so the reward can tell a finished answer from a cut one.
    return "".join(self._text_of.get(int(i), "<unk>") for i in ids)

  def to_hf(self, max_length: int = 1 << 30):
    """This tokenizer as a transformers PreTrainedTokenizerFast (save_pretrained writes tokenizer.json):
    `tok(text).input_ids` is [bos_id, *encode(text)], our prompts' encoding; with add_special_tokens=False
    it is encode(text); "<eos>" in a text is five characters, as here. A character outside the vocabulary is
    an error there too (no unknown token). Pads on the left, as batched generation needs."""
    # pylint: disable=import-outside-toplevel
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    vocab = {PAD: self.pad_id, BOS: self.bos_id, EOS: self.eos_id, **self._id_of}
    backend = Tokenizer(models.WordLevel(vocab))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    backend.decoder = decoders.Fuse()  # pieces joined without spaces
    backend.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B",
                                                           special_tokens=[(BOS, self.bos_id)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, eos_token=EOS,
                                                pad_token=PAD, model_max_length=max_length,
                                                padding_side="left", split_special_tokens=True)
