"""oapl-serve as a real process on 127.0.0.1: a burst of concurrent gRPC clients with malformed
requests mixed in (each refused alone, with INVALID_ARGUMENT and its reason), greedy answers equal
to rollout.generate_groups, and serving a run directory's newest checkpoint."""
import concurrent.futures
import os
import re
import select
import subprocess
import sys
import threading
import time

import flax.linen as nn
import grpc
import jax
import numpy as np
import pytest
import torch

from oapl_jax import checkpoint_files, checkpoints, parallel
from oapl_jax.apps import serve as serve_app
from oapl_jax.models import factory
from oapl_jax import run_dir as run_dir_lib
from oapl_jax.rl import trainer
from oapl_jax.run import schema
from oapl_jax.sampler import rollout
from oapl_jax.sampler.engine import InvalidRequest, SamplerEngine
from oapl_jax.sampler.settings import SamplingSettings
from jetstream.core.proto import jetstream_pb2 as pb  # noqa: E402  (serve installed jetstream_compat)
from jetstream.core.proto import jetstream_pb2_grpc as pb_grpc  # noqa: E402
from tests.hf_fixtures import TINY, make_hf_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFILL, DECODE, SLOTS = 16, 8, 8
STOPS = [150, 234]  # tokens the tiny model's greedy answers reach: 5 good requests end at one (one at once)
VOCAB = TINY["vocab_size"]
Tokens, Text = pb.DecodeRequest.TokenContent, pb.DecodeRequest.TextContent


def _good_requests(n: int):
  """(prompt ids, max_tokens, as_text) of n good requests: lengths 1..PREFILL, max_tokens 1..DECODE."""
  rng = np.random.default_rng(0)
  lengths = [1, PREFILL] + rng.integers(1, PREFILL + 1, n - 2).tolist()
  return [(rng.integers(0, VOCAB, length).tolist(), int(rng.integers(1, DECODE + 1)), i % 5 == 0)
          for i, length in enumerate(lengths)]


# (request, the reason INVALID_ARGUMENT must give)
BAD_IN_BURST = [
    (pb.DecodeRequest(token_content=Tokens(token_ids=[5, VOCAB, 7]), max_tokens=4),
     rf"vocabulary \[0, {VOCAB}\): \[{VOCAB}\]"),
    (pb.DecodeRequest(token_content=Tokens(token_ids=[]), max_tokens=4), "prompt is empty"),
    (pb.DecodeRequest(token_content=Tokens(token_ids=[1] * (PREFILL + 1)), max_tokens=4),
     f"{PREFILL + 1} tokens, more than max_prefill_length={PREFILL}"),
    (pb.DecodeRequest(token_content=Tokens(token_ids=[1, 2]), max_tokens=0), f"max_tokens=0.*1..{DECODE}"),
]
BAD_MORE = [
    (pb.DecodeRequest(token_content=Tokens(token_ids=[3, -4]), max_tokens=4), r"vocabulary.*\[-4\]"),
    (pb.DecodeRequest(text_content=Text(text=""), max_tokens=4), "prompt text is empty"),
    (pb.DecodeRequest(text_content=Text(text="what is 1+1?"), max_tokens=4), "no tokenizer files.*token_content"),
    (pb.DecodeRequest(text_content=Text(text=" ".join(["1"] * (PREFILL + 1))), max_tokens=4), "more than max_prefill"),
    (pb.DecodeRequest(token_content=Tokens(token_ids=[1, 2]), max_tokens=-3), "max_tokens=-3"),
    (pb.DecodeRequest(token_content=Tokens(token_ids=[1, 2]), max_tokens=DECODE + 1), f"max_tokens={DECODE + 1}"),
    (pb.DecodeRequest(max_tokens=4), "no prompt"),
    (pb.DecodeRequest(token_content=Tokens(token_ids=[1, 2]), max_tokens=4, session_cache="s"), "session_cache"),
]


def _request(prompt, max_tokens, as_text):
  content = dict(text_content=Text(text=" ".join(map(str, prompt)))) if as_text else \
      dict(token_content=Tokens(token_ids=prompt))
  return pb.DecodeRequest(max_tokens=max_tokens, **content)


def _decode(address: str, request, start: threading.Barrier = None):
  """One client on its own channel: ("ok", token ids) or (status code name, details)."""
  with grpc.insecure_channel(address) as channel:
    stub = pb_grpc.OrchestratorStub(channel)
    if start is not None:
      start.wait()
    try:
      tokens = [t for r in stub.Decode(request, timeout=120) for t in r.stream_content.samples[0].token_ids]
      return "ok", tokens
    except grpc.RpcError as e:
      return e.code().name, e.details()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  path = tmp_path_factory.mktemp("qwen3")
  torch.manual_seed(0)  # transformers' own init draws from the global generator: fix it, so STOPS are reached
  make_hf_checkpoint(path, "qwen3", seed=0)
  return str(path)


