"""Property-based fuzzing (hypothesis) of the data loaders, the config validation and the reward wrappers.

Every generated case must end in a clear error of our own type (sources.DataError, sections.ConfigError)
or a counted, logged fallback: never a traceback from inside a library, never a late error. The reward gaps
it found (at the end) are fixed in tasks/rewards.py.
"""
import contextlib
import copy
import json
import logging
import math
import re
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from configs import arithmetic
from oapl_jax import parallel, sections
from oapl_jax.run import assemble, check, schema
from oapl_jax.models import factory
from oapl_jax.rl import trainer
from oapl_jax.rl.schedule import WindowSchedule
from oapl_jax.rl.warmstart import WarmStartConfig
from oapl_jax.sampler.settings import SamplingSettings
from oapl_jax.tasks import sources
from oapl_jax.tasks.rewards import Guarded, ItemReward, RewardResult

FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@contextlib.contextmanager
def scratch_file(data: bytes, suffix: str):
  with tempfile.TemporaryDirectory() as d:
    path = Path(d) / f"data{suffix}"
    path.write_bytes(data)
    yield path


# ------------------------------------------------------------------------------------------------ data loaders
def expected_text(value):
  """The loaders' documented conversion (module docstring of tasks/sources.py), or None if the value is bad."""
  if isinstance(value, str):
    return value if value.strip() else None
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    return None
  if isinstance(value, int) and abs(value) >= 10 ** 4000:
    return None  # past Python's digit limit: not printable
  return str(int(value)) if float(value).is_integer() else str(value)


json_scalars = st.one_of(st.text(max_size=12), st.integers(), st.floats(), st.booleans(), st.none())
json_values = st.one_of(json_scalars, st.lists(json_scalars, max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                          json_scalars, max_size=2))
records = st.fixed_dictionaries({}, optional={"problem": json_values, "answer": json_values, "id": json_values})
good_records = st.fixed_dictionaries({"problem": st.text(min_size=1).filter(str.strip),
                                      "answer": st.one_of(st.text(min_size=1).filter(str.strip), st.integers())})


@FUZZ
@given(st.binary(max_size=3000))
def test_jsonl_random_bytes(data):
  with scratch_file(data, ".jsonl") as path:
    try:
      out = sources.load_jsonl(path)
    except sources.DataError as e:
      assert str(e).startswith(str(path))
      return
  assert out and all(set(r) == {"problem", "answer"} and all(v.strip() for v in r.values()) for r in out)


@FUZZ
@given(st.lists(st.tuples(st.one_of(records, json_values), st.sampled_from(["", "\n", "  \n"])), max_size=8))
def test_jsonl_random_json_lines_match_the_documented_conversion(lines):
  text = "".join(json.dumps(value) + "\n" + blank for value, blank in lines)
  expected, bad_line, lineno = [], None, 0
  for value, blank in lines:  # the reference: the first bad line fails the file, blank lines are skipped
    lineno += 1
    converted = {k: expected_text(value.get(k)) for k in ("problem", "answer")} if isinstance(value, dict) else None
    if converted is None or None in converted.values():
      bad_line = lineno
      break
    expected.append(converted)
    lineno += blank.count("\n")
  with scratch_file(text.encode(), ".jsonl") as path:
    if bad_line is not None or not expected:
      with pytest.raises(sources.DataError) as info:
        sources.load_jsonl(path)
      assert str(info.value).startswith(f"{path} line {bad_line}: " if bad_line else f"{path} holds no records")
    else:
      out, locations = sources.load_jsonl(path, with_locations=True)
      assert out == expected
      assert all(re.fullmatch(rf"{re.escape(str(path))} line \d+", at) for at in locations)


