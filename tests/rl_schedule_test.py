"""The window schedule (which chunks a step may use, where each chunk's prompts start) and the data order."""
import numpy as np
import pytest

from oapl_jax.rl.rollout_worker import Window
from oapl_jax.rl.schedule import WindowSchedule, prompt_order


def test_chunks_become_visible_every_k_steps_and_cover_the_window():
  s = WindowSchedule(sync_every=10, steps_per_chunk=4, prompts_per_chunk=32)
  assert s.num_chunks == 3 and s.prompts_per_window == 96  # ceil(10 / 4) chunks
  assert [s.chunks_visible(t) for t in range(10)] == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3]
  window = Window(version=3, index=2, data_position=1000, evaluate=False, first_step=20)
  assert [window.chunk_step(c, s.steps_per_chunk) for c in range(3)] == [20, 24, 28]
  assert [s.chunk_position(1000, c) for c in range(3)] == [1000, 1032, 1064]


def test_a_lag_of_one_step_sees_one_chunk_per_step():
  s = WindowSchedule(sync_every=1, steps_per_chunk=1, prompts_per_chunk=8)
  assert s.num_chunks == 1 and s.chunks_visible(0) == 1 and s.first_step(7) == 7


def test_visible_chunks_never_exceed_the_generated_ones():
  for L in range(1, 30):
    for k in range(1, 12):
      s = WindowSchedule(L, k, 4)
      visible = [s.chunks_visible(t) for t in range(L)]
      assert visible == sorted(visible) and visible[0] == 1 and visible[-1] == s.num_chunks


@pytest.mark.parametrize("field", ["sync_every", "steps_per_chunk", "prompts_per_chunk"])
def test_bad_values_name_the_field(field):
  values = dict(sync_every=5, steps_per_chunk=1, prompts_per_chunk=4) | {field: 0}
  with pytest.raises(ValueError, match=field):
    WindowSchedule(**values)


def test_prompt_order_is_a_fresh_permutation_every_epoch_and_resumable():
  n = 10
  order = prompt_order(n, 0, 3 * n, seed=5)
  epochs = order.reshape(3, n)
  assert all(sorted(e) == list(range(n)) for e in epochs)  # every prompt once per epoch
  assert not (epochs[0] == epochs[1]).all()  # reshuffled
  np.testing.assert_array_equal(prompt_order(n, 13, 9, seed=5), order[13:22])  # any position, same order
  with pytest.raises(ValueError, match="no training prompts"):
    prompt_order(0, 0, 1, seed=0)
