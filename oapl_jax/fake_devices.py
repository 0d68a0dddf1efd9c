"""Fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=N) and XLA:CPU's thread pool.

The N fake devices are threads of one process, and a sharded program's collectives meet at an in-process
rendezvous. Each participant waits there on a thread of XLA:CPU's intra-op pool, which has max(cores, N)
threads. One device runs independent parts of its program concurrently (a collective in a scanned layer's
body and one outside the scan), so two devices can reach their collectives in different orders: N threads
then all wait at two rendezvous that each lack a device whose turn needs a thread. The process hangs until
XLA's collective timeout aborts it ("Expected 8 threads to join the rendezvous, but only 7 of them
arrived"). Seen on the 2-core VM, 8 fake devices, a warm start's train step (an all-gather in the layer
scan, an all-reduce outside it): 6 aborts in 7 runs with the pool's 8 threads; 0 in 15 with 10, 12, 16 or
32 threads (oapl_jax.main on configs/arithmetic.py, 20 warm-start steps).

    fake_devices.make_room_for_collectives()   # before JAX starts (apps/cli.prepare_host, tests/conftest.py)

XLA sizes its pools from PJRT_NPROC when it is set; this sets it, if unset, to max(cores, 4 * N). Threads
that wait cost no CPU.
"""
import os
import re
from typing import Optional

THREADS_PER_DEVICE = 4
_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def forced_device_count(xla_flags: str) -> int:
  """N of the last --xla_force_host_platform_device_count=N in `xla_flags` (XLA reads the last), else 1."""
  counts = _FLAG.findall(xla_flags or "")
  return int(counts[-1]) if counts else 1


def make_room_for_collectives(environ=os.environ) -> Optional[int]:
  """Sets environ["PJRT_NPROC"] so XLA:CPU's pools have THREADS_PER_DEVICE threads per fake device (at least
  one per core), where there is more than one fake device and PJRT_NPROC is unset. Returns the value set, or
  None where nothing was set. Takes effect only before JAX creates its CPU client."""
  devices = forced_device_count(environ.get("XLA_FLAGS", ""))
  if devices <= 1 or environ.get("PJRT_NPROC"):
    return None
  threads = max(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                THREADS_PER_DEVICE * devices)
  environ["PJRT_NPROC"] = str(threads)
  return threads