@FUZZ
@given(st.lists(good_records, min_size=1, max_size=5), st.data())
def test_jsonl_truncated_anywhere(originals, data):
  full = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in originals).encode()
  cut = data.draw(st.integers(0, len(full)))
  complete = full[:cut].count(b"\n")
  partial = full[:cut].rsplit(b"\n", 1)[-1]
  whole_lines = full.split(b"\n")
  with scratch_file(full[:cut], ".jsonl") as path:
    if not partial or partial == whole_lines[complete]:  # only whole records (the last one may lack its newline)
      n = complete + (1 if partial.strip() else 0)
      if n == 0:
        with pytest.raises(sources.DataError, match="holds no records"):
          sources.load_jsonl(path)
      else:
        assert sources.load_jsonl(path) == [{"problem": r["problem"], "answer": str(r["answer"])}
                                            for r in originals[:n]]
    else:
      with pytest.raises(sources.DataError) as info:
        sources.load_jsonl(path)
      assert str(info.value).startswith(f"{path} line {complete + 1}: ")


@settings(FUZZ, max_examples=3)
@given(st.integers(1 << 20, 4 << 20))
def test_jsonl_huge_line(size):
  problem = "x" * size
  with scratch_file((json.dumps({"problem": problem, "answer": 7}) + "\n").encode(), ".jsonl") as path:
    assert sources.load_jsonl(path) == [{"problem": problem, "answer": "7"}]


@settings(FUZZ, max_examples=40)
@given(st.binary(max_size=400), st.booleans())
def test_parquet_random_bytes(data, magic):
  with scratch_file(b"PAR1" + data + b"PAR1" if magic else data, ".parquet") as path:
    with pytest.raises(sources.DataError, match=re.escape(str(path))):
      sources.load_parquet(path)


@settings(FUZZ, max_examples=40)
@given(st.data())
def test_parquet_truncated_anywhere(data):
  with tempfile.TemporaryDirectory() as d:
    good = Path(d) / "good.parquet"
    pd.DataFrame({"problem": ["a", "bb", "ccc"], "answer": ["1", "2", "3"]}).to_parquet(good)
    full = good.read_bytes()
  cut = data.draw(st.integers(0, len(full) - 1))
  with scratch_file(full[:cut], ".parquet") as path:
    with pytest.raises(sources.DataError, match=re.escape(str(path))):
      sources.load_parquet(path)


# ------------------------------------------------------------------------------------------------ config
def is_int(v, low):
  return isinstance(v, int) and not isinstance(v, bool) and v >= low


def is_real(v, low, high=math.inf, low_open=False, high_open=False):
  if isinstance(v, bool) or not isinstance(v, (int, float)):
    return False
  try:
    v = float(v)
  except OverflowError:
    return False
  return math.isfinite(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)


def is_mesh(v):
  return (isinstance(v, (tuple, list)) and len(v) == 3 and all(is_int(s, 1) or s == -1 for s in v)
          and list(v).count(-1) <= 1)


# Each field's valid values as documented (run/config_base.py, the loss settings, the sampler): the reference
# the validator is held to. A value outside them must be reported under its own field.
SPEC = {
    **{f"loop.{k}": lambda v: is_int(v, 1) for k in ("sync_every", "steps_per_rollout", "num_syncs", "batch_prompts",
                                                      "prompts_per_rollout", "eval_every_syncs")},
    "loop.group_size": lambda v: is_int(v, 2),
    "trainer.micro_batches": lambda v: is_int(v, 1), "warmstart.steps": lambda v: is_int(v, 0),
    **{f"sampler.{k}": lambda v: is_int(v, 1) for k in ("num_slots", "max_prefill_length", "max_new_tokens",
                                                         "steps_per_sync")},
    "sampler.top_k": lambda v: is_int(v, 0), "seed": lambda v: is_int(v, 0),
    **{f"eval.{k}": lambda v: is_int(v, 1) for k in ("max_new_tokens", "samples", "num_prompts")},
    "checkpoint.every_syncs": lambda v: is_int(v, 1), "checkpoint.max_to_keep": lambda v: is_int(v, 1),
    "trainer.optim.lr": lambda v: is_real(v, 0, low_open=True),
    "trainer.optim.eps": lambda v: is_real(v, 0, low_open=True),
    "trainer.optim.b1": lambda v: is_real(v, 0, 1, high_open=True),
    "trainer.optim.b2": lambda v: is_real(v, 0, 1, high_open=True),
    "trainer.loss_settings.oapl.beta1": lambda v: is_real(v, 0, low_open=True),
    "trainer.loss_settings.oapl.beta2": lambda v: is_real(v, 0, low_open=True),
    "sampler.temperature": lambda v: is_real(v, 0, low_open=True), "eval.temperature": lambda v: is_real(v, 0),
    "sampler.top_p": lambda v: is_real(v, 0, 1, low_open=True), "eval.top_p": lambda v: is_real(v, 0, 1, low_open=True),
    "mesh.trainer_ici": is_mesh, "mesh.sampler_ici": is_mesh, "mesh.trainer_dcn": is_mesh, "mesh.sampler_dcn": is_mesh,
    "eval.ks": lambda v: isinstance(v, (tuple, list)) and len(v) > 0 and all(is_int(k, 1) for k in v),
    "trainer.optim.schedule": lambda v: v == "constant",  # cosine would also need total_steps
}
small_ints = st.one_of(st.integers(-3, 9), st.sampled_from([16, 32, 64, 128]))
junk = st.one_of(small_ints, st.integers(), st.floats(), st.sampled_from([0.0, 0.5, 1.0, -0.0, math.nan, math.inf]),
                 st.none(), st.booleans(), st.text(max_size=4), st.sampled_from(["constant", "cosine"]),
                 st.lists(st.one_of(small_ints, st.none()), max_size=4).map(tuple), st.lists(small_ints, max_size=4),
                 st.dictionaries(st.text(max_size=2), small_ints, max_size=2))


