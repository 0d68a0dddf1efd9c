"""Code-execution reward: the response's last fenced code block, run against the problem's tests.

    from oapl_jax.tasks import code_reward
    code_reward.score(record, response)                     # one record -> 0.0 or 1.0
    reward = code_reward.CodeReward(num_workers=8)          # batches, in parallel
    reward(records, responses) -> RewardResult; reward.close()

The code is the last ``` fenced block (any language tag, or none) of the whole response; no block
scores 0. All of a program's tests run in ONE sandboxed child (`sandbox.py`; with CodeReward's batch_size,
several programs' one after another, each in a fresh interpreter: code_batch.py): a harness there
(`code_harness.py`) compiles the code once and forks a fresh process per test, with the test's stdin as fd 0, a
per-test wall limit (`timeout_s`) and CPU limit, killing everything the test left behind. The
program runs unbuffered (as `python -u`, or a terminal), so what it printed before os._exit or a
crash is kept. The sandbox gets the code and the inputs only: nothing derived from the expected
outputs (not even their sizes) enters it, so the program cannot find them in memory. Each test's
stdout (or return value) is capped by a fixed `output_bytes`, the run's total by
`total_output_bytes`, and the comparison runs here, in the grader, on at most a small multiple of
the expected output (a longer output or line fails unparsed: `output_match.py`); the sandbox hands back
no more of each test's output than that (`GraderHead`, applied here as it arrives). Reward 1.0 iff every
test passes (`partial_credit=True`: the fraction passed). Without partial credit the harness stops at
the first test that crashes or times out. A test that crashes, or kills itself or its process
group, fails; only a test out of wall or CPU time counts as a timeout.

Record fields read (a record may also be a JSON string of one):
  tests               JSON string or object, either
                        a list of cases {"input", "output", ...} (DeepCoder lcbv5, codeforces,
                        primeintellect; LiveCodeBench), a case optionally with "testtype"
                        ("stdin" | "functional"), "type" ("stdin_stdout" | "function_call"),
                        "fn_name", or "metadata": {"func_name"}; or
                        a dict {"inputs": [...], "outputs": [...], "fn_name"?} (DeepCoder taco,
                        APPS), whose call outputs may be wrapped in a one-element list.
  public_test_cases,  LiveCodeBench's originals, used when there is no `tests`: lists of cases as
  private_test_cases  above, as JSON or as base64(zlib(pickle(JSON))) (unpickled with no globals).
  fn_name, metadata   the function name when the cases do not carry one: record["fn_name"], or
                      record["metadata"] (dict or JSON string) ["func_name"] / ["fn_name"].
A function name makes the tests function-call tests unless the cases say "stdin"/"stdin_stdout".
Stdin/stdout tests: input is the stdin text, output compared by lines after strip(), a line
matching exactly or as equal Decimal tokens (LiveCodeBench's rule). Function-call tests:
`Solution().fn_name(*args)` if the code defines class Solution with it, else `fn_name(*args)`;
args are the input's lines as JSON values (or the input list itself); the JSON-encoded return
value must equal the expected output (JSON, or the raw string if it is not JSON). Both kinds run
after a prelude of common imports (typing, collections, heapq, bisect, math, itertools, ...).
"""
from __future__ import annotations

import base64
import collections
import concurrent.futures as cf
import dataclasses
import hashlib
import io
import json
import marshal
import pickle
import re
import zlib
from typing import Any, Mapping, Sequence

import numpy as np

from oapl_jax.tasks import base, code_batch, output_match, sandbox, sandbox_pool
from oapl_jax.tasks.output_match import returned_matches, stdout_matches

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str | None:
  """The content of the last fenced code block, or None if there is none."""
  blocks = _FENCE.findall(response)
  return blocks[-1] if blocks else None


@dataclasses.dataclass(frozen=True)
class TestSuite:
  """Normalized tests: fn_name None means stdin/stdout tests (inputs and outputs are text)."""
  fn_name: str | None
  inputs: tuple
  outputs: tuple
  unwrap_single: bool = False  # APPS/taco call outputs: [value] may stand for value


class _NoGlobals(pickle.Unpickler):
  def find_class(self, module, name):
    raise pickle.UnpicklingError(f"refusing to load {module}.{name} from test data")


