"""Own tasks from config alone (tasks/records_task.py): a reward by import path that sees the whole record,
named eval sets from JSONL and Parquet, a warm start from a demonstrations file, and clear errors."""
import json
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oapl_jax import sections
from oapl_jax.run import config_base
from oapl_jax.run import assemble, check, schema
from oapl_jax.tasks import base, factory, records_task, rewards, sources
from oapl_jax.tasks.char_tokenizer import EOS

ROWS = [{"prompt": "rev:abc=", "word": "abc", "meta": {"level": 1}},
        {"prompt": "rev:hello=", "word": "hello", "meta": {"level": 2}}]


@pytest.fixture
def data(tmp_path, monkeypatch):
  """Train/eval JSONL and Parquet files, a demonstrations file, and a user reward module on sys.path."""
  (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
  pq.write_table(pa.Table.from_pylist([{"prompt": "rev:xy=", "word": "xy"}]), tmp_path / "eval.parquet")
  (tmp_path / "demos.jsonl").write_text(json.dumps({"prompt": "rev:abc=", "completion": "cba"}) + "\n")
  (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
      import json, os
      def score(record, response):  # runs in a worker process: what it saw goes to seen.jsonl beside it
        with open(os.path.join(os.path.dirname(__file__), "seen.jsonl"), "a") as f:
          f.write(json.dumps([record, response]) + "\\n")
        return float(response == record["word"][::-1])
      """))
  monkeypatch.syspath_prepend(str(tmp_path))
  return tmp_path


def _config(data, **overrides):
  c = config_base.records_task(train_path=str(data / "train.jsonl"), reward="my_rewards:score",
                               eval_paths={"dev": str(data / "train.jsonl"), "pq": str(data / "eval.parquet")},
                               demonstrations_path=str(data / "demos.jsonl"))
  c.update(overrides)
  return c


def _completions(task, texts):
  """Token ids of `texts`; a text ending in <eos> gets the eos id, as the sampler emits it."""
  out = []
  for text in texts:
    head, eos, _ = text.partition(EOS)
    out.append(task.tokenizer.encode(head) + ([task.tokenizer.eos_id] if eos else []))
  return out


def _seen(data) -> list:
  path = data / "seen.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_reward_by_import_path_sees_the_whole_record_and_the_response_without_eos(data):
  task = factory.build_task(_config(data))
  try:
    result = task.reward(_completions(task, ["cba<eos>", "olleh<eos>", "abc<eos>"]),
                         [task.train[0], task.train[1], task.train[0]])
  finally:
    task.close()
  assert result.rewards.tolist() == [1.0, 1.0, 0.0]
  # every field of the JSONL line, nested ones too (the workers score in any order)
  assert sorted(_seen(data), key=json.dumps) == sorted([[ROWS[0], "cba"], [ROWS[1], "olleh"], [ROWS[0], "abc"]],
                                                       key=json.dumps)


def test_a_response_cut_at_the_budget_scores_unfinished_reward_and_is_not_scored(data):
  task = factory.build_task(_config(data, unfinished_reward=-0.5))
  try:
    result = task.reward(_completions(task, ["cba", "cba<eos>"]), [task.train[0], task.train[0]])
  finally:
    task.close()
  assert result.rewards.tolist() == [-0.5, 1.0]
  assert _seen(data) == [[ROWS[0], "cba"]]


def test_named_eval_sets_from_jsonl_and_parquet(data):
  task = factory.build_task(_config(data))
  assert sorted(task.eval_sets) == ["dev", "pq"]
  assert [p.prompt for p in task.eval_sets["dev"]] == ["rev:abc=", "rev:hello="]
  assert [p.prompt for p in task.eval_sets["pq"]] == ["rev:xy="]
  assert json.loads(task.eval_sets["pq"][0].answer) == {"prompt": "rev:xy=", "word": "xy"}
  tok = records_task.PrintableTokenizer()
  assert task.eval_sets["pq"][0].prompt_tokens == (tok.bos_id, *tok.encode("rev:xy="))


def test_warm_start_demonstrations_from_a_file(data):
  task = factory.build_task(_config(data))
  tok = task.tokenizer
  [demo] = task.demonstrations(0)
  assert demo.prompt_tokens == (tok.bos_id, *tok.encode("rev:abc="))
  assert demo.completion_tokens == (*tok.encode("cba"), tok.eos_id)
  assert tok.decode(demo.completion_tokens) == "cba" + EOS
  assert factory.build_task(_config(data, demonstrations_path="")).demonstrations is None


def test_a_named_reward_compares_the_answer_field(tmp_path):
  (tmp_path / "t.jsonl").write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
  c = config_base.records_task(train_path=str(tmp_path / "t.jsonl"), eval_paths={})
  task = factory.build_task(c)
  assert task.train[0].answer == "2"
  result = task.reward(_completions(task, ["2<eos>", "3<eos>", "2"]), [task.train[0]] * 3)
  assert result.rewards.tolist() == [1.0, 0.0, 0.0]


def test_a_character_outside_the_vocabulary_names_the_file_and_record(tmp_path):
  (tmp_path / "t.jsonl").write_text(json.dumps({"prompt": "ok=", "answer": "1"}) + "\n"
                                    + json.dumps({"prompt": "caf\u00e9=", "answer": "1"}) + "\n")
  with pytest.raises(sources.DataError, match=r"t\.jsonl record 2: character 'é'"):  # records count from 1
    factory.build_task(config_base.records_task(train_path=str(tmp_path / "t.jsonl"), eval_paths={}))


@pytest.mark.parametrize("reward, why", [("no_such_pkg_xyz.mod:score", "cannot import"),
                                         ("my_rewards:nope", "has no function 'nope'"),
                                         ("exact_matc", "must be one of")])
def test_a_bad_reward_is_a_config_error_before_compute(data, reward, why):
  from configs import own_task  # pylint: disable=import-outside-toplevel
  cfg = own_task.get_config()
  cfg.task = _config(data, reward=reward)
  with pytest.raises(sections.ConfigError, match=why):
    check.validate(cfg)


def test_a_warm_start_without_demonstrations_is_a_config_error(data):
  from configs import own_task  # pylint: disable=import-outside-toplevel
  cfg = own_task.get_config()
  cfg.task = _config(data, demonstrations_path="")
  with pytest.raises(sections.ConfigError, match="warmstart.steps=600: a warm start needs task.demonstrations_path"):
    check.validate(cfg)


def test_the_readme_own_task_example_builds_and_its_teacher_is_imperfect():
  """configs/own_task.py: a demonstration scores 1 under the task's own reward iff the teacher did not slip."""
  from configs import own_task  # pylint: disable=import-outside-toplevel
  cfg = own_task.get_config()
  assert check.validate(cfg) == []
  task = factory.build_task(cfg.task)
  assert (len(task.train), len(task.eval_sets["dev"]), len(task.eval_sets["test"])) == (2000, 200, 200)
  prompts = {p.prompt_tokens: p for p in task.train}
  demos = task.demonstrations(0)
  scored = task.reward([d.completion_tokens for d in demos], [prompts[d.prompt_tokens] for d in demos]).rewards
  letters = [json.loads(prompts[d.prompt_tokens].answer)["letters"] for d in demos]
  correct = [task.tokenizer.decode(d.completion_tokens) == "".join(sorted(w)) + EOS for d, w in zip(demos, letters)]
  assert scored.tolist() == [float(c) for c in correct]
  assert 0.3 < 1 - sum(correct) / len(correct) < 0.7  # the teacher slips on about 60% of them (minus ties)
  dev = {p.prompt for p in task.eval_sets["dev"]}
  assert not dev & {p.prompt for p in task.train}


def test_finished_only_passes_failures_and_timeouts_through():
  inner = lambda c, a: rewards.RewardResult(rewards.np.array([0.5] * len(c), rewards.np.float32), 1, 1)  # noqa: E731
  result = rewards.FinishedOnly(inner, EOS, unfinished_reward=0.0)(["x<eos>", "y"], ["a", "b"])
  assert result.rewards.tolist() == [0.5, 0.0]
  assert (result.num_failed, result.num_timeout) == (1, 1)


def test_the_readme_own_task_block_is_configs_own_task():
  import pathlib  # pylint: disable=import-outside-toplevel
  import re  # pylint: disable=import-outside-toplevel
  from configs import own_task  # pylint: disable=import-outside-toplevel
  readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
  [block] = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "records_task" in b]
  assert len(block.strip().splitlines()) < 20
  namespace: dict = {}
  exec(block, namespace)  # pylint: disable=exec-used
  assert namespace["get_config"]().to_dict() == own_task.get_config().to_dict()


def test_a_reward_that_raises_is_found_before_compute_with_one_traceback(data, caplog):
  """Issue 27.6: the reward is called once on a probe (a demonstration) when the task is built, before any
  model; the error carries the first traceback, once."""
  from configs import own_task  # pylint: disable=import-outside-toplevel
  (data / "broken_rewards.py").write_text("def score(record, response):\n  return record['no_such_field']\n")
  cfg = own_task.get_config("smoke")
  cfg.task = _config(data, reward="broken_rewards:score")
  cfg.warmstart.batch_size = 1  # the fixture has one demonstration
  with pytest.raises(base.RewardError) as info:
    assemble.build_task(schema.from_config(cfg))
  message = str(info.value)
  assert "the reward failed on a probe before training" in message and "response 'cba<eos>'" in message
  assert message.count("Traceback (most recent call last)") == 1 and "KeyError: 'no_such_field'" in message


def test_an_item_reward_logs_one_traceback_however_many_items_fail(caplog):
  reward = rewards.ItemReward(lambda c, a: 1 / 0)
  with caplog.at_level("WARNING"):
    result = reward(["x"] * 5, ["y"] * 5)
  assert result.num_failed == 5 and len(caplog.records) == 5
  assert sum(bool(r.exc_info) for r in caplog.records) == 1  # the first, with its traceback
  assert all("ZeroDivisionError" in r.getMessage() for r in caplog.records)


def test_a_bad_first_record_is_record_1_as_its_line_is_line_1(data):
  """Issue 27.4: record numbers count from 1, like line numbers, wherever a bad record is named."""
  from configs import own_task  # pylint: disable=import-outside-toplevel
  path = data / "t.jsonl"
  path.write_text(json.dumps({"prompt": "caf\u00e9=", "word": "x"}) + "\n" + json.dumps(ROWS[0]) + "\n")
  with pytest.raises(sources.DataError, match=r"t\.jsonl record 1: character 'é'"):
    factory.build_task(_config(data, train_path=str(path)))
  demos = data / "d.jsonl"
  demos.write_text(json.dumps({"prompt": "rev:ab=", "completion": "b\u00e1"}) + "\n")
  with pytest.raises(sources.DataError, match=r"d\.jsonl record 1: character 'á'"):
    factory.build_task(_config(data, demonstrations_path=str(demos)))
  path.write_text(json.dumps({"prompt": "rev:ab="}) + "\n" + json.dumps(ROWS[0]) + "\n")
  with pytest.raises(sources.DataError, match=r"t\.jsonl line 1: missing key 'word'"):
    factory.build_task(_config(data, train_path=str(path), reward="exact_match", answer_key="word"))
  path.write_text(json.dumps({"prompt": "rev:" + "a" * 40 + "=", "word": "a"}) + "\n" + json.dumps(ROWS[0]) + "\n")
  cfg = own_task.get_config("smoke")
  cfg.task = _config(data, train_path=str(path))
  cfg.sampler.max_prefill_length = 20
  with pytest.raises(sources.DataError, match=r"t\.jsonl record 1 \(\d+ tokens\)"):  # the run's prompt checks
    assemble.build_task(schema.from_config(cfg))