def build_everything_the_loop_builds_from(cfg: dict) -> None:
  """What run/assemble.setup constructs from the config before the model (a late error would surface here)."""
  rc = schema.from_config(cfg)
  assemble.train_config(rc)
  rc.loop.schedule()
  placement = assemble.placement(rc)
  assert rc.sampler.num_slots % placement.sampler.axis_size("cache_batch") == 0
  factory.architecture(rc.model)


@settings(FUZZ, max_examples=150)
@given(st.lists(st.tuples(st.sampled_from(sorted(SPEC)), junk), min_size=1, max_size=4))
def test_config_validation_reports_every_bad_field_and_nothing_fails_later(changes):
  cfg = copy.deepcopy(arithmetic.get_config("").to_dict())
  for path, value in changes:
    *parents, last = path.split(".")
    section = cfg
    for part in parents:
      section = section[part]
    section[last] = value
  final = dict(changes)  # a field changed twice keeps its last value
  try:
    result = check.validate(cfg)
  except sections.ConfigError as e:
    assert e.problems and str(e).startswith(f"{len(e.problems)} problem(s) in the config:")
    for path, value in final.items():
      if not SPEC[path](value):
        assert any(p.startswith((f"{path}=", f"{path}:")) for p in e.problems), (path, value, e.problems)
    return
  assert isinstance(result, list) and all(isinstance(w, str) for w in result)
  assert all(SPEC[path](value) for path, value in final.items()), final
  build_everything_the_loop_builds_from(cfg)


# ------------------------------------------------------------------------------------------------ rewards
class LogRecords(logging.Handler):
  """Collects the reward module's log records (caplog does not mix with hypothesis examples)."""

  def __init__(self):
    super().__init__(logging.WARNING)
    self.records = []

  def emit(self, record):
    self.records.append(record)

  def __enter__(self):
    logging.getLogger("oapl_jax.tasks.rewards").addHandler(self)
    return self

  def __exit__(self, *exc):
    logging.getLogger("oapl_jax.tasks.rewards").removeHandler(self)


def clean(v) -> bool:
  """A reward the wrappers must pass through unchanged: a real number finite in float32."""
  if not isinstance(v, (int, float, np.integer, np.floating)):
    return False
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      return bool(np.isfinite(np.float32(v)))
    except OverflowError:
      return False


class Boom(Exception):
  pass


RAISE = object()
item_values = st.one_of(st.floats(width=64), st.integers(-10**40, 10**40), st.booleans(), st.none(),
                        st.text(max_size=4).filter(lambda s: not _parses_as_float(s)),
                        st.lists(st.floats(), max_size=2), st.just(RAISE), st.just(np.array([1.0, 2.0])))


def _parses_as_float(s: str) -> bool:
  try:
    float(s)
    return True
  except ValueError:
    return False