def _load(value: Any) -> Any:
  """JSON text, LiveCodeBench's base64(zlib(pickle(JSON))) text, or an already parsed object."""
  if not isinstance(value, (str, bytes)):
    return value
  try:
    return json.loads(value)
  except ValueError:
    text = _NoGlobals(io.BytesIO(zlib.decompress(base64.b64decode(value)))).load()
    if not isinstance(text, str):
      raise ValueError(f"compressed test cases hold a {type(text).__name__}, not JSON text")
    return json.loads(text)


def _fn_name(holder: Mapping) -> str | None:
  """holder["fn_name"], or its metadata's (a dict or JSON text; anything else holds none)."""
  metadata = holder.get("metadata") or {}
  if isinstance(metadata, str):
    metadata = _json_or_text(metadata)
  metadata = metadata if isinstance(metadata, Mapping) else {}
  return holder.get("fn_name") or metadata.get("func_name") or metadata.get("fn_name") or None


def parse_tests(record: Mapping, max_tests: int | None = None) -> TestSuite:
  """The record's tests (see the module docstring); max_tests keeps the longest inputs (as
  DeepCoder does). Raises ValueError for a record without usable tests."""
  if record.get("tests") is not None:
    tests = _load(record["tests"])
  elif record.get("public_test_cases") is not None or record.get("private_test_cases") is not None:
    tests = [*(_load(record.get("public_test_cases")) or []), *(_load(record.get("private_test_cases")) or [])]
  else:
    raise ValueError(f"record has no 'tests' nor 'public_test_cases'; fields: {sorted(record)}")
  unwrap = isinstance(tests, Mapping)
  if unwrap:
    inputs, outputs, fn_name, kind = tests["inputs"], tests["outputs"], tests.get("fn_name"), None
  elif isinstance(tests, list) and all(isinstance(t, Mapping) for t in tests):
    inputs, outputs = [t["input"] for t in tests], [t["output"] for t in tests]
    first = tests[0] if tests else {}
    fn_name, kind = _fn_name(first), first.get("testtype") or first.get("type")
  else:
    raise ValueError(f"tests must be a list of cases or a dict of lists, got {type(tests).__name__}")
  if not inputs or len(inputs) != len(outputs):
    raise ValueError(f"need as many outputs as inputs (> 0): {len(inputs)} vs {len(outputs)}")
  fn_name = fn_name or _fn_name(record)
  if kind in ("stdin", "stdin_stdout"):
    fn_name = None
  if fn_name is None:
    inputs = ["\n".join(map(str, i)) if isinstance(i, list) else str(i) for i in inputs]
    outputs = ["\n".join(map(str, o)) if isinstance(o, list) else str(o) for o in outputs]
  else:
    inputs = [[json.loads(line) for line in i.split("\n") if line.strip()] if isinstance(i, str)
              else list(i) if isinstance(i, (list, tuple)) else [i] for i in inputs]
    outputs = [_json_or_text(o) for o in outputs]
  if max_tests is not None and len(inputs) > max_tests:
    keep = sorted(sorted(range(len(inputs)), key=lambda k: -len(repr(inputs[k])))[:max_tests])
    inputs, outputs = [inputs[k] for k in keep], [outputs[k] for k in keep]
  return TestSuite(fn_name, tuple(inputs), tuple(outputs), unwrap_single=unwrap)


def _json_or_text(value: Any) -> Any:
  try:
    return json.loads(value) if isinstance(value, str) else value
  except ValueError:
    return value


# ---- The parent side: jobs, grading, the reward. ----

@dataclasses.dataclass(frozen=True)
class Settings:
  """output_bytes: the most stdout (or JSON return value) one test may produce, more fails it;
  total_output_bytes: the most one program's run may send back for all its tests, more fails the tests not yet
  sent (the grader keeps of each test only what it reads: GraderHead). Both fixed: a cap derived from the
  expected outputs would tell the program their sizes.
  """
  timeout_s: float = 6.0  # per test
  partial_credit: bool = False
  max_tests: int | None = None
  memory_bytes: int = 1 << 30
  output_bytes: int = 32 << 20
  total_output_bytes: int = 256 << 20

  def __post_init__(self):
    if not self.timeout_s > 0 or min(self.memory_bytes, self.output_bytes, self.total_output_bytes) <= 0:
      raise ValueError(f"settings must be positive: {self}")


