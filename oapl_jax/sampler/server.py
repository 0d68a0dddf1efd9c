"""JetStream's gRPC orchestrator over a SamplerEngine, every request checked before JetStream sees it.

    server = Server(engine, host="127.0.0.1", port=9000)   # engine: a SamplerEngine (oapl-serve: apps/serve.py)
    server.wait_for_termination(); server.stop()

Clients speak JetStream's `Orchestrator.Decode` (jetstream/core/proto/jetstream.proto): text when
the model has a tokenizer (HF files, or a run's character tokenizer), token ids (or text of ids)
otherwise. Sampling settings are the engine's (JetStream 0.2.2 has no per-request sampling
parameters); max_tokens is per request.

JetStream's driver threads SIGKILL their own process on any exception, so every request is
checked on the gRPC side first (`check_request`): a bad one (empty, too long, ids outside the
vocabulary, text without tokenizer files, max_tokens outside 1..max_decode_length) gets
INVALID_ARGUMENT with the reason, and only that client sees it. Nothing is truncated or clamped. The check runs
on a worker thread, off the event loop, and a text longer in bytes than max_prefill_length tokens of the
vocabulary's longest can hold is refused before it is tokenized (a 1 MB prompt costs the server nothing).
Bytes that are no protobuf of the method's request type are INVALID_ARGUMENT too, not a server traceback.
"""
import asyncio
import logging
import threading

import grpc
from google.protobuf import message as protobuf_message

from oapl_jax.sampler import jetstream_compat  # noqa: F401  (must precede jetstream.core)
from oapl_jax.sampler.engine import InvalidRequest, SamplerEngine

_root_level = logging.getLogger().level
from jetstream.core import orchestrator  # noqa: E402
from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc  # noqa: E402

# jetstream.core.orchestrator points the root logger at stdout at DEBUG on import: undo that.
logging.getLogger().removeHandler(orchestrator.handler)
logging.getLogger().setLevel(_root_level)


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


class _Unparsed:
  """A request's bytes that did not parse (gRPC would log a traceback and answer UNKNOWN)."""

  def __init__(self, kind: str, error: Exception):
    self.reason = f"the request is not a {kind} protobuf ({error})"


def _lenient(message_type):
  def parse(data: bytes):
    try:
      return message_type.FromString(data)
    except protobuf_message.DecodeError as e:
      return _Unparsed(message_type.__name__, e)
  return parse


def _add_to_server(servicer: "CheckedOrchestrator", server) -> None:
  """jetstream_pb2_grpc.add_OrchestratorServicer_to_server, with `_lenient` request parsing."""
  handlers = {
      "Decode": grpc.unary_stream_rpc_method_handler(
          servicer.Decode, request_deserializer=_lenient(jetstream_pb2.DecodeRequest),
          response_serializer=jetstream_pb2.DecodeResponse.SerializeToString),
      "HealthCheck": grpc.unary_unary_rpc_method_handler(
          servicer.HealthCheck, request_deserializer=_lenient(jetstream_pb2.HealthCheckRequest),
          response_serializer=jetstream_pb2.HealthCheckResponse.SerializeToString)}
  server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("jetstream_proto.Orchestrator", handlers),))


class CheckedOrchestrator(jetstream_pb2_grpc.OrchestratorServicer):
  """JetStream's LLMOrchestrator with `check_request` in front: a bad request is answered
  INVALID_ARGUMENT here and never reaches the driver's threads."""

  def __init__(self, driver: orchestrator.Driver, engine: SamplerEngine):
    self._orchestrator = orchestrator.LLMOrchestrator(driver=driver)
    self._engine = engine

  async def Decode(self, request, context):  # noqa: N802 (the gRPC method's name)
    if isinstance(request, _Unparsed):
      await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
    try:  # on a worker thread: tokenizing one prompt never holds up the other clients' requests
      await asyncio.to_thread(check_request, self._engine, request)
    except InvalidRequest as e:
      await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    async for response in self._orchestrator.Decode(request, context):
      yield response

  async def HealthCheck(self, request, context):  # noqa: N802
    if isinstance(request, _Unparsed):
      await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
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
    bound = engine.max_request_bytes  # larger messages are refused by their length, unread
    self._grpc = grpc.aio.server(options=[] if bound is None else [("grpc.max_receive_message_length", bound)])
    _add_to_server(CheckedOrchestrator(self.driver, engine), self._grpc)
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
