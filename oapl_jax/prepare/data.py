"""Published data sets -> the JSONL files our configs read (one record a line, train/dev/test).

    written = prepare("gsm8k", "~/data/gsm8k")                   # the published files, through the hub cache
    written = prepare("gsm8k", "~/data/gsm8k", sources=["raw/"])  # the same files already on this host

  gsm8k          openai/gsm8k (main)  -> {"question", "answer"} as published (the answer after '####');
                 configs/gsm8k.py reads train.jsonl and test.jsonl
  math           EleutherAI/hendrycks_math train (7 subjects; the answer is the solution's last \\boxed{})
                 and HuggingFaceH4/MATH-500 test -> {"problem", "answer"}
  deepscaler     agentica-org/DeepScaleR-Preview-Dataset -> {"problem", "answer"}; configs/math.py reads train.jsonl
  aime25, hmmt25_feb, hmmt25_nov, brumo25
                 MathArena/aime_2025, ... -> test.jsonl {"problem", "answer"}: configs/math.py's eval sets
  livecodebench  livecodebench/code_generation_lite test.jsonl, test2.jsonl, ... -> test.jsonl with the fields
                 tasks/code_task.py reads (configs/code.py cuts it into contest-date windows)

A source with a train split and no dev split gets a dev split carved from train: a fixed, seeded slice
(`dev_size` records, at most a tenth of train), the rest staying in train in source order.
The published files are fetched with huggingface_hub.snapshot_download (so HF_HUB_OFFLINE=1 reads them from
the hub cache, as for models) and read as they are: Parquet, JSON lines or a JSON array.
Local sources (`sources`): 'PATH' or 'SPLIT=PATH' (SPLIT: train or test): a .jsonl, .json or .parquet file,
or a directory laid out as the published repository ('hf download REPO --repo-type dataset --local-dir DIR').
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from oapl_jax.prepare.hub import PrepareError, errors_explained
from oapl_jax.tasks.sources import DataError

MATH_SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                 "prealgebra", "precalculus")
LCB_FILES = tuple(f"test{n}.jsonl" for n in ("", 2, 3, 4, 5, 6))
LCB_FIELDS = ("question_id", "question_title", "platform", "difficulty", "contest_date", "question_content",
              "starter_code", "public_test_cases", "private_test_cases", "metadata")


@dataclasses.dataclass(frozen=True)
class Part:
  """One published split that fills one of ours: the files of `repo` (a hub data set) matching `files`, glob
  patterns from the repository's root ('main/train-*.parquet'), read in sorted order."""
  split: str  # ours: "train" or "test"
  repo: str
  files: tuple


@dataclasses.dataclass(frozen=True)
class Source:
  parts: tuple
  record: Callable[[dict], Optional[dict]]  # raw row -> the record written; None skips it
  skip_reason: str = ""


def _gsm8k(row: dict) -> Optional[dict]:
  answer = str(row.get("answer") or "")
  return {"question": row["question"], "answer": answer} if "####" in answer and row.get("question") else None


def _math(row: dict) -> Optional[dict]:
  """MATH-500 carries `answer`; the competition set only the solution, whose last \\boxed{} is the answer."""
  from oapl_jax.tasks.rewards import last_boxed  # pylint: disable=import-outside-toplevel
  answer = str(row["answer"]).strip() if row.get("answer") is not None else ""  # 0 is an answer
  if not answer:
    answer = (last_boxed(str(row.get("solution") or "")) or "").strip()
  return {"problem": row["problem"], "answer": answer} if answer and row.get("problem") else None


def _livecodebench(row: dict) -> Optional[dict]:
  if not row.get("question_content") or not (row.get("public_test_cases") or row.get("private_test_cases")):
    return None
  return {k: row[k] for k in LCB_FIELDS if k in row}


