"""SamplerEngine (JetStream Engine API) against transformers' greedy `generate`, and JetStream's own
orchestrator driving the engine in-process."""
import asyncio
import logging
import threading

import numpy as np
import pytest
import torch

from oapl_jax.apps import serve as serve_app
from oapl_jax.sampler import engine as engine_lib
from oapl_jax.sampler import rollout, server
from oapl_jax.sampler.settings import SamplingSettings
from jetstream.core import orchestrator  # noqa: E402  (engine_lib installed jetstream_compat)
from jetstream.core.proto import jetstream_pb2  # noqa: E402
from jetstream.engine import token_utils  # noqa: E402
from tests.hf_fixtures import make_hf_checkpoint

# jetstream.core.orchestrator points the root logger at stdout at DEBUG on import; undo that here.
logging.getLogger().removeHandler(orchestrator.handler)
logging.getLogger().setLevel(logging.WARNING)

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9], [42], [10, 20, 30, 40, 50], [7, 7, 7, 7, 7, 7, 7, 7, 7]]
NEW = 8


@pytest.fixture(scope="module", params=["qwen3", "qwen2"])
def checkpoint(request, tmp_path_factory):
  path = tmp_path_factory.mktemp(request.param)
  torch_model = make_hf_checkpoint(path, request.param, seed=0)
  return str(path), torch_model


@pytest.fixture(scope="module")
def engine(checkpoint):
  eng = engine_lib.SamplerEngine.from_checkpoint(checkpoint[0], dtype="float32", max_concurrent_decodes=4,
                                                 max_prefill_length=16,
                                                 settings=SamplingSettings(max_new_tokens=NEW, temperature=0.0))
  eng.load_params()
  return eng


def _hf_greedy(torch_model, prompt, n=NEW):
  with torch.no_grad():
    out = torch_model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
  return out[0, len(prompt):].tolist()


def test_engine_api_greedy_equals_transformers(checkpoint, engine):
  """prefill / insert / generate exactly as JetStream calls them, 4 prompt lengths in one batch."""
  _, torch_model = checkpoint
  params = engine.load_params()
  tokenizer = engine.build_tokenizer(engine.get_tokenizer())
  state = engine.init_decode_state()
  for slot, prompt in enumerate(PROMPTS):
    padded, true_length = token_utils.pad_tokens(prompt, tokenizer.bos_id, tokenizer.pad_id, is_bos=True,
                                                 max_prefill_length=engine.max_prefill_length)
    prefix = engine.prefill(params=params, padded_tokens=padded, true_length=true_length)
    state = engine.insert(prefix, state, slot=slot)
  got = [[] for _ in PROMPTS]
  for step in range(NEW + 1):
    state, result = engine.generate(params, state)
    result = result.convert_to_numpy()
    for slot in range(len(PROMPTS)):
      data = result.get_result_at_slot(slot)
      if data.valid[0, 0]:
        got[slot].append(int(data.tokens[0, 0]))
        assert data.lengths[0] == step + 1
  for slot, prompt in enumerate(PROMPTS):
    assert got[slot] == _hf_greedy(torch_model, prompt), f"prompt {slot} (length {len(prompt)})"


def test_rollout_through_engine_greedy_equals_transformers(checkpoint, engine):
  _, torch_model = checkpoint
  groups = rollout.generate_groups(engine, engine.sampler.params, PROMPTS, 1,
                                   SamplingSettings(max_new_tokens=NEW, temperature=0.0), seed=0)
  assert groups.snapshot_version == engine.snapshot_version == 1
  for p, prompt in enumerate(PROMPTS):
    assert groups.response_tokens[p, 0].tolist() == _hf_greedy(torch_model, prompt)


@pytest.fixture
def thread_errors(monkeypatch):
  """JetStream's JetThread SIGKILLs the process when a thread fails; record the error instead."""
  errors = []

  def run(self):
    try:
      threading.Thread.run(self)
    except Exception as e:  # noqa: BLE001
      errors.append(e)
      raise
  monkeypatch.setattr(orchestrator.JetThread, "run", run)
  return errors


