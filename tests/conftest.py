"""Test set-up: 8 fake CPU devices, set before JAX initialises its backends."""
import os

from oapl_jax import fake_devices  # imports nothing of JAX

# Compiling is most of this suite's time, so two XLA:CPU settings cut it (speed is measured in benchmarks/, never here):
# - LLVM's optimizer off (--xla_backend_optimization_level=0): the same HLO, about 30% less compile time;
# - XLA:CPU's classic elemental emitters (--xla_cpu_use_fusion_emitters=false) instead of the MLIR fusion emitters,
#   which build each of a train step's ~400 fusions as its own LLVM module: the tiny sharded train step compiles in
#   2.3-3.5 s instead of 9.2 s (tests/trainer_test's 8-device step, one core). At O0 some elementwise functions
#   round about an ulp apart from the fusion emitters' (tanh and log1p, checked alone; the golden steps hold under
#   either, tests/golden_step_test.py), and a scatter is lowered to a loop (a test that reads the HLO a user gets compiles with
#   compiler_options={"xla_cpu_use_fusion_emitters": True}).
# The 8 fake devices are threads of one process. XLA:CPU aborts the process when a collective's threads have not
# all met within its timeout; 120 s leaves room for an oversubscribed 2-core machine (two test workers beside other
# work) and ends a real hang soon, with the abort's message. The collectives' own deadlock on too few threads is
# prevented below (oapl_jax/fake_devices.py).
# On an accelerator (benchmarks/gpu_check.sh sets JAX_PLATFORMS=cuda,cpu) only the device count is set: the GPU
# image's jaxlib (0.11.2, outside pyproject's pin) aborts on the unknown --xla_cpu_use_fusion_emitters.
CPU_FIRST = os.environ.get("JAX_PLATFORMS", "cpu").split(",")[0] == "cpu"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    + (" --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
       " --xla_cpu_collective_call_terminate_timeout_seconds=120 --xla_cpu_collective_timeout_seconds=120"
       " --xla_cpu_collective_call_warn_stuck_timeout_seconds=30" if CPU_FIRST else "")
).strip()
fake_devices.make_room_for_collectives()  # PJRT_NPROC: the suite's processes and the commands it starts
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's compiled programs kept on disk (.jax_test_cache/, shared by the xdist workers and by the commands tests
# start, which inherit these): most of this suite's time was compiling the same tiny programs again (a loop test's
# train step: 12 s cold, read back in well under one). A cache key is the program, the flags and the jax version,
# so a hit is the very executable a compile would give. No size cap: the cap's eviction needs every entry's access
# time written beside it, and a process a test kills mid-write leaves an entry without one, which stops every later
# write; an entry read while another process writes it fails to load, and JAX then compiles (a warning).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), ".jax_test_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Entry points imported here (apps/*) keep freed host memory on CPU (oapl_jax/host_memory.py); a worker runs
# hundreds of tests, so it keeps glibc's defaults and gives memory back between them (host_memory_test opts in).
os.environ.setdefault("OAPL_KEEP_FREED_MEMORY", "0")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_configure(config):
  config.addinivalue_line("markers", "devices(n): needs n JAX devices (this suite fakes 8 CPU ones; a GPU host "
                                     "has its own count): skipped where fewer are visible")


def pytest_collection_modifyitems(config, items):
  for item in items:
    marker = item.get_closest_marker("devices")
    if marker and jax.device_count() < marker.args[0]:
      item.add_marker(pytest.mark.skip(reason=f"needs {marker.args[0]} devices; {jax.device_count()} visible"))
