"""oapl_jax/generations.py: the records of sampled responses, their bound, the advantages, the files and tables."""
import json
import types

import numpy as np
import pytest

from oapl_jax import generations
from oapl_jax.sampler import api
from oapl_jax.tasks import arithmetic, base


def _groups(task, responses_PxG: list[list[str]], truncated=()):
  """A stand-in for rollout.Groups: tokens, lengths and finish reasons of the given response texts."""
  eos = arithmetic.EOS
  tokens = [[task.tokenizer.encode(text.removesuffix(eos)) + [task.tokenizer.eos_id] * text.endswith(eos)
             for text in row] for row in responses_PxG]
  P, G = len(tokens), len(tokens[0])
  N = max(len(t) for row in tokens for t in row)
  response_PxGxN = np.zeros((P, G, N), np.int32)
  lengths_PxG = np.zeros((P, G), np.int32)
  for p in range(P):
    for g in range(G):
      response_PxGxN[p, g, :len(tokens[p][g])] = tokens[p][g]
      lengths_PxG[p, g] = len(tokens[p][g])
  finish = np.full((P, G), api.FINISH_STOP, np.int8)
  for p, g in truncated:
    finish[p, g] = api.FINISH_LENGTH
  return types.SimpleNamespace(response_tokens=response_PxGxN, lengths=lengths_PxG, finish_reason=finish)


@pytest.fixture(scope="module")
def task():
  return arithmetic.make_task(num_train=8, num_held_out=4)


def test_records_keep_the_first_prompts_with_every_sample_and_the_reward_s_detail(task):
  problems = task.eval_sets["held_out"][:3]
  eos = arithmetic.EOS
  groups = _groups(task, [[p.answer + eos, "1"] for p in problems], truncated=[(0, 1)])
  rewards_PxG, _ = task.score_groups(problems, groups.response_tokens, groups.lengths)
  rows = generations.records(task, problems, groups, rewards_PxG, prompts=2)
  assert len(rows) == 2 * 2 and [r["sample"] for r in rows] == [0, 1, 0, 1]
  assert rows[0] == {"prompt": problems[0].prompt, "answer": problems[0].answer, "sample": 0,
                     "response": problems[0].answer + eos, "reward": 1.0, "truncated": False,
                     "detail": f"answer {problems[0].answer!r}"}
  assert rows[1]["reward"] == 0.0 and rows[1]["truncated"] and rows[1]["detail"] == f"no {eos}: '1'"
  assert generations.records(task, problems, groups, rewards_PxG, prompts=0) == []


def test_a_task_without_a_detail_hook_records_none(task):
  plain = base.Task("plain", task.tokenizer, task.train, task.eval_sets, task.reward_fn)
  problems = task.train[:1]
  groups = _groups(plain, [["12"]])
  assert "detail" not in generations.records(plain, problems, groups, np.zeros((1, 1)), prompts=1)[0]


def test_advantages_are_the_loss_s_own():
  r_PxG = np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
  beta1 = 0.5
  v_P = beta1 * np.log(np.mean(np.exp(r_PxG / beta1), axis=1))  # Eq. 2, computed here independently
  settings = types.SimpleNamespace(beta1=beta1)
  np.testing.assert_allclose(generations.advantages("oapl", settings, r_PxG), r_PxG - v_P[:, None], atol=1e-6)
  grpo = generations.advantages("grpo", None, r_PxG)
  np.testing.assert_allclose(grpo[1], 0.0, atol=1e-6)
  assert grpo[0, 0] > 0 > grpo[0, 1]
  assert generations.advantages("sft", None, r_PxG) is None


def test_the_sink_writes_each_set_and_a_table_to_the_text_panel(tmp_path):
  texts = {}
  sink = generations.Sink(str(tmp_path), lambda step, t: texts.update({(step, k): v for k, v in t.items()}))
  rows = [{"prompt": "1+1=", "answer": "2", "sample": 0, "response": "2|x\ny", "reward": 1.0, "detail": "d"}]
  sink.eval(40, {"held_out": rows, "empty": []}, prefix="policy_")
  assert generations.read(generations.eval_path(str(tmp_path), 40, "policy_held_out")) == rows
  assert list(texts) == [(40, "generations/policy_held_out")]
  assert "| 1+1= | 2\\|x y | 1 | d |" in texts[40, "generations/policy_held_out"]
  sink.rollouts(3, rows)
  with open(generations.rollouts_path(str(tmp_path), 3)) as f:
    assert json.loads(f.readline()) == rows[0]


def test_show_prints_n_records_over_the_prompts():
  rows = [{"prompt": p, "sample": i, "response": "r", "reward": 0.5, "advantage": 0.25} for p in "abc" for i in range(2)]
  text = generations.show(rows, 3)
  assert [text.count(f"prompt: '{p}'") for p in "abc"] == [1, 1, 1] and "reward 0.5; advantage: 0.25" in text
