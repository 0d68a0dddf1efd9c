"""The safetensors reader checks a file's header against its size before reading (models/safetensors_io.py): a cut or
garbled file is a CheckpointError naming the file (and the tensor), never a numpy or memory error, and the commands
that load a checkpoint say it in one line. The reference is the `safetensors` package: what it reads, ours reads
identically; what it refuses, ours refuses."""
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import safetensors
import safetensors.numpy

from oapl_jax.apps import cli, prepare as prepare_app
from oapl_jax.models.safetensors_io import CheckpointError, SafetensorsFile
from tests.hf_fixtures import make_hf_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _originals() -> dict:
  """Tensors of several dtypes and ranks (a scalar, an empty one); layers.0 / layers.1 differ in one byte."""
  rng = np.random.default_rng(0)
  return {"layers.0.w": rng.standard_normal((4, 6)).astype(np.float32),
          "layers.1.w": rng.standard_normal((4, 6)).astype(np.float32),
          "half": rng.standard_normal(5).astype(np.float16), "ids": rng.integers(-9, 9, (2, 3)).astype(np.int64),
          "count": np.array(7, np.int32), "bytes": rng.integers(0, 255, 11).astype(np.uint8),
          "mask": rng.random(3) > 0.5, "empty": np.zeros((0, 3), np.float32)}


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
  """(path, its bytes, the tensors) of a file the reference library wrote."""
  path = str(tmp_path_factory.mktemp("st") / "model.safetensors")
  safetensors.numpy.save_file(_originals(), path, metadata={"format": "np"})
  with open(path, "rb") as f:
    return path, f.read(), _originals()


def _ours(path: str) -> dict:
  sf = SafetensorsFile(path)
  return {name: np.array(sf.get(name)) for name in sf.keys()}


def _reference(path: str):
  """The reference library's tensors, or None where it refuses the file."""
  try:
    return safetensors.numpy.load_file(path)
  except (safetensors.SafetensorError, ValueError, OSError):
    return None


def _same(a: dict, b: dict) -> bool:
  return a.keys() == b.keys() and all(
      a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a)


def test_a_valid_file_reads_as_written(valid):
  path, _, originals = valid
  assert _same(_ours(path), originals)


def test_every_truncation_is_a_checkpoint_error_naming_the_file(valid, tmp_path):
  path, data, _ = valid
  cut = str(tmp_path / "cut.safetensors")
  for length in range(len(data)):
    with open(cut, "wb") as f:
      f.write(data[:length])
    with pytest.raises(CheckpointError) as error:
      _ours(cut)
    assert str(error.value).startswith(f"{cut}: "), (length, str(error.value))


def test_a_file_cut_after_it_was_opened_is_a_checkpoint_error_when_read(valid, tmp_path):
  path, data, _ = valid
  cut = tmp_path / "cut.safetensors"
  cut.write_bytes(data)
  sf = SafetensorsFile(str(cut))
  cut.write_bytes(data[:-100])
  last = max(sf.keys(), key=lambda name: sf.header[name]["data_offsets"])
  with pytest.raises(CheckpointError, match=rf"^{re.escape(str(cut))}: tensor '{last}' ends past the end of the file"):
    sf.get(last)


@pytest.mark.parametrize("seed", range(4))
def test_random_byte_flips_read_as_the_reference_reads_or_are_a_checkpoint_error(valid, tmp_path, seed):
  """One byte replaced at a time, half of them in the 8-byte length and the JSON header: where the reference reads
  the file, ours reads the same names, dtypes, shapes and bytes; where it refuses it, ours raises CheckpointError
  naming the file. Any other exception fails the test."""
  _, data, _ = valid
  header_end = 8 + struct.unpack("<Q", data[:8])[0]
  rng = np.random.default_rng(seed)
  flipped = str(tmp_path / "flipped.safetensors")
  outcomes = {"read": 0, "refused": 0}
  for trial in range(150):
    at = int(rng.integers(0, header_end if trial % 2 else len(data)))
    mutated = bytearray(data)
    mutated[at] = (mutated[at] + int(rng.integers(1, 256))) % 256
    with open(flipped, "wb") as f:
      f.write(mutated)
    reference = _reference(flipped)
    try:
      ours = _ours(flipped)
    except CheckpointError as e:
      assert reference is None, (at, str(e))
      assert str(e).startswith(f"{flipped}: "), str(e)
      outcomes["refused"] += 1
      continue
    assert reference is not None and _same(ours, reference), at
    outcomes["read"] += 1
  assert min(outcomes.values()) > 0, outcomes  # both ways a flip can end were met