SOURCES = {
    "gsm8k": Source((Part("train", "openai/gsm8k", ("main/train-*.parquet",)),
                     Part("test", "openai/gsm8k", ("main/test-*.parquet",))), _gsm8k,
                    "no question, or no '####' in the answer"),
    "math": Source((Part("train", "EleutherAI/hendrycks_math", tuple(f"{s}/train-*.parquet" for s in MATH_SUBJECTS)),
                    Part("test", "HuggingFaceH4/MATH-500", ("test.jsonl",))), _math, "no answer and no \\boxed{}"),
    "deepscaler": Source((Part("train", "agentica-org/DeepScaleR-Preview-Dataset", ("deepscaler.json",)),), _math,
                         "no problem or answer"),
    # The paper's math eval sets (configs/math.py): MathArena publishes each as one 'train' split; ours is test.
    **{name: Source((Part("test", f"MathArena/{repo}", ("*train-*.parquet",)),), _math, "no problem or answer")
       for name, repo in (("aime25", "aime_2025"), ("hmmt25_feb", "hmmt_feb_2025"), ("hmmt25_nov", "hmmt_nov_2025"),
                          ("brumo25", "brumo_2025"))},
    "livecodebench": Source((Part("test", "livecodebench/code_generation_lite", LCB_FILES),), _livecodebench,
                            "no question_content or no test cases"),
}


# ------------------------------------------------------------------------------------------- reading
def read_file(path: str) -> Iterator[dict]:
  """The rows of a .jsonl, .json (an array, or JSON lines) or .parquet file, as dicts. A file that cannot be read as
  its kind (a truncated or foreign Parquet file, bytes that are not UTF-8, an array that is not JSON) is a
  DataError naming it, as the training reader (tasks/sources.py) says of the same file."""
  if path.endswith(".parquet"):
    yield from _parquet_rows(path)
    return
  with open(path, "rb") as f:
    if path.endswith(".json") and f.read(64).lstrip().startswith(b"["):
      f.seek(0)
      lines = enumerate(_json_array(f.read(), path), start=1)
    else:
      f.seek(0)
      lines = ((n, _json_line(_utf8(raw, path, n), path, n)) for n, raw in enumerate(f, start=1) if raw.strip())
    for n, row in lines:
      if not isinstance(row, dict):
        raise DataError(f"{path} record {n}: expected a JSON object, got {type(row).__name__}")
      yield row


def _utf8(raw: bytes, path: str, lineno: int) -> str:
  try:
    return raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{path} line {lineno}: not UTF-8 text (invalid byte {raw[e.start:e.start + 1]!r} at "
                    f"column {e.start + 1}): is it the file you meant?") from None


