"""Minimal safetensors reader/writer over numpy memmaps (bf16 included, via ml_dtypes).

Reading is lazy: a tensor is a read-only memmap view, so a loader can slice out one shard's
block without the whole checkpoint ever being materialised in memory. The header is checked first, against the
file's size (its length, then every tensor's dtype, shape and byte range, which must tile the data section as the
format requires): a truncated or garbled file is a CheckpointError naming the file and the tensor.
"""
import json
import math
import os
import struct

import ml_dtypes
import numpy as np

_DTYPES = {
    "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}
_MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit


class CheckpointError(ValueError):
  """A checkpoint directory that cannot be loaded; the message names the file and tensor."""


class SafetensorsFile:
  """Index of one .safetensors file: names -> (dtype, shape, byte range), every entry checked against the file's
  size when it is opened (CheckpointError naming the file and the tensor), so a truncated or garbled file
  fails here, not in a reshape."""

  def __init__(self, path: str):
    self.path = path
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      raw = f.read(8)
      if len(raw) != 8:
        raise CheckpointError(f"{path}: not a safetensors file ({size} bytes, shorter than its 8-byte header length)")
      (header_len,) = struct.unpack("<Q", raw)
      if header_len > min(size - 8, _MAX_HEADER_BYTES):
        raise CheckpointError(f"{path}: header length {header_len} does not fit the file ({size} bytes): truncated, "
                              "or not a safetensors file")
      try:
        header = json.loads(f.read(header_len))
      except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"{path}: unreadable safetensors header ({e})") from None
    if not isinstance(header, dict):
      raise CheckpointError(f"{path}: the safetensors header is a JSON {type(header).__name__}, not an object")
    header.pop("__metadata__", None)
    self.header = {name: _checked_entry(path, name, info) for name, info in header.items()}
    _check_layout(path, self.header, size - 8 - header_len)
    self._data_start = 8 + header_len
    self._mmap = None

  def keys(self):
    return self.header.keys()

  def get(self, name: str) -> np.ndarray:
    info = self.header[name]
    if self._mmap is None:
      self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
    start, end = info["data_offsets"]
    flat = self._mmap[self._data_start + start:self._data_start + end]
    if flat.size != end - start:
      raise CheckpointError(f"{self.path}: tensor {name!r} ends past the end of the file (it shrank since it was "
                            "opened)")
    return flat.view(_DTYPES[info["dtype"]]).reshape(info["shape"])


def _is_count(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _checked_entry(path: str, name: str, info) -> dict:
  """One tensor's header entry, if it is a known dtype, a shape of non-negative ints and a (begin, end) byte range
  as long as that shape's bytes; else CheckpointError naming the tensor."""
  where = f"{path}: tensor {name!r}"
  if not isinstance(info, dict):
    raise CheckpointError(f"{where}: its header entry is not a JSON object ({info!r:.80})")
  dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
  if dtype not in _DTYPES:
    raise CheckpointError(f"{where} has unsupported dtype {dtype!r:.40} (supported: {sorted(_DTYPES)})")
  if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
    raise CheckpointError(f"{where}: shape {shape!r:.80} is not a list of non-negative integers")
  if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
    raise CheckpointError(f"{where}: data_offsets {offsets!r:.80} is not a pair of non-negative integers")
  begin, end = offsets
  if begin > end:
    raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] begin after they end")
  expected = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
  if end - begin != expected:
    raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes, but {dtype} of shape "
                          f"{tuple(shape)} is {expected} bytes")
  return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def _check_layout(path: str, entries: dict, data_bytes: int) -> None:
  """The tensors tile the data section, in offset order from 0 to its end, as the format requires: a file
  cut short, or whose header length is off (its data read shifted), fails here."""
  covered, last = 0, None
  for name, info in sorted(entries.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
    begin, end = info["data_offsets"]
    if begin != covered:
      raise CheckpointError(f"{path}: tensor {name!r} starts at byte {begin} of the data section, expected {covered} "
                            "(the tensors overlap or leave a gap)")
    if end > data_bytes:
      raise CheckpointError(f"{path}: tensor {name!r} ends at byte {end} of the data section, which has {data_bytes}: "
                            "the file is truncated")
    covered, last = end, name
  if covered != data_bytes:
    raise CheckpointError(f"{path}: the last tensor ({last!r}) ends at byte {covered} of the data section, which has "
                          f"{data_bytes} (bytes past it: a wrong header length, or not a safetensors file)")


def save_file(tensors: dict, path: str) -> None:
  """Write {name: np.ndarray} as one safetensors file."""
  header, offset = {}, 0
  arrays = {name: np.ascontiguousarray(a) for name, a in tensors.items()}
  for name, a in arrays.items():
    if a.dtype not in _NAMES:
      raise ValueError(f"cannot save tensor {name!r} of dtype {a.dtype} as safetensors")
    header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
    offset += a.nbytes
  header["__metadata__"] = {"format": "pt"}
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * ((-len(blob)) % 8)
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for a in arrays.values():
      f.write(a.tobytes())
  os.replace(tmp, path)
