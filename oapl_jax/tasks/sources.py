"""Prompt sources with a problem/answer schema (DeepScaleR, AIME 25, HMMT 25, BRUMO 25).

Each loader returns [{"problem": str, "answer": str}, ...] in file order (with `keep_fields=True`, also
"record": the source record whole, as plain Python values, for rewards that read it; `answer_key=""` when
there is no answer field), or, with
`with_locations=True`, (records, locations) where locations[i] names where record i came from
("train.jsonl line 7", "aime25.parquet row 3"; lines count from 1, Parquet rows and TFDS examples
from 0 as pyarrow and tfds index them). Numbers are turned into strings (an integral
float such as 204.0 into "204"). Every problem with a source is a `DataError` naming the file and
the line (JSONL), row (Parquet) or example (TFDS): a file that is not valid UTF-8, a line that is
not a JSON object, a missing, null, empty or non-text field, a file with no records.
"""
from __future__ import annotations

import json
import math
import numbers
import os
from typing import Any, Mapping

_SHOWN = 60  # characters of a bad value quoted in an error


class DataError(ValueError):
  """A data source or problem set that cannot be used; the message says which file and record."""


def _text(value: Any, key: str, field: str, where: str) -> str:
  if value is None:
    raise DataError(f"{where}: missing key {key!r} (the {field} field)")
  if isinstance(value, bytes):
    try:
      value = value.decode("utf-8")
    except UnicodeDecodeError as e:
      raise DataError(f"{where}: key {key!r} is not valid UTF-8 (byte {e.start})") from None
  elif isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
    try:
      value = str(int(value)) if float(value).is_integer() else str(value)
    except ValueError as e:  # an integer too long to print (Python's digit limit)
      raise DataError(f"{where}: key {key!r} holds a number that cannot be written as text ({e})") from None
  elif not isinstance(value, str):
    raise DataError(f"{where}: key {key!r} (the {field} field) must be a string or a finite number, "
                    f"got {type(value).__name__} {repr(value)[:_SHOWN]}")
  if not value.strip():
    raise DataError(f"{where}: key {key!r} (the {field} field) is empty")
  return value


def _plain(value: Any) -> Any:
  """A JSON-ready value: numpy arrays and scalars (TFDS) become lists and numbers, bytes UTF-8 text."""
  if isinstance(value, bytes):
    return value.decode("utf-8", errors="replace")
  if hasattr(value, "tolist"):
    return _plain(value.tolist())
  if isinstance(value, Mapping):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


def _record(raw: Mapping[str, Any], problem_key: str, answer_key: str, where: str,
            keep_fields: bool = False) -> dict[str, Any]:
  texts = {"problem": _text(raw.get(problem_key), problem_key, "problem", where),
           "answer": _text(raw.get(answer_key), answer_key, "answer", where) if answer_key else ""}
  return dict(texts, record=_plain(raw)) if keep_fields else texts


def _check_exists(path: str) -> None:
  if not os.path.exists(path):
    raise FileNotFoundError(f"prompt file not found: {path} (check the dataset path in the config)")
  if os.path.isdir(path):
    raise DataError(f"{path} is a directory, not a data file")


def _done(path: str, records: list, locations: list, with_locations: bool):
  if not records:
    raise DataError(f"{path} holds no records")
  return (records, locations) if with_locations else records


def load_jsonl(path: str | os.PathLike, problem_key: str = "problem", answer_key: str = "answer", *,
               with_locations: bool = False, keep_fields: bool = False):
  """One JSON object per line; blank lines are skipped; a UTF-8 byte-order mark is allowed."""
  path = os.fspath(path)
  _check_exists(path)
  records, locations = [], []
  with open(path, "rb") as f:
    for lineno, raw_line in enumerate(f, start=1):
      where = f"{path} line {lineno}"
      try:
        line = raw_line.decode("utf-8-sig" if lineno == 1 else "utf-8")
      except UnicodeDecodeError as e:
        raise DataError(f"{where}: invalid UTF-8 at byte {e.start} of the line "
                        f"({raw_line[max(0, e.start - 10):e.start + 10]!r})") from None
      if not line.strip():
        continue
      try:
        raw = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
      except (ValueError, RecursionError) as e:  # integers past Python's digit limit; deep nesting
        raise DataError(f"{where}: unreadable JSON ({type(e).__name__}: {str(e)[:_SHOWN]})") from None
      if not isinstance(raw, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(raw).__name__}")
      records.append(_record(raw, problem_key, answer_key, where, keep_fields))
      locations.append(where)
  return _done(path, records, locations, with_locations)


