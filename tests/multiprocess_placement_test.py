"""parallel.split_devices: which devices train and which sample, with one process or several."""
import dataclasses

import pytest

from oapl_jax import parallel


@dataclasses.dataclass(frozen=True)
class Device:
  id: int
  process_index: int


def devices(processes: int, per_process: int) -> list[Device]:
  return [Device(p * 100 + i, p) for p in reversed(range(processes)) for i in reversed(range(per_process))]


def ids(side) -> list[int]:
  return [d.id for d in side]


def test_one_process_gives_the_sampler_the_last_devices():
  trainer, sampler = parallel.split_devices(devices(1, 8), 3)
  assert ids(trainer) == [0, 1, 2, 3, 4] and ids(sampler) == [5, 6, 7]
  shared = parallel.split_devices(devices(1, 8), 0)
  assert ids(shared[0]) == ids(shared[1]) == list(range(8))


def test_several_processes_split_every_process_alike():
  trainer, sampler = parallel.split_devices(devices(2, 4), 4)
  assert ids(trainer) == [0, 1, 100, 101] and ids(sampler) == [2, 3, 102, 103]
  trainer, sampler = parallel.split_devices(devices(4, 4), 4)  # one sampler device per process
  assert ids(sampler) == [3, 103, 203, 303] and len(trainer) == 12


@pytest.mark.parametrize("n", [3, 5, 6])  # 6: 3 sampler devices per process against 1 trainer device
def test_a_split_that_is_not_the_same_on_every_process_is_refused(n):
  with pytest.raises(ValueError, match=rf"mesh.sampler_devices={n}: with 2 processes of \[4\] devices each"):
    parallel.split_devices(devices(2, 4), n)
  uneven = devices(1, 4) + [Device(100, 1), Device(101, 1)]
  with pytest.raises(ValueError, match=r"with 2 processes of \[2, 4\] devices each"):
    parallel.split_devices(uneven, 2)


def test_out_of_range_is_refused():
  with pytest.raises(ValueError, match=r"need 0 \(share\) or 1..7"):
    parallel.split_devices(devices(1, 8), 8)
