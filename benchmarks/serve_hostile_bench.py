"""oapl-serve under hostile clients: the latency of M valid clients, alone and beside N hostile ones (issue 54).

    taskset -c 1 python -m benchmarks.serve_hostile_bench [--valid 4 --hostile 4 --seconds 15 --json out.json]
    git worktree add /tmp/serve_before 7851844^
    taskset -c 1 python -m benchmarks.serve_hostile_bench --repo /tmp/serve_before     # the server of that tree

The server is `oapl-serve` run from --repo (PYTHONPATH=REPO) on 127.0.0.1 over a tiny random Qwen3 with a byte-level
BPE tokenizer (tests/hf_fixtures.py), made in --workdir. Valid clients send short text prompts (greedy, 8 new
tokens) back to back on one channel each; a request's latency is its call to the end of its stream. Phases: quiet,
each hostile kind alone, all kinds together (N clients of each), quiet again (how far the host itself drifted).
Hostile clients run in a worker process of their own (their GIL apart from the valid clients'), back to back:
  big_prompt   a 1 MB text prompt of random words (pre-serialized: the client spends no CPU building it).
  garbage      bytes that are no DecodeRequest protobuf, sent as a Decode call's body.
  slow_sender  a raw HTTP/2 connection that opens a Decode call (HEADERS), declares a 1 MB message and trickles
               16 bytes every 0.5 s, answering SETTINGS and PINGs so the transport keeps it. For as long as it
               trickles it holds a connection, a stream and an accepted call: grpc.aio takes the call once its
               HEADERS arrive and keeps an asyncio task awaiting the message (seen on a bare grpc.aio server). A
               socket that never finishes the HTTP/2 preface would hold only a socket in gRPC's C core.
Reported per phase: valid requests, p50/p90/p99 latency (nearest rank), errors, p99 / quiet p99, tracebacks the
server logged, CPU seconds of the server, the valid clients and the hostile worker; and per hostile kind what its
requests got back and when. Every process shares the CPUs the benchmark was started on (taskset), the hostile
clients' own work included. A benchmark, not a test.
"""
import argparse
import collections
import json
import math
import os
import random
import resource
import select
import socket
import subprocess
import sys
import threading
import time

import grpc
from jetstream.core.proto import jetstream_pb2 as pb
from jetstream.core.proto import jetstream_pb2_grpc as pb_grpc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECODE_PATH = "/jetstream_proto.Orchestrator/Decode"
KINDS = ("big_prompt", "slow_sender", "garbage")
PHASES = [("quiet", ()), *((kind, (kind,)) for kind in KINDS), ("all", KINDS), ("quiet_again", ())]
SERVER_FLAGS = ["--dtype", "float32", "--slots", "8", "--max_prefill_length", "64", "--max_decode_length", "16"]
NEW_TOKENS = 8
TIMEOUT_S = 300  # any one call, valid or hostile (the server before issue 54 tokenized a 1 MB prompt for seconds)
GARBAGE = b"\xff\xff\xff\xff not a protobuf"
# HTTP/2 (RFC 9113): the client preface and the frame types the slow sender writes or reads.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
ACK, END_HEADERS = 0x1, 0x4


# ------------------------------------------------------------------------------ numbers and tables
def percentile(values, q: float):
  """The nearest-rank q-th percentile (the smallest value with at least q% of values at or below it); None if empty."""
  if not values:
    return None
  ordered = sorted(values)
  return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def valid_row(phase: str, latencies_s, errors, tracebacks: int, quiet_p99_ms=None, **cpu_s) -> dict:
  ms = [1e3 * s for s in latencies_s]
  row = dict(phase=phase, requests=len(ms), errors=len(errors), error_codes=dict(collections.Counter(errors)),
             tracebacks=tracebacks, **{f"p{q}_ms": percentile(ms, q) for q in (50, 90, 99)}, **cpu_s)
  quiet = row["p99_ms"] if quiet_p99_ms is None else quiet_p99_ms
  row["p99_vs_quiet"] = row["p99_ms"] / quiet if row["p99_ms"] is not None and quiet else None
  return row


def hostile_row(phase: str, kind: str, outcomes) -> dict:
  """outcomes: (what came back, seconds until it did) per hostile request (a slow sender: per connection)."""
  ms = [1e3 * s for _, s in outcomes]
  return dict(phase=phase, kind=kind, requests=len(outcomes), answers=dict(collections.Counter(a for a, _ in outcomes)),
              p50_ms=percentile(ms, 50), max_ms=max(ms, default=None))


