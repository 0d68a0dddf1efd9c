"""What the sandbox tests share: the isolation fixture, marked programs and the check that none is left running.

Every adversarial program first names its process (and so every process it forks) with a fresh marker; after the
run no process with that marker may be left on the host.
"""
import os
import textwrap
import time
import uuid

import pytest

from oapl_jax.tasks import sandbox

SYSTEM_PYTHON = "/usr/bin/python3"
FALLBACK = sandbox.SandboxConfig(python=SYSTEM_PYTHON, use_namespaces=False)


@pytest.fixture(scope="module")
def isolation():
  return sandbox.detect_isolation()


def needs_namespaces(isolation):
  if isolation != "namespaces":
    pytest.skip("the kernel refuses unprivileged namespaces here; fallback tests cover this host")


def marked(body: str) -> tuple[str, str]:
  marker = "sbx" + uuid.uuid4().hex[:12]
  prelude = f"import ctypes\nctypes.CDLL(None).prctl(15, b{marker!r}, 0, 0, 0)  # PR_SET_NAME\n"
  return marker, prelude + textwrap.dedent(body)


def survivors(marker: str) -> list[int]:
  """Live processes named `marker` (zombies are dead: killed, waiting for init to reap them)."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/stat") as f:
        name, state = f.read().split("(", 1)[1].rsplit(")", 1)
      if name == marker and state.split()[0] != "Z":
        found.append(int(pid))
    except (OSError, ValueError):
      pass
  return found


def run_contained(body, limits=sandbox.Limits(wall_s=1.0), config=sandbox.SandboxConfig(), stdin=b""):
  """Runs a marked program; asserts the launcher ended it by its wall limit (the pool's backstop,
  3 s later, was not needed) and that it left no process behind."""
  marker, source = marked(body)
  result = sandbox.run(source, stdin, limits, config)
  assert not result.backstop, result
  time.sleep(0.05)
  assert survivors(marker) == [], result
  return result


needs_root_and_system_python = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root (to switch users) and a system python readable by every uid")
CAN_FALLBACK = os.geteuid() == 0 and os.path.exists(SYSTEM_PYTHON)  # see needs_root_and_system_python