@pytest.fixture(scope="module")
def server_process(checkpoint, tmp_path_factory):
  """`python -m oapl_jax.apps.serve` on 127.0.0.1, a free port: (process, its stderr file), starting."""
  log = tmp_path_factory.mktemp("serve") / "stderr.log"
  cmd = [sys.executable, "-m", "oapl_jax.apps.serve", "--checkpoint", checkpoint, "--port", "0", "--dtype", "float32",
         "--slots", str(SLOTS), "--max_prefill_length", str(PREFILL), "--max_decode_length", str(DECODE),
         "--stop_tokens", *map(str, STOPS)]
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")  # the server needs one device
  with open(log, "w") as stderr:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
  yield proc, log
  proc.terminate()
  assert proc.wait(timeout=60) == 0, "oapl-serve did not stop cleanly on SIGTERM"


@pytest.fixture(scope="module")
def server(server_process, reference):
  """(process, address) once the server listens (the reference is computed while it starts)."""
  proc, log = server_process
  started = select.select([proc.stdout], [], [], 300)[0]  # the server prints one line once it listens
  line = proc.stdout.readline() if started else "(nothing within 300 s)"
  match = re.search(r" on (127\.0\.0\.1:\d+) ", line)
  if not match:
    proc.kill()
    pytest.fail(f"oapl-serve did not start: {line!r}\n{log.read_text()[-3000:]}")
  return proc, match.group(1)


@pytest.fixture(scope="module")
def reference(checkpoint):
  """Greedy answers of every good request, from rollout.generate_groups on an in-process engine."""
  engine = SamplerEngine.from_checkpoint(checkpoint, dtype="float32", max_concurrent_decodes=32,  # few compiles
                                         max_prefill_length=PREFILL,
                                         settings=SamplingSettings(max_new_tokens=DECODE, temperature=0.0))
  engine.load_params()
  prompts = [p for p, _, _ in _good_requests(29)]
  groups = rollout.generate_groups(engine, None, prompts, 1, SamplingSettings(
      max_new_tokens=DECODE, temperature=0.0, stop_tokens=STOPS, grow_cache=False), seed=0)
  answers = []
  for p in range(len(prompts)):
    tokens = groups.response_tokens[p, 0, :groups.lengths[p, 0]].tolist()
    answers.append(tokens[:-1] if tokens[-1] in STOPS else tokens)  # the stream ends before a stop token
  return answers


def _listening_address(pid: int, port: int) -> str:
  """The local address of the process's socket listening on `port` (from /proc/PID/net/tcp{,6})."""
  for table in ("tcp", "tcp6"):
    with open(f"/proc/{pid}/net/{table}") as f:
      for row in f.readlines()[1:]:
        local, state = row.split()[1], row.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
          return address
  raise AssertionError(f"no socket of process {pid} listens on port {port}")


@pytest.mark.slow
def test_burst_with_malformed_requests(server, reference):
  proc, address = server
  good = _good_requests(29)
  burst = [(_request(*g), ("good", i)) for i, g in enumerate(good[:28])]
  burst += [(request, ("bad", reason)) for request, reason in BAD_IN_BURST]
  order = np.random.default_rng(1).permutation(len(burst))  # the malformed ones mixed among the good
  burst = [burst[i] for i in order]
  assert len(burst) == 32
  start = threading.Barrier(len(burst))
  began = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(len(burst)) as pool:
    results = list(pool.map(lambda item: _decode(address, item[0], start), burst))
  seconds = time.perf_counter() - began
  answered = refused = 0
  for (_, (kind, what)), (status, got) in zip(burst, results):
    if kind == "good":
      _, max_tokens, _ = good[what]
      assert status == "ok", f"good request {what} failed: {status} {got}"
      assert got == reference[what][:max_tokens], f"good request {what}"
      answered += 1
    else:
      assert status == "INVALID_ARGUMENT" and re.search(what, got), (status, got)
      refused += 1
  print(f"\nburst: {answered} answered, {refused} refused in {seconds:.2f} s")
  assert (answered, refused) == (28, 4)
  assert any(len(reference[i]) < good[i][1] for i in range(28)), "no request ended at a stop token: pick STOPS anew"
  assert proc.poll() is None, "the server died"
  prompt, max_tokens, _ = good[28]
  assert _decode(address, _request(prompt, max_tokens, False)) == ("ok", reference[28][:max_tokens])


