"""Prompt sources with a problem/answer schema (DeepScaleR, AIME 25, HMMT 25, BRUMO 25).

Each loader returns [{"problem": str, "answer": str}, ...] in file order. Non-string values
(an integer answer) are turned into strings; a missing or null field is an error that names
the file and the line (JSONL), row (Parquet) or example (TFDS).
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping


def _record(raw: Mapping[str, Any], problem_key: str, answer_key: str,
            where: str) -> dict[str, str]:
  out = {}
  for field, key in (("problem", problem_key), ("answer", answer_key)):
    value = raw.get(key)
    if value is None:
      raise ValueError(f"{where}: missing key {key!r} (the {field} field)")
    out[field] = value.decode("utf-8") if isinstance(value, bytes) else str(value)
  return out


def _check_exists(path: str) -> None:
  if not os.path.exists(path):
    raise FileNotFoundError(f"prompt file not found: {path} (check the dataset path in "
                            f"the config)")


def load_jsonl(path: str | os.PathLike, problem_key: str = "problem",
               answer_key: str = "answer") -> list[dict[str, str]]:
  path = os.fspath(path)
  _check_exists(path)
  records = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f"{path} line {lineno}"
      try:
        raw = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{where}: malformed JSON ({e.msg})") from e
      if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
      records.append(_record(raw, problem_key, answer_key, where))
  return records


def load_parquet(path: str | os.PathLike, problem_key: str = "problem",
                 answer_key: str = "answer") -> list[dict[str, str]]:
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  path = os.fspath(path)
  _check_exists(path)
  table = pq.read_table(path)
  for key in (problem_key, answer_key):
    if key not in table.column_names:
      raise ValueError(f"{path}: missing key {key!r} (columns: {table.column_names})")
  rows = zip(table.column(problem_key).to_pylist(), table.column(answer_key).to_pylist())
  return [_record({problem_key: p, answer_key: a}, problem_key, answer_key,
                  f"{path} row {i}") for i, (p, a) in enumerate(rows)]


def load_tfds(name: str, split: str, problem_key: str = "problem",
              answer_key: str = "answer", data_dir: str | None = None) -> list[dict[str, str]]:
  """Reads a TFDS dataset already prepared under data_dir; never downloads."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise FileNotFoundError(f"tfds dataset {name!r} not found (data_dir={data_dir})") from e
  features = builder.info.features
  for key in (problem_key, answer_key):
    if key not in features:
      raise ValueError(f"tfds {name}: missing key {key!r} (features: {list(features)})")
  if split not in builder.info.splits:
    raise FileNotFoundError(f"tfds {name}: split {split!r} is not prepared under "
                            f"{builder.data_dir} (have: {list(builder.info.splits)})")
  examples = tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))
  return [_record(ex, problem_key, answer_key, f"tfds {name}[{split}] example {i}")
          for i, ex in enumerate(examples)]