def _with_header(valid, tmp_path, edit, data_bytes=None) -> str:
  """The valid file with its header edited (`edit(header)` in place), rewritten with a correct length."""
  _, data, _ = valid
  length = struct.unpack("<Q", data[:8])[0]
  header = json.loads(data[8:8 + length])
  edit(header)
  blob = json.dumps(header).encode()
  out = str(tmp_path / "edited.safetensors")
  with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(blob)) + blob + (data[8 + length:] if data_bytes is None else data_bytes))
  return out


def _entry(header, name, **fields):
  header[name].update(fields)


@pytest.mark.parametrize("edit, message", [
    (lambda h: _entry(h, "ids", dtype="Q99"), r"tensor 'ids' has unsupported dtype 'Q99'"),
    (lambda h: _entry(h, "ids", shape=[2, -3]), r"tensor 'ids': shape \[2, -3\] is not a list of non-negative"),
    (lambda h: _entry(h, "ids", shape=[2, 3.0]), r"tensor 'ids': shape \[2, 3.0\] is not a list of non-negative"),
    (lambda h: _entry(h, "ids", data_offsets=[0]), r"tensor 'ids': data_offsets \[0\] is not a pair"),
    (lambda h: _entry(h, "ids", data_offsets=[9, 4]), r"tensor 'ids': data_offsets \[9, 4\] begin after they end"),
    (lambda h: _entry(h, "ids", shape=[3, 3]), r"tensor 'ids': data_offsets \[\d+, \d+\] hold 48 bytes, but I64 of "
                                               r"shape \(3, 3\) is 72 bytes"),
    (lambda h: h.update(extra={"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}),
     r"tensor '\w+' starts at byte 0 of the data section, expected 1 \(the tensors overlap or leave a gap\)"),
    (lambda h: h.update(ids="not an entry"), r"tensor 'ids': its header entry is not a JSON object"),
], ids=["dtype", "negative dim", "float dim", "one offset", "begin after end", "size", "overlap", "not an object"])
def test_each_header_rule_names_the_file_and_the_tensor(valid, tmp_path, edit, message):
  path = _with_header(valid, tmp_path, edit)
  with pytest.raises(CheckpointError, match=rf"^{re.escape(path)}: {message}"):
    SafetensorsFile(path)
  assert _reference(path) is None  # the reference refuses each of them too


def test_bytes_past_the_last_tensor_are_refused_not_read_shifted(valid, tmp_path):
  """A header length that is too short by whitespace still parses, but the data would be read from the wrong
  offset: the tensors must tile the data section to its end."""
  _, data, _ = valid
  path = _with_header(valid, tmp_path, lambda h: None, data_bytes=data[8 + struct.unpack("<Q", data[:8])[0]:] + b"\0")
  with pytest.raises(CheckpointError, match=r"the last tensor \('\w+'\) ends at byte \d+ of the data section, which "
                                            r"has \d+ \(bytes past it"):
    SafetensorsFile(path)


@pytest.fixture(scope="module")
def truncated_checkpoint(tmp_path_factory):
  """A tiny Qwen3 checkpoint (transformers wrote it) whose model.safetensors lost its last 10 KB."""
  path = tmp_path_factory.mktemp("truncated")
  make_hf_checkpoint(path, "qwen3")
  weights = path / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:-10_000])
  return path


def test_prepare_model_says_a_truncated_file_in_one_line(truncated_checkpoint, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.run(prepare_app.main, ["model", str(truncated_checkpoint)])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "Traceback" not in err
  assert re.fullmatch(rf"error: {re.escape(str(truncated_checkpoint / 'model.safetensors'))}: tensor '[\w.]+' ends at "
                      r"byte \d+ of the data section, which has \d+: the file is truncated\n", err), err


def test_training_on_a_truncated_checkpoint_is_one_line_before_any_work(truncated_checkpoint, tmp_path):
  args = ["--config", "configs/arithmetic.py", f"--config.model.checkpoint={truncated_checkpoint}",
          "--config.model.overrides={}", "--config.warmstart.steps=0", "--workdir", str(tmp_path / "run")]
  done = subprocess.run([sys.executable, "-m", "oapl_jax.main", *args], cwd=REPO, capture_output=True, text=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=600)
  errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
  assert len(errors) == 1 and f"{truncated_checkpoint / 'model.safetensors'}: tensor '" in errors[0], errors
  assert os.listdir(tmp_path / "run") == ["run.lock"]  # no config, metrics or checkpoint written


def test_the_checks_refuse_nothing_transformers_writes(tmp_path):
  make_hf_checkpoint(tmp_path, "qwen3")
  path = str(tmp_path / "model.safetensors")
  assert _same(_ours(path), safetensors.numpy.load_file(path))