def _program(record: Mapping | str, response: str, settings: Settings) -> tuple[TestSuite, code_batch.Program | None]:
  """The record's tests and the response's code on their inputs, as a job's program (None: no code). The program
  is made of the code and the inputs only: records that differ only in their expected outputs give the same one."""
  record = json.loads(record) if isinstance(record, str) else record
  suite = parse_tests(record, settings.max_tests)
  code = extract_code(response)
  if code is None:
    return suite, None
  entry = marshal.dumps(dict(code=code, fn_name=suite.fn_name, inputs=list(suite.inputs)))
  return suite, code_batch.Program(entry, len(suite.inputs), max(len(str(i).encode()) for i in suite.inputs))


def _job(record: Mapping | str, response: str, settings: Settings) -> tuple[TestSuite, sandbox.Job | None]:
  """The record's tests and the sandbox job that runs the response's code on them alone (None: no code). The job
  is made of the code, the inputs and `settings` only (tests/tasks_code_reward_test.py checks this)."""
  suite, program = _program(record, response, settings)
  return suite, None if program is None else code_batch.job([program], settings)


def _cache_key(suite: TestSuite, program: code_batch.Program, settings: Settings) -> bytes:
  """What decides a clean run's reward: the program (code, inputs), the settings and the expected outputs."""
  digest = hashlib.blake2b(program.entry, digest_size=16)
  digest.update(repr((settings, suite.outputs, suite.unwrap_single)).encode())
  return digest.digest()


def _parse_records(stdout: bytes) -> list[tuple[str, memoryview]]:
  """The harness's per-test records "i status seconds length\\n" + payload, in test order (views of stdout)."""
  records, pos, view = [], 0, memoryview(stdout)
  while (end := stdout.find(b"\n", pos, pos + 64)) >= 0:  # a record's header is short
    fields = stdout[pos:end].split()
    if len(fields) != 4 or fields[0] != b"%d" % len(records) or not fields[3].isdigit():
      break  # a record the harness did not write: the run ended there
    records.append((fields[1].decode(errors="replace"), view[end + 1:end + 1 + int(fields[3])]))
    pos = end + 1 + int(fields[3])
  return records


_CUT_MARGIN = 64  # bytes kept past what the grader reads: a cut output is still longer, so it still fails


@dataclasses.dataclass
class OutputsCut:
  """Test outputs the grader was handed cut to what it reads (CodeReward.cut): how many, bytes dropped."""
  tests: int = 0
  bytes: int = 0


class GraderHead:
  """Keeps of the harness's record stream (see _parse_records), chunk by chunk as it arrives, each test's
  header and the first caps[i] bytes of its payload (none of a test that did not pass: the grader reads
  no more), the header then giving the length kept. After a record the harness did not write nothing is
  kept (the grader stops there: `broken`). What it drops is counted in `cut`. separated: one program of a
  batch (code_batch.BatchHead), whose records end at code_batch.SEPARATOR (then `ended`)."""

  def __init__(self, caps: Sequence[int], separated: bool = False):
    self.caps, self.cut, self.separated, self.ended, self.broken = list(caps), OutputsCut(), separated, False, False
    self._header, self._index, self._left, self._keep = bytearray(), 0, 0, 0

  def __call__(self, chunk: bytes) -> bytes:
    kept, rest = self.feed(chunk)
    self.cut.bytes += len(rest)  # past a broken record
    return kept

  def feed(self, chunk: bytes | memoryview) -> tuple[bytes, memoryview]:
    """(what it keeps of chunk, what follows its records' end: a separator, or a record the harness did not write)."""
    kept, view = bytearray(), memoryview(chunk)
    while view and not self.broken and not self.ended:
      if self._left:  # inside a payload
        n = min(len(view), self._left)
        k = min(n, self._keep)
        kept += view[:k]
        self._left, self._keep, view = self._left - n, self._keep - k, view[n:]
        continue
      end = bytes(view[:64 - len(self._header)]).find(b"\n")  # a record's header is short
      if end < 0 and len(self._header) + len(view) < 64:
        self._header += view
        view = view[:0]
        break
      take = end + 1 if end >= 0 else 64 - len(self._header)
      self._header += view[:take]
      view = view[take:]
      kept += self._start_record()
    return bytes(kept), view

  def _start_record(self) -> bytes:
    """The header just read, with the length to be kept; sets what to keep of its payload."""
    header, self._header = bytes(self._header), bytearray()
    if self.separated and header == code_batch.SEPARATOR:
      self.ended = True
      return b""
    fields = header.split()
    if (len(fields) != 4 or fields[0] != b"%d" % self._index or not fields[3].isdigit()
        or self._index >= len(self.caps) or not header.endswith(b"\n")):
      self.broken = True
      self.cut.bytes += len(header)
      return b""
    self._left = int(fields[3])
    self._keep = min(self._left, self.caps[self._index]) if fields[1] == b"ok" else 0
    if self._keep < self._left:
      self.cut.tests += 1
      self.cut.bytes += self._left - self._keep
    self._index += 1
    return b" ".join(fields[:3] + [b"%d" % self._keep]) + b"\n"


