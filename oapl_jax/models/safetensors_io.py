"""Minimal safetensors reader/writer over numpy memmaps (bf16 included, via ml_dtypes).

Reading is lazy: a tensor is a read-only memmap view, so a loader can slice out one shard's
block without the whole checkpoint ever being materialised in memory.
"""
import json
import os
import struct

import ml_dtypes
import numpy as np

_DTYPES = {
    "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


class CheckpointError(ValueError):
  """A checkpoint directory that cannot be loaded; the message names the file and tensor."""


class SafetensorsFile:
  """Index of one .safetensors file: names -> (dtype, shape, byte range)."""

  def __init__(self, path: str):
    self.path = path
    with open(path, "rb") as f:
      raw = f.read(8)
      if len(raw) != 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
      (header_len,) = struct.unpack("<Q", raw)
      try:
        self.header = json.loads(f.read(header_len))
      except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: unreadable safetensors header ({e})") from None
    self.header.pop("__metadata__", None)
    self._data_start = 8 + header_len
    self._mmap = None

  def keys(self):
    return self.header.keys()

  def get(self, name: str) -> np.ndarray:
    info = self.header[name]
    if info["dtype"] not in _DTYPES:
      raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {info['dtype']}")
    if self._mmap is None:
      self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
    start, end = info["data_offsets"]
    flat = self._mmap[self._data_start + start:self._data_start + end]
    return flat.view(_DTYPES[info["dtype"]]).reshape(info["shape"])


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