@settings(FUZZ, max_examples=100)
@given(st.lists(item_values, min_size=1, max_size=6))
def test_item_reward_under_guard_counts_and_zeroes_every_bad_item(values):
  def score(completion, answer):
    v = values[int(completion)]
    if v is RAISE:
      raise Boom(f"item {completion}")
    return v

  n = len(values)
  with LogRecords() as logs:
    out = Guarded(ItemReward(score))([str(i) for i in range(n)], ["a"] * n)
  bad = [not clean(v) for v in values]
  assert out.rewards.dtype == np.float32 and out.rewards.shape == (n,) and np.isfinite(out.rewards).all()
  np.testing.assert_array_equal(out.rewards, [0.0 if b else np.float32(v) for v, b in zip(values, bad)])
  assert out.num_failed == sum(bad) and out.num_timeout == 0
  raised = sum(v is RAISE for v in values)
  assert sum("failed on item" in r.getMessage() for r in logs.records) >= raised


numbers_or_none = st.one_of(st.floats(), st.integers(-10**40, 10**40), st.none())
batch_outputs = st.one_of(
    st.just(RAISE), st.none(), st.text(max_size=3), st.floats(), st.integers(0, 7).map(lambda k: np.zeros((k, 2))),
    st.lists(numbers_or_none, max_size=7), st.lists(numbers_or_none, max_size=7).map(lambda x: np.array(x, float)),
    st.lists(st.one_of(numbers_or_none, st.text(min_size=1, max_size=2).filter(lambda s: not _parses_as_float(s))),
             min_size=1, max_size=7).filter(lambda x: any(isinstance(v, str) for v in x)))


@settings(FUZZ, max_examples=100)
@given(st.integers(1, 6), batch_outputs)
def test_guarded_batch_reward_never_raises(n, output):
  """A sequence of n numbers (None: missing) is scored per item; anything else fails the whole batch."""
  def reward(completions, answers):
    if output is RAISE:
      raise Boom("the whole batch")
    return output

  with LogRecords() as logs:
    out = Guarded(reward)(["c"] * n, ["a"] * n)
  assert out.rewards.dtype == np.float32 and out.rewards.shape == (n,) and np.isfinite(out.rewards).all()
  per_item = (isinstance(output, (list, np.ndarray)) and len(output) == n and np.ndim(output) == 1
              and all(v is None or clean(v) or isinstance(v, (int, float, np.floating)) for v in output))
  if per_item:
    bad = [v is None or not clean(v) for v in output]
    np.testing.assert_array_equal(out.rewards, [0.0 if b else np.float32(v) for v, b in zip(output, bad)])
    assert out.num_failed == sum(bad)
  else:
    assert out.num_failed == n and not out.rewards.any()
    assert any(r.levelno >= logging.ERROR and "failed on a batch" in r.getMessage() for r in logs.records)


# Gaps this suite found in oapl_jax/tasks/rewards.py, fixed there.
def test_guarded_logs_non_finite_rewards():
  with LogRecords() as logs:
    out = Guarded(lambda c, a: np.full(len(c), np.nan))(["c"] * 3, ["a"] * 3)
  assert out.num_failed == 3
  assert logs.records, "3 of 3 rewards were NaN and scored 0 without a warning"


@pytest.mark.parametrize("wrap", [lambda s: Guarded(ItemReward(s)),
                                  lambda s: Guarded(lambda c, a: [s(x, a) for x in c])])
def test_a_string_reward_is_a_failure(wrap):
  out = wrap(lambda c, a: "0.5")(["c", "d"], ["a", "a"])
  assert out.num_failed == 2 and not out.rewards.any()


def test_guarded_survives_a_malformed_reward_result():
  out = Guarded(lambda c, a: RewardResult(np.zeros(len(c)), num_failed="two"))(["c", "d"], ["a", "a"])
  assert out.num_failed == 2


def test_item_reward_alone_counts_non_finite_scores():
  out = ItemReward(lambda c, a: {"n": math.nan, "x": None}[c])(["n", "x"], ["a", "a"])
  assert out.num_failed == 2 and np.isfinite(out.rewards).all()
