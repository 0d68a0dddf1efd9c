"""oapl_jax/fake_devices.py: PJRT_NPROC gives XLA:CPU's pool several threads per fake device, and XLA honours it."""
import os
import subprocess
import sys

from oapl_jax import fake_devices


def test_the_last_count_flag_is_the_one_xla_reads():
  assert fake_devices.forced_device_count("") == 1
  assert fake_devices.forced_device_count("--xla_force_host_platform_device_count=8 --x=1") == 8
  assert fake_devices.forced_device_count("--xla_force_host_platform_device_count=8 "
                                          "--xla_force_host_platform_device_count=2") == 2


def test_pjrt_nproc_is_set_only_for_several_fake_devices_and_never_over_a_users_value():
  cores = len(os.sched_getaffinity(0))
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  assert fake_devices.make_room_for_collectives(env) == max(cores, 32) and env["PJRT_NPROC"] == str(max(cores, 32))
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PJRT_NPROC": "5"}
  assert fake_devices.make_room_for_collectives(env) is None and env["PJRT_NPROC"] == "5"
  for flags in ("", "--xla_force_host_platform_device_count=1"):
    env = {"XLA_FLAGS": flags}
    assert fake_devices.make_room_for_collectives(env) is None and "PJRT_NPROC" not in env


def test_xla_sizes_its_pool_from_it():
  """The pool's threads counted by name in a process with 3 fake devices: 12 with the module's setting, 3
  (max(cores, devices) on this <=3-core machine) without it. Fails if jaxlib stops reading PJRT_NPROC."""
  probe = ("import collections, os, jax, jax.numpy as jnp; jax.jit(jnp.sin)(1.0).block_until_ready();"
           "print(sum(open(f'/proc/self/task/{t}/comm').read().strip() == 'tf_XLAEigen'"
           " for t in os.listdir('/proc/self/task')))")
  counts = []
  for nproc in ("set", None):
    env = {k: v for k, v in os.environ.items() if k != "PJRT_NPROC"}
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=3", JAX_PLATFORMS="cpu")
    if nproc:
      fake_devices.make_room_for_collectives(env)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    counts.append(int(out.stdout.strip().splitlines()[-1]))
  cores = len(os.sched_getaffinity(0))
  assert counts == [max(cores, 12), max(cores, 3)]
