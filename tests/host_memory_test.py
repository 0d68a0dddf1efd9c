"""oapl_jax/host_memory.py: with freed memory kept, a large block freed and asked for again reuses pages
already mapped (no page faults), where glibc's defaults map it fresh (one fault per 4 KiB page).
Each case runs in its own process: the malloc settings are process-wide and cannot be undone."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = 64 << 20  # over glibc's largest mmap threshold (32 MiB)

# Prints "<applied> <page faults while writing a freed-and-reallocated block>".
_PROBE = f"""
import ctypes, resource, sys
sys.path.insert(0, {REPO!r})
{{setup}}
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

def write_block():
  block = libc.malloc({BLOCK})
  libc.memset(block, 1, {BLOCK})
  libc.free(block)

write_block()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
write_block()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES = BLOCK // 4096


def probe(setup: str, **env) -> tuple[str, int]:
  env = {"OAPL_KEEP_FREED_MEMORY": "1", **env}  # conftest turns it off for the suite's own processes
  out = subprocess.run([sys.executable, "-c", _PROBE.replace("{setup}", setup)], capture_output=True, text=True,
                       check=True, env={**os.environ, **env}).stdout.split()
  return out[0], int(out[1])


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")


def test_kept_memory_is_reused_without_page_faults_and_defaults_fault_every_page():
  applied, faults = probe("from oapl_jax import host_memory; applied = host_memory.keep_freed_memory()")
  assert applied == "True" and faults < PAGES // 20, faults
  applied, faults = probe("applied = None")
  assert faults > PAGES // 2, faults  # the control: glibc maps the block afresh


def test_the_environment_switch_turns_it_off():
  applied, faults = probe("from oapl_jax import host_memory; applied = host_memory.keep_freed_memory()",
                          OAPL_KEEP_FREED_MEMORY="0")
  assert applied == "False" and faults > PAGES // 2, faults


@pytest.mark.parametrize("platforms, kept", [("cpu", True), ("cuda,cpu", False)])
def test_entry_points_keep_freed_memory_only_when_jax_runs_on_the_cpu_alone(platforms, kept):
  applied, faults = probe("from oapl_jax.apps import cli; cli.prepare_host(); applied = None",
                          JAX_PLATFORMS=platforms)
  assert (faults < PAGES // 20) if kept else (faults > PAGES // 2), (platforms, faults)