@pytest.mark.parametrize("request_and_reason", BAD_MORE, ids=lambda r: r[1][:24])
@pytest.mark.slow
def test_each_malformed_kind_refused_alone(server, request_and_reason):
  proc, address = server
  request, reason = request_and_reason
  status, details = _decode(address, request)
  assert status == "INVALID_ARGUMENT" and re.search(reason, details), (status, details)
  assert proc.poll() is None
  with grpc.insecure_channel(address) as channel:
    assert pb_grpc.OrchestratorStub(channel).HealthCheck(pb.HealthCheckRequest(), timeout=30).is_live


@pytest.mark.slow
def test_bytes_that_are_no_protobuf_are_one_invalid_argument_and_no_traceback(server, server_process):
  proc, address = server
  with grpc.insecure_channel(address) as channel:
    for method, call in (("Decode", channel.unary_stream), ("HealthCheck", channel.unary_unary)):
      rpc = call(f"/jetstream_proto.Orchestrator/{method}", request_serializer=lambda b: b,
                 response_deserializer=lambda b: b)
      with pytest.raises(grpc.RpcError) as refused:
        result = rpc(b"\xff\xff\xff\xff not a protobuf", timeout=30)
        list(result) if method == "Decode" else result  # pylint: disable=expression-not-assigned
      assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, refused.value)
      assert refused.value.details().startswith(f"the request is not a {method}Request protobuf ("), method
    assert pb_grpc.OrchestratorStub(channel).HealthCheck(pb.HealthCheckRequest(), timeout=30).is_live
  assert proc.poll() is None
  assert "Traceback" not in server_process[1].read_text()


@pytest.mark.slow
def test_listens_on_loopback_only(server):
  proc, address = server
  local = _listening_address(proc.pid, int(address.rsplit(":", 1)[1]))
  # 127.0.0.1 as /proc writes it: 0100007F (IPv4) or ::ffff:127.0.0.1 (IPv4-mapped IPv6); never all zeros
  assert local in ("0100007F", "0000000000000000FFFF00000100007F"), local
  assert serve_app.parse(["--checkpoint", "x"])[0].host == "127.0.0.1"


# ------------------------------------------------------------------------------ a run directory
def _save_run(run_dir, cfg, steps):
  """A run's checkpoints/ as loop.train writes them: a TrainState per step (random params, seeded by step)."""
  layout = parallel.Layout.single_device()
  model = factory.model_of(schema.from_config(cfg).model)  # the typed config, as run/policy builds it
  shapes = jax.eval_shape(lambda: nn.unbox(model.init_params(jax.random.PRNGKey(0))))
  ckpt = checkpoints.Checkpointer(os.path.join(run_dir, "checkpoints"))
  states = {}
  for step in steps:
    rng = np.random.default_rng(step)
    params = jax.tree.map(lambda s: rng.normal(0, 0.1, s.shape).astype(s.dtype), shapes)
    states[step] = trainer.create_train_state(trainer.TrainConfig(), model, params, layout)
    ckpt.save(step, states[step], checkpoint_files.Meta(step // 10, step // 10, 0, cfg.seed))
  ckpt.close()
  return model, states


def _assert_trees_equal(got, want):
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(got), jax.device_get(want))


@pytest.mark.slow
def test_serves_a_run_directory(tmp_path):
  from configs import arithmetic
  cfg = arithmetic.get_config()
  run_dir = str(tmp_path / "run")
  _, states = _save_run(run_dir, cfg, (10, 20))
  flags = ["--checkpoint", run_dir, "--dtype", "float32", "--slots", "4", "--max_prefill_length", "16",
           "--max_decode_length", "6"]
  with pytest.raises(FileNotFoundError, match="--config"):
    serve_app.build_engine(*serve_app.parse(flags))  # no config.json recorded and no --config

  engine = serve_app.build_engine(*serve_app.parse(flags + ["--config", os.path.join(REPO, "configs/arithmetic.py")]))
  snapshot = engine.load_params()  # the newest step's params, cast and laid out for decoding
  _assert_trees_equal(snapshot, engine.sampler.prepare(states[20].params))
  with pytest.raises(AssertionError):  # the comparison can tell the two steps apart
    _assert_trees_equal(snapshot, engine.sampler.prepare(states[10].params))
  assert engine.stop_tokens == (2,)  # no tokenizer files: the arithmetic task's EOS (CharTokenizer.eos_id)
  with pytest.raises(InvalidRequest, match=r"vocabulary \[0, 32\)"):
    engine.check_prompt_ids([cfg.model.overrides["vocab_size"]])  # the run's vocabulary, not the HF default

  run_dir_lib.record_config(run_dir, cfg)  # as oapl_jax.main does at start
  engine = serve_app.build_engine(*serve_app.parse(flags + ["--step", "10"]))
  _assert_trees_equal(engine.load_params(), engine.sampler.prepare(states[10].params))
  with pytest.raises(ValueError, match="no checkpoint at step 30"):
    serve_app.build_engine(*serve_app.parse(flags + ["--step", "30"]))
