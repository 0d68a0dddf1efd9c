"""Host memory reuse for runs on the CPU backend (glibc's malloc only).

On the CPU backend every activation is host memory. glibc's malloc serves each request over its mmap
threshold (at most 32 MiB) with a fresh mmap and unmaps it on free. A train step's large temporaries
(a float32 [tokens, vocab] block is hundreds of MB at Qwen's vocabulary) are therefore new pages every
step, and the kernel faults in and zeroes each 4 KiB page before the step can write it. With malloc's
mmap and trimming turned off, and one arena for every thread (a thread's own arena maps large blocks even
with mmap off), freed blocks stay in the heap and the next step reuses pages already mapped.

    host_memory.keep_freed_memory()   # once, before JAX starts its threads (apps/cli.prepare_host does it
                                      # when JAX will run on the CPU only)

Measured (Qwen3-0.6B width, 4 layers, 2 x 4 x 256 tokens, float32, kept logits, 2-core VM, JAX alone in its
process): 23.6 s a step and 7.1M page faults a run with glibc's defaults; 19.7 s and 3.5M with this; peak
resident memory 9.1 -> 14.2 GB.

The cost: the process's resident memory stays near its peak (freed blocks are not given back), plus the
heap's fragmentation (above: +5 GB). Accelerator runs keep glibc's defaults (their activations live
in device memory). OAPL_KEEP_FREED_MEMORY=0 in the environment turns it off.
"""
import ctypes
import ctypes.util
import logging
import os

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8  # glibc malloc.h


def keep_freed_memory() -> bool:
  """Turn off glibc malloc's mmap for large blocks and its trimming of the heap, and give every thread the
  one main arena, for this process (threads that already have an arena keep it). Returns whether all took
  (False off glibc, or with OAPL_KEEP_FREED_MEMORY=0)."""
  if os.environ.get("OAPL_KEEP_FREED_MEMORY", "1") == "0":
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt)
    return False
  applied = all(mallopt(param, value) == 1 for param, value in
                ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)))  # -1: never trim
  if not applied:
    logging.warning("host_memory: glibc mallopt refused; freed host memory is returned to the system")
  return applied