def test_jetstream_orchestrator_drives_engine(checkpoint, thread_errors):
  """JetStream's Driver + LLMOrchestrator.Decode (in-process, no port) return our greedy tokens."""
  path, _ = checkpoint
  stops = [100, 101, 102]
  engine = serve_app.build_engine(*serve_app.parse([
      "--checkpoint", path, "--dtype", "float32", "--slots", "2", "--max_prefill_length", "16",
      "--max_decode_length", str(NEW), "--stop_tokens", *map(str, stops)]))
  assert engine.max_concurrent_decodes == 2 and list(engine.stop_tokens) == stops
  driver = server.build_driver(engine)
  client = orchestrator.LLMOrchestrator(driver=driver)
  max_tokens = [NEW, 5, NEW, 3]

  async def decode(prompt, n):
    request = jetstream_pb2.DecodeRequest(token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=prompt),
                                          max_tokens=n)
    tokens = []
    async for response in client.Decode(request):
      tokens += list(response.stream_content.samples[0].token_ids)
    return tokens

  async def all_requests():  # 4 requests over 2 slots: slots get refilled
    return await asyncio.wait_for(asyncio.gather(*[decode(p, n) for p, n in zip(PROMPTS, max_tokens)]), 120)

  # Close the event loop only after the driver stopped: JetStream's detokenize thread still calls
  # loop.call_soon_threadsafe just after a request's last result (asyncio.run would race it).
  loop = asyncio.new_event_loop()
  try:
    served = loop.run_until_complete(all_requests())
  finally:
    driver.stop()
    loop.close()
  assert not thread_errors
  ours = rollout.generate_groups(engine, engine.sampler.params, PROMPTS, 1,
                                 SamplingSettings(max_new_tokens=NEW, temperature=0.0, stop_tokens=stops), seed=0)
  for p, n in enumerate(max_tokens):
    expected = ours.response_tokens[p, 0, :ours.lengths[p, 0]].tolist()
    if expected[-1] in stops:  # JetStream ends the stream at a stop token without sending it
      expected = expected[:-1]
    assert served[p] == expected[:n], f"request {p}"


def test_bad_engine_inputs(engine):
  params = engine.load_params()
  with pytest.raises(engine_lib.InvalidRequest, match=r"vocabulary \[0, 256\): \[999\]"):
    engine.prefill(params=params, padded_tokens=np.array([1, 999, 0, 0]), true_length=2)
  with pytest.raises(engine_lib.InvalidRequest, match="prompt is empty"):
    engine.prefill(params=params, padded_tokens=np.array([-1, 0, 0]), true_length=1)  # only the BOS sentinel
  with pytest.raises(NotImplementedError):
    engine.prefill(params=params, existing_prefix=object(), padded_tokens=np.array([1]), true_length=1)
  with pytest.raises(ValueError, match="power"):
    engine_lib.SamplerEngine(engine.sampler.model, max_prefill_length=24)


