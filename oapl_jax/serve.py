"""Serve a Qwen model over gRPC with JetStream's orchestrator and our SamplerEngine.

    engine = build_engine(args)          # args: apps/serve.py's flags (oapl-serve)
    server = Server(engine, host="127.0.0.1", port=9000)

Clients speak JetStream's `Orchestrator.Decode` (jetstream/core/proto/jetstream.proto): text when
the model has a tokenizer (HF files, or a run's character tokenizer), token ids (or text of ids)
otherwise. Sampling settings are server flags (JetStream 0.2.2 has no per-request sampling
parameters); max_tokens is per request.

JetStream's driver threads SIGKILL their own process on any exception, so every request is
checked on the gRPC side first (`check_request`): a bad one (empty, too long, ids outside the
vocabulary, text without tokenizer files, max_tokens outside 1..max_decode_length) gets
INVALID_ARGUMENT with the reason, and only that client sees it. Nothing is truncated or clamped.
The server binds --host (127.0.0.1 by default; 0.0.0.0 or :: to listen on every interface).
"""
import argparse
import asyncio
import logging
import threading
from typing import Optional

import grpc
import jax

from oapl_jax import checkpoint_files, export, parallel
from oapl_jax.run import policy
from oapl_jax.sampler import jetstream_compat  # noqa: F401  (must precede jetstream.core)
from oapl_jax.sampler.engine import InvalidRequest, SamplerEngine, load_tokenizer
from oapl_jax.sampler.settings import SamplingSettings
from oapl_jax.tasks.char_tokenizer import CharTokenizer

_root_level = logging.getLogger().level
from jetstream.core import orchestrator  # noqa: E402
from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc  # noqa: E402

# jetstream.core.orchestrator points the root logger at stdout at DEBUG on import: undo that.
logging.getLogger().removeHandler(orchestrator.handler)
logging.getLogger().setLevel(_root_level)


# ------------------------------------------------------------------------------ the engine
def _run_engine(run: str, args: argparse.Namespace, cfg, settings: SamplingSettings,
                **engine_kwargs) -> SamplerEngine:
  """An engine over checkpoint --step (default: the newest) of a run directory, with the run's config
  (`cfg`; None: the one it recorded). Text is encoded as the run's prompts were (HF tokenizer files, or the
  character tokenizer's HF form, <bos> first); a run whose tokenizer has neither takes token ids, and a sample
  stops at the run's EOS (unless --stop_tokens says otherwise)."""
  weights = policy.policy(run, config=cfg, step=args.step)  # params only, no optimizer state
  cfg = weights.config
  run_tokenizer = export.run_tokenizer(cfg)
  source = export.tokenizer_source(run_tokenizer)
  if source:
    tokenizer, described = load_tokenizer(source), source
  elif isinstance(run_tokenizer, CharTokenizer):
    tokenizer, described = run_tokenizer.to_hf(), f"the {run_tokenizer.name} character tokenizer"
  else:
    tokenizer, described = None, "none (token ids)"
  if tokenizer is None and not settings.stop_tokens:
    settings = settings.replace(stop_tokens=(run_tokenizer.eos_id,))
  logging.info("oapl-serve: %s, checkpoint step %d (%d sync windows), tokenizer: %s", run,
               weights.step, weights.meta.syncs_done, described)
  model = weights.model.with_execution(param_dtype=args.dtype, dtype=args.dtype, remat=False)
  return SamplerEngine(model, params=weights.params, tokenizer=tokenizer, settings=settings, **engine_kwargs)


def build_engine(args: argparse.Namespace, cfg=None) -> SamplerEngine:
  """The engine apps/serve.py's flags ask for; `cfg`: a run directory's config from --config (else recorded)."""
  devices = jax.devices()[:args.tensor_parallel]
  layout = parallel.Layout(parallel.make_mesh((1, 1, len(devices)), devices=devices))
  settings = SamplingSettings(max_new_tokens=args.max_decode_length, temperature=args.temperature,
                              top_p=args.top_p, top_k=args.top_k, stop_tokens=args.stop_tokens or ())
  common = dict(layout=layout, max_concurrent_decodes=args.slots, max_prefill_length=args.max_prefill_length,
                seed=args.seed)
  path = str(checkpoint_files.absolute(args.checkpoint))  # as the user typed it: relative, or with ~
  if policy.is_run_dir(path):
    return _run_engine(path, args, cfg, settings, **common)
  if cfg is not None or args.step is not None:
    raise ValueError(f"--config and --step are for run directories; {path} has no checkpoints/ directory")
  return SamplerEngine.from_checkpoint(path, dtype=args.dtype, settings=settings, **common)


