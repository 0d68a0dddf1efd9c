"""Tests for oapl_jax.tasks.chain_task: worked chains, the slip, problems, splits, the reward, the config path."""
import itertools

import numpy as np
import pytest

from oapl_jax.tasks import chain_task, factory
from oapl_jax.tasks.char_tokenizer import EOS


def test_tokenizer_ids_and_round_trip():
  tok = chain_task.CharTokenizer()
  assert tok.encode("0123456789+=;#") == list(range(3, 17))
  assert tok.decode(tok.encode("12+3=15;#15")) == "12+3=15;#15"
  assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 32)
  with pytest.raises(ValueError, match="'-'"):
    tok.encode("1-2")


def test_solution_written_by_hand():
  assert chain_task.solution([37, 58, 12]) == "37+58=95;95+12=107;#107"
  assert chain_task.solution([5, 0]) == "5+0=5;#5"
  # a slip at step 0 adds one there and the chain carries the wrong total on
  assert chain_task.solution([37, 58, 12], slip_step=0) == "37+58=96;96+12=108;#108"
  assert chain_task.solution([37, 58, 12], slip_step=1) == "37+58=95;95+12=108;#108"
  with pytest.raises(ValueError, match="slip_step"):
    chain_task.solution([1, 2, 3], slip_step=2)
  with pytest.raises(ValueError, match="at least 2 terms"):
    chain_task.solution([7])


def test_max_completion_len_bounds_every_demonstration():
  # 7 terms of 99 with a slip at step 0: "99+99=199;" (10), five "199+99=298;"-like steps (11 each),
  # "#694" (4): 69 characters, + eos
  assert chain_task.max_completion_len(7, 2) == 70
  problems = chain_task.make_problems(300, "train", seed=2)
  demos = chain_task.sft_examples(problems, slip_rate=0.5, seed=0)
  lengths = [len(d.completion_tokens) for d in demos]
  assert max(lengths) <= 70 and min(lengths) >= 50  # the 50-200 token chains


def test_problems_are_correct_and_deterministic():
  tok = chain_task.CharTokenizer()
  a = chain_task.make_problems(200, "train", seed=0, num_terms=4)
  assert a == chain_task.make_problems(200, "train", seed=0, num_terms=4)
  assert a != chain_task.make_problems(200, "train", seed=1, num_terms=4)
  assert len({p.prompt for p in a}) == 200
  for p in a:
    terms = [int(t) for t in p.prompt[:-1].split("+")]  # independent parse of "a+b+c+d="
    assert len(terms) == 4 and all(0 <= t < 100 for t in terms) and p.prompt.endswith("=")
    assert int(p.answer) == sum(terms)
    assert p.prompt_tokens == (tok.bos_id, *tok.encode(p.prompt))


def test_train_and_held_out_are_disjoint():
  # 2 one-digit terms: only 100 problems exist, so every one of each split can be taken.
  kw = dict(num_terms=2, num_digits=1, held_out_fraction=0.3)
  held_out = {p.prompt for p in chain_task.make_problems(1, "held_out", **kw)}
  everything = {f"{a}+{b}=" for a, b in itertools.product(range(10), repeat=2)}
  n_held = sum(chain_task.is_held_out([a, b], 0.3) for a, b in itertools.product(range(10), repeat=2))
  train_all = {p.prompt for p in chain_task.make_problems(100 - n_held, "train", **kw)}
  held_all = {p.prompt for p in chain_task.make_problems(n_held, "held_out", **kw)}
  assert held_out <= held_all and not train_all & held_all and train_all | held_all == everything
  with pytest.raises(ValueError, match="could not draw"):
    chain_task.make_problems(100 - n_held + 1, "train", **kw)


def test_reward_is_exact_match_on_the_final_answer_with_eos():
  assert chain_task.score(f"37+58=95;95+12=107;#107{EOS}", "107") == 1.0
  assert chain_task.score(f"anything;#107{EOS}", "107") == 1.0  # the steps are not graded
  assert chain_task.score("37+58=95;95+12=107;#107", "107") == 0.0  # no eos: cut off
  assert chain_task.score(f"37+58=95;95+12=107;#1070{EOS}", "107") == 0.0
  assert chain_task.score(f"37+58=95;95+12=107;{EOS}", "107") == 0.0  # no final answer
  assert chain_task.score(f"#99;#107{EOS}", "107") == 1.0  # the LAST '#'
  assert chain_task.score(f"#107{EOS}#5", "107") == 1.0  # text after eos never counts
  task = chain_task.make_task(8, 4, num_terms=3)
  tok = task.tokenizer
  right = [*tok.encode(chain_task.solution(chain_task.terms_of(task.train[0]))), tok.eos_id, 0, 0]
  wrong = [*tok.encode(chain_task.solution(chain_task.terms_of(task.train[0]), slip_step=1)), tok.eos_id]
  result = task.reward([right, wrong, right[:-3]], [task.train[0]] * 3)
  np.testing.assert_array_equal(result.rewards, [1.0, 0.0, 0.0])


def test_slipping_teacher_rate_and_consistency():
  problems = chain_task.make_problems(2000, "train", seed=0)
  tok = chain_task.CharTokenizer()
  demos = chain_task.sft_examples(problems, tok, slip_rate=0.3, seed=5)
  assert demos == chain_task.sft_examples(problems, tok, slip_rate=0.3, seed=5)
  correct = [chain_task.score(tok.decode(d.completion_tokens), p.answer) for d, p in zip(demos, problems)]
  assert abs(1 - np.mean(correct) - 0.3) < 0.03  # ~30% slipped
  for d, p in zip(demos, problems):
    text = tok.decode(d.completion_tokens)
    steps = text[:-len(EOS)].split("#")[0].rstrip(";").split(";")
    sums = [int(s.split("=")[1]) for s in steps]
    # every step's left operand is the previous step's result, and a slip is exactly +1 once
    assert all(s.split("+")[0] == str(prev) for s, prev in zip(steps[1:], sums))
    assert int(text[:-len(EOS)].split("#")[1]) - int(p.answer) in (0, 1)
  assert all(chain_task.sft_examples(problems[:50], tok, slip_rate=0.0)[i].completion_tokens[-1] == tok.eos_id
             for i in range(50))


def test_from_config_through_the_factory_import_path():
  cfg = dict(name="oapl_jax.tasks.chain_task:from_config", num_terms=3, num_train=32, num_held_out=8, seed=0,
             teacher_slip_rate=0.5)
  task = factory.build_task(cfg)
  assert task.name == "chain" and len(task.train) == 32 and len(task.eval_sets["held_out"]) == 8
  assert all(p.prompt.count("+") == 2 for p in task.train)
  assert len(task.demonstrations(0)) == 32