def _num(value, digits=1) -> str:
  return "-" if value is None else f"{value:.{digits}f}"


def markdown(valid_rows, hostile_rows) -> str:
  lines = ["| phase | valid requests | p50 ms | p90 ms | p99 ms | errors | p99 / quiet p99 | server tracebacks | "
           "CPU s: server / valid clients / hostile clients |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
  lines += [f"| {r['phase']} | {r['requests']} | {_num(r['p50_ms'])} | {_num(r['p90_ms'])} | {_num(r['p99_ms'])} | "
            f"{r['errors']} | {_num(r['p99_vs_quiet'], 2)} | {r['tracebacks']} | "
            f"{r['server_cpu_s']:.1f} / {r['valid_cpu_s']:.1f} / {r['hostile_cpu_s']:.1f} |" for r in valid_rows]
  lines += ["", "| phase | hostile kind | requests | what came back | time to it, p50 / max ms |", "|---|---|---:|---|---:|"]
  lines += [f"| {r['phase']} | {r['kind']} | {r['requests']} | "
            f"{', '.join(f'{a} {n}' for a, n in sorted(r['answers'].items())) or '-'} | "
            f"{_num(r['p50_ms'], 0)} / {_num(r['max_ms'], 0)} |" for r in hostile_rows]
  return "\n".join(lines)


# ------------------------------------------------------------------------------ the model and the server
def make_checkpoint(workdir: str) -> str:
  """A tiny random Qwen3 whose vocabulary is its byte-level BPE tokenizer's (made once in workdir)."""
  path = os.path.join(workdir, "qwen3_tiny")
  if not os.path.exists(os.path.join(path, "config.json")):
    from tests.hf_fixtures import make_chat_tokenizer, make_hf_checkpoint
    tokenizer = make_chat_tokenizer(path)
    make_hf_checkpoint(path, "qwen3", vocab_size=len(tokenizer))
  return path


def start_server(repo: str, checkpoint: str, log_path: str):
  """(process, address) of oapl-serve from `repo` on 127.0.0.1, once it listens."""
  env = dict(os.environ, PYTHONPATH=repo, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  cmd = [sys.executable, "-m", "oapl_jax.apps.serve", "--checkpoint", checkpoint, "--port", "0", *SERVER_FLAGS]
  with open(log_path, "w") as log:
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
  line = proc.stdout.readline() if select.select([proc.stdout], [], [], 300)[0] else ""
  if " on 127.0.0.1:" not in line:
    proc.kill()
    raise RuntimeError(f"oapl-serve did not start: {line!r}; its log: {log_path}")
  return proc, line.split(" on ", 1)[1].split()[0]


# ------------------------------------------------------------------------------ valid clients
PROMPTS = [f"What is {a}+{b}? The answer is" for a in range(1, 10) for b in range(1, 10)]


def run_valid(channels, seconds: float, seed: int):
  """Each channel's client sends requests back to back for `seconds` (at least one): (latencies in s, error codes)."""
  latencies, errors = [], []
  deadline = time.perf_counter() + seconds

  def client(index, channel):
    stub, rng = pb_grpc.OrchestratorStub(channel), random.Random(seed + index)
    while True:
      request = pb.DecodeRequest(text_content=pb.DecodeRequest.TextContent(text=rng.choice(PROMPTS)),
                                 max_tokens=NEW_TOKENS)
      began = time.perf_counter()
      try:
        for _ in stub.Decode(request, timeout=TIMEOUT_S):
          pass
        latencies.append(time.perf_counter() - began)
      except grpc.RpcError as e:
        errors.append(e.code().name)
      if time.perf_counter() >= deadline:
        return

  threads = [threading.Thread(target=client, args=(i, c)) for i, c in enumerate(channels)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return latencies, errors


# ------------------------------------------------------------------------------ hostile clients
def unary_client(address: str, body: bytes, stop: threading.Event, outcomes: list) -> None:
  """Decode calls with `body` as their raw request bytes, back to back until `stop`."""
  with grpc.insecure_channel(address) as channel:
    rpc = channel.unary_stream(DECODE_PATH, request_serializer=bytes, response_deserializer=bytes)
    while not stop.is_set():
      began = time.perf_counter()
      try:
        for _ in rpc(body, timeout=TIMEOUT_S):
          pass
        answer = "OK"
      except grpc.RpcError as e:
        answer = e.code().name
      outcomes.append((answer, time.perf_counter() - began))


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
  return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _decode_headers(authority: str) -> bytes:
  """A Decode call's request headers in HPACK: literal fields without indexing, new names, no Huffman."""
  fields = ((":method", "POST"), (":scheme", "http"), (":path", DECODE_PATH), (":authority", authority),
            ("content-type", "application/grpc"), ("te", "trailers"))
  return b"".join(b"\x00" + bytes([len(n)]) + n.encode() + bytes([len(v)]) + v.encode() for n, v in fields)


def _trickle(sock: socket.socket, stop: threading.Event, interval_s: float) -> str:
  """Sends 16 bytes of the message every interval, answering SETTINGS and PINGs, until `stop` or the server ends it."""
  pending = b""
  while not stop.is_set():
    if not select.select([sock], [], [], interval_s)[0]:
      sock.sendall(_frame(DATA, 0, 1, b"x" * 16))
      continue
    data = sock.recv(65536)
    if not data:
      return "connection closed"
    pending += data
    while len(pending) >= 9 and len(pending) >= 9 + int.from_bytes(pending[:3], "big"):
      length, kind, flags = int.from_bytes(pending[:3], "big"), pending[3], pending[4]
      payload, pending = pending[9:9 + length], pending[9 + length:]
      if kind in (SETTINGS, PING) and not flags & ACK:
        sock.sendall(_frame(kind, ACK, 0, payload if kind == PING else b""))
      elif kind in (GOAWAY, RST_STREAM):
        return "GOAWAY" if kind == GOAWAY else "RST_STREAM"
  return "held to the end"


def slow_sender(address: str, stop: threading.Event, outcomes: list, interval_s: float = 0.5) -> None:
  """A Decode call whose 1 MB message comes 16 bytes at a time; a new connection whenever the server ends one."""
  host, port = address.rsplit(":", 1)
  while not stop.is_set():
    began = time.perf_counter()
    with socket.create_connection((host, int(port))) as sock:
      sock.sendall(PREFACE + _frame(SETTINGS, 0, 0) + _frame(HEADERS, END_HEADERS, 1, _decode_headers(address))
                   + _frame(DATA, 0, 1, b"\x00" + (1 << 20).to_bytes(4, "big")))
      outcomes.append((_trickle(sock, stop, interval_s), time.perf_counter() - began))


def big_prompt_body(seed: int) -> bytes:
  rng = random.Random(seed)
  words = " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(1, 9))) for _ in range(200_000))
  return pb.DecodeRequest(text_content=pb.DecodeRequest.TextContent(text=words[:1 << 20]),
                          max_tokens=NEW_TOKENS).SerializeToString()


def hostile_worker(address: str, kinds, clients: int, seed: int) -> None:
  """N clients of each kind until stdin closes; then (calls in flight finished) their outcomes as JSON on stdout."""
  stop, outcomes = threading.Event(), {kind: [] for kind in kinds}
  bodies = dict(big_prompt=big_prompt_body(seed), garbage=GARBAGE)
  threads = [threading.Thread(target=slow_sender, args=(address, stop, outcomes[kind])) if kind == "slow_sender" else
             threading.Thread(target=unary_client, args=(address, bodies[kind], stop, outcomes[kind]))
             for kind in kinds for _ in range(clients)]
  for t in threads:
    t.start()
  print("ready", flush=True)
  sys.stdin.read()
  stop.set()
  for t in threads:
    t.join()
  print(json.dumps(outcomes), flush=True)


# ------------------------------------------------------------------------------ the phases
def cpu_seconds(pid=None) -> float:
  """CPU seconds (user + system) of process `pid` (from /proc), or of this process and its waited-for children."""
  if pid is None:
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tracebacks(log_path: str) -> int:
  with open(log_path, errors="replace") as f:
    return f.read().count("Traceback")


def run_phase(name, kinds, channels, args, server_pid, address, log_path, quiet_p99_ms):
  """(the valid clients' row, the hostile kinds' rows) of one phase."""
  tracebacks_before = _tracebacks(log_path)
  server_cpu, own_cpu, worker = cpu_seconds(server_pid), cpu_seconds(), None
  if kinds:
    cmd = [sys.executable, "-m", "benchmarks.serve_hostile_bench", "--worker", ",".join(kinds), "--address", address,
           "--hostile", str(args.hostile), "--seed", str(args.seed)]
    worker = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if worker.stdout.readline().strip() != "ready":
      raise RuntimeError(f"the hostile worker for {kinds} did not start")
    time.sleep(1.0)  # the hostile clients connected and sending
  print(f"{name}: {len(channels)} valid clients for {args.seconds:.0f} s beside "
        f"{args.hostile if kinds else 0} each of {', '.join(kinds) or 'none'} (load {os.getloadavg()[0]:.1f})",
        flush=True)
  latencies, errors = run_valid(channels, args.seconds, args.seed)
  valid_cpu, hostile = cpu_seconds() - own_cpu, {}
  if worker:
    began = time.perf_counter()
    hostile = json.loads(worker.communicate("")[0])
    print(f"  hostile clients' calls in flight ended {time.perf_counter() - began:.1f} s after the phase", flush=True)
  row = valid_row(name, latencies, errors, _tracebacks(log_path) - tracebacks_before, quiet_p99_ms,
                  server_cpu_s=cpu_seconds(server_pid) - server_cpu, valid_cpu_s=valid_cpu,
                  hostile_cpu_s=cpu_seconds() - own_cpu - valid_cpu)  # the worker's, once waited for
  print(f"  valid: {row['requests']} requests, p50 {_num(row['p50_ms'])} ms, p99 {_num(row['p99_ms'])} ms, "
        f"{row['errors']} errors {row['error_codes'] or ''}", flush=True)
  return row, [hostile_row(name, kind, hostile[kind]) for kind in kinds]


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repo", default=REPO, help="the source tree whose oapl-serve to measure (default: this one)")
  ap.add_argument("--workdir", default="/tmp/serve_hostile_bench", help="the checkpoint (made once) and the server log")
  ap.add_argument("--valid", type=int, default=4, help="M: valid clients")
  ap.add_argument("--hostile", type=int, default=4, help="N: hostile clients of each kind")
  ap.add_argument("--seconds", type=float, default=15.0, help="each phase's duration")
  ap.add_argument("--warmup", type=float, default=5.0, help="seconds of valid requests before the quiet phase")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--json", help="write the rows here")
  ap.add_argument("--worker", help=argparse.SUPPRESS)  # the hostile worker process: its kinds
  ap.add_argument("--address", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.worker:
    return hostile_worker(args.address, args.worker.split(","), args.hostile, args.seed)

  from benchmarks import ceiling
  repo = os.path.abspath(args.repo)
  commit = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
  os.makedirs(args.workdir, exist_ok=True)
  log_path = os.path.join(args.workdir, "server.log")
  print(f"cpu: {ceiling.cpu_description()}; CPUs {sorted(os.sched_getaffinity(0))}; load {os.getloadavg()}\n"
        f"server: {repo} at {commit.strip()}, {' '.join(SERVER_FLAGS)}; log {log_path}", flush=True)
  server, address = start_server(repo, make_checkpoint(args.workdir), log_path)
  channels = [grpc.insecure_channel(address) for _ in range(args.valid)]
  valid_rows, hostile_rows = [], []
  try:
    began = time.perf_counter()
    run_valid(channels[:1], 0, args.seed)  # one request: the first compiles
    run_valid(channels, args.warmup, args.seed)
    print(f"server at {address}, warm after {time.perf_counter() - began:.1f} s", flush=True)
    for name, kinds in PHASES:
      row, rows = run_phase(name, kinds, channels, args, server.pid, address, log_path,
                            valid_rows[0]["p99_ms"] if valid_rows else None)
      valid_rows.append(row)
      hostile_rows += rows
      if server.poll() is not None:
        raise RuntimeError(f"the server exited ({server.returncode}) in phase {name}; its log: {log_path}")
  finally:
    for channel in channels:
      channel.close()
    server.terminate()
    server.wait(60)
  print(f"\nload after: {os.getloadavg()}\n" + markdown(valid_rows, hostile_rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(repo=repo, commit=commit.strip(), cpu=ceiling.cpu_description(), load_after=os.getloadavg(),
                     args=vars(args), valid=valid_rows, hostile=hostile_rows), f, indent=1)


if __name__ == "__main__":
  main()