def test_request_checks(tmp_path):
  """What oapl-serve refuses before JetStream sees it: checked against the vocabulary, the prefill
  length and the decode length; text through the checkpoint's own tokenizer."""
  from tests.hf_fixtures import make_chat_tokenizer
  make_hf_checkpoint(tmp_path, "qwen3", vocab_size=300)
  hf_tok = make_chat_tokenizer(tmp_path)
  engine = engine_lib.SamplerEngine.from_checkpoint(str(tmp_path), dtype="float32", max_prefill_length=16,
                                                    settings=SamplingSettings(max_new_tokens=NEW))
  text = "What is 1+1?"
  assert engine.check_prompt_text(text) == hf_tok.encode(text, add_special_tokens=False)  # no BOS for Qwen
  assert engine.check_prompt_ids([0, 299, 5]) == [0, 299, 5]
  assert engine.check_max_tokens(1) == 1 and engine.check_max_tokens(NEW) == NEW
  refused = {"vocabulary": lambda: engine.check_prompt_ids([0, 300]),
             r"\[-1\]": lambda: engine.check_prompt_ids([-1, 2]),
             "prompt is empty": lambda: engine.check_prompt_ids([]),
             "17 tokens, more than max_prefill_length=16": lambda: engine.check_prompt_ids(list(range(17))),
             "text is empty": lambda: engine.check_prompt_text(""),
             "more than max_prefill_length": lambda: engine.check_prompt_text("What is 1+1? " * 8),
             f"max_tokens=0: .* 1..{NEW}": lambda: engine.check_max_tokens(0),
             f"max_tokens={NEW + 1}": lambda: engine.check_max_tokens(NEW + 1)}
  for reason, check in refused.items():
    with pytest.raises(engine_lib.InvalidRequest, match=reason):
      check()
  per_token = engine._tokenizer.max_token_bytes  # pylint: disable=protected-access
  assert per_token == max(len(hf_tok.decode([i]).encode()) for i in range(len(hf_tok)))
  rng = np.random.default_rng(0)
  for _ in range(20):  # the bound it rests on: a text has at least bytes / per_token tokens
    text = "".join(rng.choice(list("ab 1+?\n\u00e9<|>"), size=int(rng.integers(1, 200))))
    assert len(hf_tok.encode(text, add_special_tokens=False)) >= len(text.encode()) / per_token
  calls = []
  encode = hf_tok.encode
  engine._tokenizer.hf.encode = lambda *a, **k: calls.append(1) or encode(*a, **k)  # pylint: disable=protected-access
  with pytest.raises(engine_lib.InvalidRequest, match=f"{16 * per_token + 1} bytes, more than max_prefill_length=16"):
    engine.check_prompt_text("x" * (16 * per_token + 1))
  assert not calls  # refused before tokenizing (a 1 MB prompt took 14.8 s to tokenize, holding the lock)
  # the server's transport limit sits above every valid request: the longest text and the largest ids
  from jetstream.core.proto import jetstream_pb2 as pb
  longest_token = max(range(len(hf_tok)), key=lambda i: len(hf_tok.decode([i]).encode()))
  biggest = [pb.DecodeRequest(text_content=pb.DecodeRequest.TextContent(text=hf_tok.decode([longest_token]) * 16),
                              max_tokens=NEW),
             pb.DecodeRequest(token_content=pb.DecodeRequest.TokenContent(token_ids=[299] * 16), max_tokens=NEW)]
  assert max(r.ByteSize() for r in biggest) <= engine.max_request_bytes < 1 << 20  # a 1 MB prompt: over it
  ids_only = engine_lib.SamplerEngine(engine.sampler.model, max_prefill_length=16)  # no tokenizer files
  assert ids_only.max_request_bytes is None
  assert ids_only.check_prompt_text(" 3  1\n4 ") == [3, 1, 4]
  with pytest.raises(engine_lib.InvalidRequest, match=r"no tokenizer files.*\['What', 'is'"):
    ids_only.check_prompt_text("What is 1+1?")


def test_hf_tokenizer_adapter_has_no_bos_and_stops_at_eos():
  import tokenizers
  import transformers
  from oapl_jax.sampler.tokenizers import NO_BOS, HFTokenizer
  vocab = {"<eos>": 0, "a": 1, "b": 2, "c": 3}
  word_level = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<eos>"))
  word_level.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=word_level, eos_token="<eos>")
  tok = HFTokenizer(hf_tok)
  assert tok.bos_id == NO_BOS and tok.eos_id == 0 and tok.stop_tokens == {0}
  padded, true_length = tok.encode("a b c", is_bos=True, max_prefill_length=16, jax_padding=False)
  assert true_length == 3 and padded.tolist()[:3] == [1, 2, 3] and len(padded) == 16
  assert tok.decode([1, 2]).split() == ["a", "b"]