def output_caps(suite: TestSuite) -> list[int]:
  """What the grader reads of each test's output (output_match's budgets), and _CUT_MARGIN more."""
  budget = output_match.stdout_budget if suite.fn_name is None else output_match.returned_budget
  return [budget(expected) + _CUT_MARGIN for expected in suite.outputs]


def grade(suite: TestSuite, result: sandbox.RunResult, partial_credit: bool) -> tuple[float, bool]:
  """(reward, whether a test or the run timed out) from the harness's run of one program."""
  return grade_records(suite, result.stdout, result.reason == "timeout", partial_credit)


def grade_records(suite: TestSuite, records: bytes, timed_out: bool, partial_credit: bool) -> tuple[float, bool]:
  """(reward, whether a test timed out or `timed_out`) from one program's records; the work is bounded by the
  expected outputs' sizes (stdout_matches, returned_matches), however much the program printed."""
  passed = 0
  for (status, payload), expected in zip(_parse_records(records), suite.outputs):
    timed_out |= status == "timeout"
    if status != "ok":
      continue
    if suite.fn_name is None:
      passed += stdout_matches(payload, expected)
    else:
      passed += returned_matches(payload, expected, suite.unwrap_single)
  total = len(suite.inputs)
  return (passed / total if partial_credit else float(passed == total)), timed_out


def score(record: Mapping | str, response: str, *, timeout_s: float = 6.0, partial_credit: bool = False,
          max_tests: int | None = None, memory_bytes: int = 1 << 30, output_bytes: int = 32 << 20,
          total_output_bytes: int = 256 << 20,
          config: sandbox.SandboxConfig = sandbox.SandboxConfig()) -> float:
  """The reward of one response: 1.0 iff its code passes all the record's tests (see module doc)."""
  settings = Settings(timeout_s, partial_credit, max_tests, memory_bytes, output_bytes, total_output_bytes)
  suite, job = _job(record, response, settings)
  if job is None:
    return 0.0
  result = sandbox.run(job.source, job.stdin, job.limits, config, GraderHead(output_caps(suite)))
  return grade(suite, result, partial_credit)[0]