# ------------------------------------------------------------------------------ requests
def check_request(engine: SamplerEngine, request: jetstream_pb2.DecodeRequest) -> list[int]:
  """The prompt ids a DecodeRequest puts before the model, or InvalidRequest saying what is wrong."""
  if request.session_cache:
    raise InvalidRequest("session_cache (multi-turn prefix reuse) is not supported: send the whole prompt")
  engine.check_max_tokens(request.max_tokens)
  content = request.WhichOneof("content")
  if content == "text_content":
    return engine.check_prompt_text(request.text_content.text)
  if content == "token_content":
    return engine.check_prompt_ids(list(request.token_content.token_ids))
  raise InvalidRequest("the request has no prompt: set text_content or token_content")


class CheckedOrchestrator(jetstream_pb2_grpc.OrchestratorServicer):
  """JetStream's LLMOrchestrator with `check_request` in front: a bad request is answered
  INVALID_ARGUMENT here and never reaches the driver's threads."""

  def __init__(self, driver: orchestrator.Driver, engine: SamplerEngine):
    self._orchestrator = orchestrator.LLMOrchestrator(driver=driver)
    self._engine = engine

  async def Decode(self, request, context):  # noqa: N802 (the gRPC method's name)
    try:
      check_request(self._engine, request)
    except InvalidRequest as e:
      await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    async for response in self._orchestrator.Decode(request, context):
      yield response

  async def HealthCheck(self, request, context):  # noqa: N802
    return await self._orchestrator.HealthCheck(request, context)


def build_driver(engine: SamplerEngine, params=None) -> orchestrator.Driver:
  """An in-process JetStream orchestrator (interleaved: one engine prefills and generates)."""
  params = engine.load_params() if params is None else engine.sampler.prepare(params)
  return orchestrator.Driver(prefill_engines=[engine], generate_engines=[engine], prefill_params=[params],
                             generate_params=[params], interleaved_mode=True)


class Server:
  """CheckedOrchestrator over a JetStream Driver on a grpc.aio server bound to host:port, its event
  loop on a thread of its own (so a notebook or a test keeps its own thread)."""

  def __init__(self, engine: SamplerEngine, *, host: str = "127.0.0.1", port: int = 0, params=None):
    self.driver = build_driver(engine, params)
    self._loop = asyncio.new_event_loop()
    self._thread = threading.Thread(target=self._loop.run_forever, name="oapl-serve-grpc", daemon=True)
    self._thread.start()
    self._grpc = None
    bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
    try:
      self.port = self._call(self._start(engine, f"{bracketed}:{port}"))
    except BaseException:
      self.stop()
      raise
    self.address = f"{bracketed}:{self.port}"

  def _call(self, coroutine):
    return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

  async def _start(self, engine: SamplerEngine, address: str) -> int:
    self._grpc = grpc.aio.server()
    jetstream_pb2_grpc.add_OrchestratorServicer_to_server(CheckedOrchestrator(self.driver, engine), self._grpc)
    port = self._grpc.add_insecure_port(address)
    if not port:
      raise OSError(f"oapl-serve: cannot bind {address}")
    await self._grpc.start()
    return port

  def wait_for_termination(self) -> None:
    self._call(self._grpc.wait_for_termination())

  def stop(self, grace_seconds: float = 5.0) -> None:
    """Stop taking requests, let open streams finish (up to the grace), then stop the driver and loop.
    The loop stops last: JetStream's threads post results onto it until they end."""
    if self._grpc is not None:
      self._call(self._grpc.stop(grace_seconds))
    self.driver.stop()
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join()


class NoFalseTruncationWarning(logging.Filter):
  """JetStream prepends its BOS sentinel to token prompts, so one of exactly max_prefill_length
  tokens is "longer than available" to it: it drops the sentinel (SamplerEngine.prefill would drop it
  anyway) and warns of a truncation that loses no prompt token. Longer prompts never get there."""

  def filter(self, record):
    return record.getMessage() != "Provided sequence longer than available."
