"""CodeReward's cache (code_reward.CodeReward cache_size): a program met again is answered without a run, a
timeout is never kept, the least recently used entry leaves first."""
import json

import numpy as np
import pytest

from oapl_jax.tasks import code_reward
from tests.tasks_code_reward_test import PROGRAMS, STDIO, CALL, fenced


def test_cache_answers_a_program_met_again_and_never_keeps_a_timeout():
  reward = code_reward.CodeReward(num_workers=2, timeout_s=1.0, cache_size=2)
  try:
    wrong_outputs = {"tests": json.dumps([{"input": "1 2\n", "output": "4\n", "testtype": "stdin"}])}
    correct, spin = PROGRAMS["stdio_correct"][1], fenced("while True:\n  pass")
    records, responses = [STDIO, wrong_outputs, STDIO], [correct, correct, spin]
    first = reward(records, responses)
    np.testing.assert_array_equal(first.rewards, [1, 0, 0])  # same job, other expected outputs: its own entry
    assert (reward.stats().runs, reward.cache_hits, first.num_timeout) == (3, 0, 1)
    again = reward(records, responses)
    np.testing.assert_array_equal(again.rewards, first.rewards)
    assert (reward.stats().runs, reward.cache_hits, again.num_timeout) == (4, 2, 1)  # only the timeout ran again
    reward([CALL], [PROGRAMS["call_wrong"][1]])  # a third clean entry pushes out the least recently used
    reward([STDIO], [correct])
    assert (reward.stats().runs, reward.cache_hits) == (6, 2)
  finally:
    reward.close()
  with pytest.raises(ValueError, match="cache_size"):
    code_reward.CodeReward(cache_size=-1)