def load_parquet(path: str | os.PathLike, problem_key: str = "problem", answer_key: str = "answer", *,
                 with_locations: bool = False, keep_fields: bool = False):
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  path = os.fspath(path)
  _check_exists(path)
  unreadable = (pa.ArrowException, OSError, ValueError)
  try:
    parquet = pq.ParquetFile(path)
    columns = parquet.schema_arrow.names
  except unreadable as e:
    raise DataError(f"{path}: not a readable Parquet file ({type(e).__name__}: {str(e)[:200]})") from None
  for key in filter(None, (problem_key, answer_key)):
    if key not in columns:
      raise DataError(f"{path}: missing key {key!r} (columns: {columns})")
  try:
    table = parquet.read(columns=None if keep_fields else sorted(filter(None, {problem_key, answer_key})))
  except unreadable as e:
    raise DataError(f"{path}: Parquet data unreadable ({type(e).__name__}: {str(e)[:200]})") from None
  locations = [f"{path} row {i}" for i in range(table.num_rows)]
  records = [_record(row, problem_key, answer_key, where, keep_fields)
             for where, row in zip(locations, table.to_pylist())]
  return _done(path, records, locations, with_locations)


def load_tfds(name: str, split: str, problem_key: str = "problem", answer_key: str = "answer",
              data_dir: str | None = None, *, with_locations: bool = False, keep_fields: bool = False):
  """Reads a TFDS dataset already prepared under data_dir; never downloads."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise FileNotFoundError(f"tfds dataset {name!r} not found (data_dir={data_dir})") from e
  features = builder.info.features
  for key in filter(None, (problem_key, answer_key)):
    if key not in features:
      raise DataError(f"tfds {name}: missing key {key!r} (features: {list(features)})")
  if split not in builder.info.splits:
    raise FileNotFoundError(f"tfds {name}: split {split!r} is not prepared under "
                            f"{builder.data_dir} (have: {list(builder.info.splits)})")
  examples = tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))
  records, locations = [], []
  for i, ex in enumerate(examples):
    locations.append(f"tfds {name}[{split}] example {i}")
    records.append(_record(ex, problem_key, answer_key, locations[-1], keep_fields))
  return _done(f"tfds {name}[{split}]", records, locations, with_locations)


def load_source(spec: str, field: str, problem_key: str = "problem", answer_key: str = "answer", *,
                keep_fields: bool = False) -> list[dict]:
  """`spec`: a .jsonl / .parquet path, or 'tfds:NAME/SPLIT'; `field` names the config field in errors."""
  if spec.startswith("tfds:"):
    name, _, split = spec[len("tfds:"):].partition("/")
    return load_tfds(name, split or "train", problem_key, answer_key, keep_fields=keep_fields)
  spec = os.path.expanduser(spec)
  if not os.path.exists(spec):
    raise FileNotFoundError(f"config field task.{field}: {spec} does not exist")
  if spec.endswith(".jsonl") or spec.endswith(".json"):
    return load_jsonl(spec, problem_key, answer_key, keep_fields=keep_fields)
  if spec.endswith(".parquet"):
    return load_parquet(spec, problem_key, answer_key, keep_fields=keep_fields)
  raise ValueError(f"config field task.{field}: {spec} is neither .jsonl, .parquet nor tfds:NAME/SPLIT")


def missing_sources(specs: Mapping[str, Any]) -> list[str]:
  """'field=spec: why' for each {config field: source spec} that is not a path to a file or 'tfds:NAME/SPLIT'
  (checked before compute; reading happens when the task is built)."""
  problems = []
  for field, spec in specs.items():
    if not isinstance(spec, str) or not spec:
      problems.append(f"{field}={spec!r}: must be a path or 'tfds:NAME/SPLIT'")
    elif not spec.startswith("tfds:") and not os.path.isfile(os.path.expanduser(spec)):
      problems.append(f"{field}={spec!r}: no such file")
  return problems