class CodeReward:
  """Batched code reward on a SandboxPool: (records, responses) -> RewardResult.

  num_failed counts records without usable tests and runs the sandbox could not start;
  num_timeout counts programs with a test (or the whole run) out of time. stats(): the pool's
  throughput (sandbox runs, each of up to batch_size programs), for the trainer's log; cut: the test
  outputs the sandbox handed back cut to what the grader reads (output_caps), over all calls.

  batch_size > 1 hands up to that many programs of a call to one sandbox run (namespace isolation only; in
  fallback mode every program runs alone), which saves most of a run's start-up per program; a call's programs
  are split evenly into batches, at least one per worker. The harness
  runs them one after another, each in a fresh interpreter, every process of the one before killed and /work
  emptied before the next starts; a program's rewards are the same as alone, and one that kills the harness
  or uses up the run's wall time makes the rest run again (code_batch.py). Default 1: a run per program.

  cache_size > 0 keeps the reward of up to that many (code, tests) pairs, least recently used out first: a
  program met again (a policy that has converged writes the same few programs for a prompt) is not run again.
  Only clean runs are kept (no timeout, no sandbox error), so a program timed out under load runs again;
  cache_hits counts what the cache answered. Exact for programs whose result depends on their code and
  inputs only, as a grader's tests assume; leave it 0 for tasks whose programs read the clock or randomness.
  """

  def __init__(self, num_workers: int = 2, timeout_s: float = 6.0, partial_credit: bool = False,
               max_tests: int | None = None, memory_bytes: int = 1 << 30, output_bytes: int = 32 << 20,
               total_output_bytes: int = 256 << 20, config: sandbox.SandboxConfig = sandbox.SandboxConfig(),
               cache_size: int = 0, batch_size: int = 1):
    if cache_size < 0 or batch_size < 1:
      raise ValueError(f"need cache_size >= 0 and batch_size >= 1, got {cache_size}, {batch_size}")
    self.settings = Settings(timeout_s, partial_credit, max_tests, memory_bytes, output_bytes, total_output_bytes)
    self.pool = sandbox_pool.SandboxPool(num_workers, config=config)
    self.batch_size = batch_size if self.pool.isolation == "namespaces" else 1
    self.num_workers = num_workers
    self.cut = OutputsCut()  # test outputs cut to what the grader reads, over all calls
    self.cache_size, self.cache_hits = cache_size, 0
    self._cache: collections.OrderedDict[bytes, float] = collections.OrderedDict()

  def __call__(self, records: Sequence[Mapping | str], responses: Sequence[str]) -> base.RewardResult:
    if len(records) != len(responses):
      raise ValueError(f"{len(records)} records but {len(responses)} responses")
    rewards = np.zeros(len(records), np.float32)
    failed = timeouts = 0
    items = []  # (row, suite, program, cache key) to run
    for i, (record, response) in enumerate(zip(records, responses)):
      try:
        suite, program = _program(record, response, self.settings)
      except (ValueError, KeyError, TypeError, AttributeError, zlib.error, pickle.UnpicklingError) as e:
        sandbox.log.warning("code reward: record %d has no usable tests: %r", i, e)
        failed += 1
        continue
      if program is None:
        continue
      key = _cache_key(suite, program, self.settings) if self.cache_size else b""
      if key in self._cache:
        self._cache.move_to_end(key)
        rewards[i] = self._cache[key]
        self.cache_hits += 1
        continue
      items.append((i, suite, program, key))
    pending: dict[cf.Future, tuple[list, GraderHead | code_batch.BatchHead]] = {}
    groups = max(min(self.num_workers, len(items)), -(-len(items) // self.batch_size))  # even, every worker busy
    for k in range(groups):
      self._submit(items[k * len(items) // groups:(k + 1) * len(items) // groups], pending)
    while pending:
      done = cf.wait(pending, return_when=cf.FIRST_COMPLETED).done
      while done:  # graded as each run ends, its output then dropped
        future = done.pop()
        (group, head), result = pending.pop(future), future.result()
        if len(group) == 1:
          graded = [(group[0], head, *grade(group[0][1], result, self.settings.partial_credit))]
          failed += result.reason == "sandbox_error"
        else:
          finished = head.done(result)
          graded = [(item, sub, *grade_records(item[1], bytes(kept), False, self.settings.partial_credit))
                    for item, sub, kept in zip(group[:finished], head.heads, head.kept)]
          for rest in (group[finished:finished + 1], group[finished + 1:]):  # the first alone, the others again
            if rest:
              self._submit(rest, pending)
        for (i, _, _, key), sub, reward, timed_out in graded:
          rewards[i] = reward
          self.cut.tests += sub.cut.tests
          self.cut.bytes += sub.cut.bytes
          timeouts += timed_out
          if self.cache_size and not timed_out and result.reason != "sandbox_error":
            self._cache[key] = float(rewards[i])
            if len(self._cache) > self.cache_size:
              self._cache.popitem(last=False)
    return base.RewardResult(rewards, num_failed=failed, num_timeout=timeouts)

  def _submit(self, group: list, pending: dict) -> None:
    """Runs a group of (row, suite, program, key) in one sandbox run: alone as before batches, or as a batch."""
    heads = [GraderHead(output_caps(suite), separated=k < len(group) - 1) for k, (_, suite, _, _) in enumerate(group)]
    head = heads[0] if len(group) == 1 else code_batch.BatchHead(heads)
    job = code_batch.job([program for _, _, program, _ in group], self.settings)
    pending[self.pool.submit(job.source, job.stdin, job.limits, keep_stdout=head)] = (group, head)

  def stats(self) -> sandbox_pool.PoolStats:
    return self.pool.stats()

  def close(self) -> None:
    self.pool.close()