def _json_array(raw: bytes, path: str) -> list:
  try:
    return json.loads(raw.decode("utf-8-sig"))
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: not UTF-8 text (invalid byte at offset {e.start}): is it the file you meant?") from None
  except json.JSONDecodeError as e:
    raise DataError(f"{path}: malformed JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None


def _parquet_rows(path: str) -> Iterator[dict]:
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  try:
    batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
    for batch in batches:
      yield from batch.to_pylist()
  except FileNotFoundError:
    raise  # a missing file is the CLI's own one line
  except (pa.ArrowException, OSError, ValueError) as e:
    raise DataError(f"{path}: not a readable Parquet file ({type(e).__name__}: {str(e)[:200]})") from None


def _json_line(line: str, path: str, lineno: int):
  try:
    return json.loads(line)
  except json.JSONDecodeError as e:
    raise DataError(f"{path} line {lineno}: malformed JSON ({e.msg} at column {e.colno})") from None


def _files(folder: str, part: Part) -> list[str]:
  """The part's files under `folder` (a published repository's layout, matched as the hub matches
  allow_patterns: '*' crosses '/'), or the file `folder` itself."""
  if os.path.isfile(folder):
    return [folder]
  found = sorted(os.path.join(root, name) for root, _, names in os.walk(folder) for name in names
                 if any(fnmatch.fnmatch(os.path.relpath(os.path.join(root, name), folder), p) for p in part.files))
  if not found:
    raise PrepareError(f"{folder}: no {', '.join(part.files)} for the {part.split} split (the layout of {part.repo}); "
                       f"name the file with --source {part.split}=FILE")
  return found


def _download(part: Part, revision: Optional[str]) -> str:
  """The hub cache's folder of the part's files (snapshot_download: HF_HUB_OFFLINE=1 reads the cache)."""
  from huggingface_hub import snapshot_download  # pylint: disable=import-outside-toplevel
  print(f"  fetching {part.repo}: {', '.join(part.files)}", flush=True)
  with errors_explained(part.repo, revision, "dataset"):
    return snapshot_download(part.repo, repo_type="dataset", revision=revision, allow_patterns=list(part.files))


def _local_sources(specs: Sequence[str], source: Source) -> dict[str, str]:
  """{our split: path} from 'PATH' / 'SPLIT=PATH' arguments."""
  splits = [p.split for p in source.parts]
  paths = {}
  for spec in specs:
    split, sep, path = spec.partition("=")
    if not sep or split not in ("train", "test"):
      split, path = None, spec
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(path):
      raise PrepareError(f"--source {spec}: {path} does not exist")
    if split is None:  # a directory serves every split; a file the first
      paths.update({s: path for s in splits} if os.path.isdir(path) else {splits[0]: path})
    elif split not in splits:
      raise PrepareError(f"--source {spec}: this data set has no {split} split (it has {splits})")
    else:
      paths[split] = path
  return paths


def _rows(source: Source, local: dict[str, str], revision: Optional[str]) -> dict[str, list[dict]]:
  out: dict[str, list[dict]] = {}
  for part in source.parts:
    if local and part.split not in local:
      print(f"{part.split}: no --source for it; skipped", flush=True)
      continue
    print(f"{part.split}: reading", flush=True)
    folder = local[part.split] if local else _download(part, revision)
    for path in _files(folder, part):
      before = len(out.setdefault(part.split, []))
      out[part.split].extend(read_file(path))
      print(f"  {len(out[part.split]) - before} rows from {path}", flush=True)
  return out


# ------------------------------------------------------------------------------------------- writing
@dataclasses.dataclass(frozen=True)
class Written:
  split: str
  path: str
  count: int
  note: str = ""


def carve_dev(records: list, dev_size: int, seed: int) -> tuple[list, list]:
  """(train, dev): dev is min(dev_size, len // 10) records chosen by `seed`; both keep the source order."""
  n_dev = min(dev_size, len(records) // 10)
  dev_ids = set(np.random.default_rng(seed).permutation(len(records))[:n_dev].tolist())
  return ([r for i, r in enumerate(records) if i not in dev_ids], [r for i, r in enumerate(records) if i in dev_ids])


def _write_jsonl(path: str, records: list[dict]) -> None:
  with open(path + ".partial", "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
  os.replace(path + ".partial", path)


def prepare(name: str, out: str, *, sources: Sequence[str] = (), revision: Optional[str] = None,
            dev_size: int = 500, seed: int = 0) -> list[Written]:
  """Writes `out`/{train,dev,test}.jsonl (those the source has) and returns what was written."""
  if name not in SOURCES:
    raise PrepareError(f"unknown data set {name!r}; known: {sorted(SOURCES)}")
  source = SOURCES[name]
  raw = _rows(source, _local_sources(sources, source), revision)
  splits, notes = {}, {}
  for split, rows in raw.items():
    records = [r for r in map(source.record, rows) if r is not None]
    if len(records) < len(rows):
      notes[split] = f"{len(rows) - len(records)} source rows skipped ({source.skip_reason})"
    if not records:
      raise PrepareError(f"{name}: no usable {split} records in {len(rows)} source rows ({source.skip_reason})")
    splits[split] = records
  if "train" in splits and "dev" not in splits:
    splits["train"], dev = carve_dev(splits["train"], dev_size, seed)
    if dev:
      splits["dev"] = dev
      notes["dev"] = f"the source has no dev split: carved from train (seed {seed})"
  out = os.path.abspath(os.path.expanduser(out))
  os.makedirs(out, exist_ok=True)
  written = []
  for split in ("train", "dev", "test"):
    if split in splits:
      path = os.path.join(out, f"{split}.jsonl")
      _write_jsonl(path, splits[split])
      written.append(Written(split, path, len(splits[split]), notes.get(split, "")))
  return written
