"""oapl-prepare with no network: a tiny Qwen3 and GSM8K rows in a hub cache this test lays out (the real
snapshot_download path, HF_HUB_OFFLINE=1), local raw files through --source, an unreachable hub, and the
three README commands (prepare model, prepare data, train) run as typed, with HOME pointed here."""
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oapl_jax.apps import cli, prepare as prepare_app
from oapl_jax.prepare import data
from oapl_jax.tasks import code_task, sources
from oapl_jax.tasks.templates import ChatTokenizer
from tests.hf_fixtures import make_chat_tokenizer, make_hf_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K_TRAIN = [{"question": f"Tom has {a} apples and buys {a} more. How many now?",
                "answer": f"He has {a}+{a}=<<{a}+{a}={2 * a}>>{2 * a}.\n#### {2 * a}"} for a in range(1, 21)]
GSM8K_TEST = [{"question": f"What is {a} plus {a + 1}?", "answer": f"{a}+{a + 1}={2 * a + 1}\n#### {2 * a + 1}"}
              for a in range(1, 6)]


def _cached_repo(cache, kind: str, repo_id: str, revision: str = "0" * 39 + "1") -> str:
  """The hub cache's layout (kind--ORG--NAME/snapshots/REV, refs/main) for one repo; returns the snapshot dir."""
  root = os.path.join(cache, f"{kind}--{repo_id.replace('/', '--')}")
  os.makedirs(os.path.join(root, "refs"), exist_ok=True)
  with open(os.path.join(root, "refs", "main"), "w") as f:
    f.write(revision)
  return os.path.join(root, "snapshots", revision)


def _write_parquet(path, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  pq.write_table(pa.Table.from_pylist(rows), path)


def _write_jsonl(path, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def _read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
  """(cache dir, the tiny model's parameter count as torch counts it, its snapshot dir)."""
  cache = str(tmp_path_factory.mktemp("hub"))
  snapshot = _cached_repo(cache, "models", "tiny-org/TinyQwen3")
  torch_model = make_hf_checkpoint(snapshot, "qwen3", vocab_size=384)
  make_chat_tokenizer(snapshot)
  gsm8k = _cached_repo(cache, "datasets", "openai/gsm8k")
  _write_parquet(os.path.join(gsm8k, "main", "train-00000-of-00001.parquet"), GSM8K_TRAIN)
  _write_parquet(os.path.join(gsm8k, "main", "test-00000-of-00001.parquet"), GSM8K_TEST)
  return cache, sum(p.numel() for p in torch_model.parameters()), snapshot


def _run(args, cwd, **env):
  """The command in a fresh process (the hub reads its settings at import); env values of None unset."""
  full = dict(os.environ)
  for key, value in env.items():
    full.pop(key, None) if value is None else full.__setitem__(key, value)
  command = args if args[0] == "-c" else ["-m", *args]
  return subprocess.run([sys.executable, *command], cwd=cwd, env=full, capture_output=True, text=True,
                        timeout=600)


@pytest.fixture(scope="module")
def prepared_home(hub_cache, tmp_path_factory):
  """HOME after `oapl-prepare model` and `oapl-prepare data gsm8k`, both from the hub cache, as typed in the
  README (the ~ is ours to expand: no shell runs here)."""
  cache, _, _ = hub_cache
  home = str(tmp_path_factory.mktemp("home"))
  env = dict(HOME=home, HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1")
  model_run = _run(["oapl_jax.apps.prepare", "model", "tiny-org/TinyQwen3", "--out", "~/models/Qwen3-0.6B"],
                      home, **env)
  data_run = _run(["oapl_jax.apps.prepare", "data", "gsm8k", "--out", "~/data/gsm8k"], home, **env)
  return home, model_run, data_run


def test_model_from_the_hub_cache_is_placed_and_loaded(hub_cache, prepared_home):
  _, torch_params, snapshot = hub_cache
  home, run, _ = prepared_home
  assert run.returncode == 0, run.stderr
  out = os.path.join(home, "models", "Qwen3-0.6B")
  assert sorted(os.listdir(out)) == sorted(os.listdir(snapshot))
  for name in ("model.safetensors", "config.json", "tokenizer.json"):
    with open(os.path.join(out, name), "rb") as got, open(os.path.join(snapshot, name), "rb") as want:
      assert got.read() == want.read(), name
  last = run.stdout.strip().splitlines()[-1]
  assert last.startswith(f"{out}: qwen3, 2 layers, width 64, 4 heads (2 kv, head_dim 16), vocab 384")
  assert f"{torch_params:,} parameters" in last  # our loaded pytree counted against torch's own count
  assert "tokenizer: eos id" in last


def test_local_checkpoint_with_relative_paths(hub_cache, tmp_path, monkeypatch, capsys):
  _, torch_params, snapshot = hub_cache
  monkeypatch.chdir(tmp_path)
  os.symlink(snapshot, "ckpt")
  assert prepare_app.main(["model", "./ckpt", "--out", "models/mine"]) == 0
  assert sorted(os.listdir(tmp_path / "models" / "mine")) == sorted(os.listdir(snapshot))
  assert f"{tmp_path / 'models' / 'mine'}: qwen3" in capsys.readouterr().out
  assert prepare_app.main(["model", "models/mine"]) == 0  # no --out: verified in place
  assert f"{torch_params:,} parameters" in capsys.readouterr().out


def test_unknown_architecture_is_refused(tmp_path, capsys):
  (tmp_path / "gemma").mkdir()
  config = {"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}
  (tmp_path / "gemma" / "config.json").write_text(json.dumps(config))
  assert prepare_app.main(["model", str(tmp_path / "gemma"), "--out", str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "model_type='gemma'" in err[0] and "supported: ['llama', 'qwen2', 'qwen3']" in err[0], err
  assert not (tmp_path / "out").exists()


@pytest.fixture
def dropping_hub():
  """A hub address that accepts each connection and hangs up at once; yields (endpoint, connections counted)."""
  server = socket.create_server(("127.0.0.1", 0))
  connections = []
  def serve():
    while True:
      try:
        conn, _ = server.accept()
      except OSError:  # closed: the test is over
        return
      connections.append(1)
      conn.close()
  threading.Thread(target=serve, daemon=True).start()
  yield f"http://127.0.0.1:{server.getsockname()[1]}", connections
  server.close()


@pytest.mark.parametrize("args,repo", [(["model", "Qwen/Qwen3-0.6B"], "Qwen/Qwen3-0.6B"),
                                       (["data", "gsm8k"], "openai/gsm8k")])
def test_unreachable_hub_is_one_line_without_retries(args, repo, tmp_path, dropping_hub):
  endpoint, connections = dropping_hub
  run = _run(["oapl_jax.apps.prepare", *args, "--out", str(tmp_path / "out")], tmp_path,
                HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(tmp_path / "empty"), HF_HUB_OFFLINE=None)
  assert run.returncode == 2
  lines = run.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"error: cannot reach the Hugging Face Hub ({endpoint})")
  assert "HF_HUB_OFFLINE=1" in lines[0] and f"hf download {repo}" in lines[0]
  assert ("a local checkpoint directory" if args[0] == "model" else "--source PATH") in lines[0]
  assert 1 <= len(connections) <= 2, f"{len(connections)} connections: the hub client retried instead of failing"
  assert not (tmp_path / "out").exists()


# The command with time.sleep recorded: huggingface_hub's retries back off with it (1, 2, 4, 8, 8 s for a refused
# connection in hf_hub_download), so a run that slept did not fail at once.
_SLEEPS_RECORDED = """import atexit, json, os, runpy, sys, time
slept, real_sleep = [], time.sleep
time.sleep = lambda seconds: (slept.append(seconds), real_sleep(seconds))[1]
atexit.register(lambda: open(os.environ["SLEEPS_TO"], "w").write(json.dumps(slept)))
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("args", [["model", "Qwen/Qwen3-0.6B"], ["data", "gsm8k"]])
def test_refused_hub_fails_without_backing_off(args, tmp_path):
  sleeps = tmp_path / "sleeps.json"
  run = _run(["-c", _SLEEPS_RECORDED, "oapl_jax.apps.prepare", *args, "--out", str(tmp_path / "out")], tmp_path,
             HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(tmp_path / "empty"), HF_HUB_OFFLINE=None,
             SLEEPS_TO=str(sleeps))
  assert run.returncode == 2 and run.stderr.startswith("error: cannot reach the Hugging Face Hub"), run.stderr
  assert json.loads(sleeps.read_text()) == [], "the hub client backed off and retried instead of failing"


def test_gsm8k_from_the_hub_cache(prepared_home):
  home, _, run = prepared_home
  assert run.returncode == 0, run.stderr
  out = os.path.join(home, "data", "gsm8k")
  train, dev, test = (_read_jsonl(os.path.join(out, f"{s}.jsonl")) for s in ("train", "dev", "test"))
  assert test == GSM8K_TEST
  assert len(dev) == 2 and train == [r for r in GSM8K_TRAIN if r not in dev]  # a tenth of 20, the rest in order
  assert "carved from train (seed 0)" in run.stdout and "sample (train[0]):" in run.stdout
  # configs/gsm8k.py's reader: question/answer keys, the answer after '####'
  records = sources.load_jsonl(os.path.join(out, "test.jsonl"), "question", "answer")
  assert [r["answer"].split("####")[-1].strip() for r in records] == [str(2 * a + 1) for a in range(1, 6)]


def test_local_source_gives_what_the_hub_gives(prepared_home, tmp_path):
  """--source DIR laid out as the published repo reads the same files; the dev slice is fixed by its seed."""
  home, _, _ = prepared_home
  raw = tmp_path / "raw"
  _write_parquet(str(raw / "main" / "train-00000-of-00001.parquet"), GSM8K_TRAIN)
  _write_parquet(str(raw / "main" / "test-00000-of-00001.parquet"), GSM8K_TEST)
  written = data.prepare("gsm8k", str(tmp_path / "a"), sources=[str(raw)])
  assert [(w.split, w.count) for w in written] == [("train", 18), ("dev", 2), ("test", 5)]
  for split in ("train", "dev", "test"):
    assert _read_jsonl(tmp_path / "a" / f"{split}.jsonl") == _read_jsonl(os.path.join(home, "data", "gsm8k",
                                                                                      f"{split}.jsonl"))
  data.prepare("gsm8k", str(tmp_path / "b"), sources=[f"train={raw}/main/train-00000-of-00001.parquet"], seed=1)
  assert not (tmp_path / "b" / "test.jsonl").exists()
  assert _read_jsonl(tmp_path / "b" / "dev.jsonl") != _read_jsonl(tmp_path / "a" / "dev.jsonl")


def test_carve_dev_is_a_seeded_tenth_at_most():
  records = list(range(1000))
  train, dev = data.carve_dev(records, 500, seed=0)
  assert len(dev) == 100 and sorted(train + dev) == records and not set(train) & set(dev)
  assert train == sorted(train) and dev == sorted(dev)  # source order kept
  assert data.carve_dev(records, 500, seed=0) == (train, dev) and data.carve_dev(records, 500, seed=1)[1] != dev
  assert len(data.carve_dev(records, 30, seed=0)[1]) == 30
  assert data.carve_dev(records[:9], 500, seed=0) == (records[:9], [])


def test_math_and_deepscaler_records(tmp_path):
  """MATH's answer is its solution's last \\boxed{} (nested braces kept); MATH-500 and DeepScaleR carry one."""
  hendrycks = tmp_path / "hendrycks_math"
  _write_parquet(str(hendrycks / "algebra" / "train-00000-of-00001.parquet"), [
      {"problem": "Halve 1.", "level": "Level 1", "type": "Algebra", "solution": "So $\\boxed{\\frac{1}{2}}$."},
      {"problem": "No box.", "level": "Level 1", "type": "Algebra", "solution": "It is 3."}])
  _write_parquet(str(hendrycks / "geometry" / "train-00000-of-00001.parquet"), [
      {"problem": "Area?", "level": "Level 2", "type": "Geometry", "solution": "$\\boxed{2}$ then $\\boxed{4\\pi}$"}])
  _write_parquet(str(hendrycks / "algebra" / "test-00000-of-00001.parquet"), [
      {"problem": "Not train.", "level": "Level 1", "type": "Algebra", "solution": "$\\boxed{0}$"}])
  _write_jsonl(str(tmp_path / "MATH-500" / "test.jsonl"),
               [{"problem": "2+2?", "solution": "\\boxed{4}", "answer": "4", "subject": "Prealgebra", "level": 1}])
  written = data.prepare("math", str(tmp_path / "math"), sources=[f"train={hendrycks}",
                                                                  f"test={tmp_path / 'MATH-500' / 'test.jsonl'}"])
  assert _read_jsonl(tmp_path / "math" / "train.jsonl") == [{"problem": "Halve 1.", "answer": "\\frac{1}{2}"},
                                                            {"problem": "Area?", "answer": "4\\pi"}]
  assert _read_jsonl(tmp_path / "math" / "test.jsonl") == [{"problem": "2+2?", "answer": "4"}]
  assert "1 source rows skipped" in written[0].note

  (tmp_path / "deepscaler.json").write_text(json.dumps(
      [{"problem": f"p{i}", "answer": i * 17, "solution": "..."} for i in range(30)]))  # a JSON array, as published
  written = data.prepare("deepscaler", str(tmp_path / "ds"), sources=[str(tmp_path / "deepscaler.json")], dev_size=2)
  assert [(w.split, w.count) for w in written] == [("train", 28), ("dev", 2)]
  both = _read_jsonl(tmp_path / "ds" / "train.jsonl") + _read_jsonl(tmp_path / "ds" / "dev.jsonl")
  assert sorted(both, key=lambda r: int(r["problem"][1:])) == [{"problem": f"p{i}", "answer": str(i * 17)}
                                                               for i in range(30)]
  # configs/math.py's reader takes the files as written
  assert sources.load_jsonl(tmp_path / "ds" / "train.jsonl")[0]["answer"] == both[0]["answer"]


def test_livecodebench_files_join_into_what_code_task_reads(tmp_path):
  def problem(i, date):
    return {"question_id": str(i), "question_title": f"t{i}", "question_content": f"Print {i}.", "platform": "atcoder",
            "contest_date": f"{date}T00:00:00", "starter_code": "", "difficulty": "easy",
            "public_test_cases": json.dumps([{"input": "", "output": f"{i}\n", "testtype": "stdin"}]),
            "private_test_cases": "", "metadata": "{}", "contest_id": "abc1"}

  raw = tmp_path / "code_generation_lite"
  _write_jsonl(str(raw / "test.jsonl"), [problem(0, "2024-07-01"), problem(1, "2024-09-01")])
  _write_jsonl(str(raw / "test5.jsonl"), [problem(2, "2025-01-15"), problem(3, "2025-03-01")])
  written = data.prepare("livecodebench", str(tmp_path / "lcb"), sources=[str(raw)])
  assert [(w.split, w.count) for w in written] == [("test", 4)]
  rows = _read_jsonl(tmp_path / "lcb" / "test.jsonl")
  assert [r["question_id"] for r in rows] == ["0", "1", "2", "3"] and "contest_id" not in rows[0]
  tok_dir = tmp_path / "tok"
  make_chat_tokenizer(tok_dir)
  v5 = code_task.code_problems(ChatTokenizer(tok_dir), [str(tmp_path / "lcb" / "test.jsonl")], "question_content",
                               start="2024-08-01", end="2025-02-01")
  assert [p.prompt for p in v5] == ["Print 1.", "Print 2."]
  assert json.loads(json.loads(v5[0].answer)["public_test_cases"])[0]["output"] == "1\n"


@pytest.mark.slow
def test_readme_commands_train_two_steps(prepared_home):
  """`oapl-train --config configs/gsm8k.py:smoke` on what the two prepare commands wrote, at the config's own
  default paths (~/models/Qwen3-0.6B, ~/data/gsm8k): one window of two trainer steps."""
  home, model_run, data_run = prepared_home
  assert model_run.returncode == 0 and data_run.returncode == 0
  run = _run(["oapl_jax.apps.train", "--config", os.path.join(REPO, "configs", "gsm8k.py:smoke"),
                 "--workdir", "runs/gsm8k", "--config.eval.num_prompts=2"], home, HOME=home)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "trainer_steps: 2" in run.stdout and "eval/gsm8k_test/pass@1 (end)" in run.stdout
  with open(os.path.join(home, "runs", "gsm8k", "metrics.jsonl")) as f:
    losses = [json.loads(line)["train/loss"] for line in f if "train/loss" in line]
  assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


@pytest.mark.parametrize("name, content", [
    ("train.parquet", "truncated"), ("train.parquet", b"not parquet at all\n" * 20),
    ("train.jsonl", b'{"question": "1+1", "answer": "#### 2"}\n{"question": "\xff\xfe", "answer": "#### 3"}\n')])
def test_a_bad_source_file_is_one_line_naming_it(tmp_path, capsys, name, content):
  """Issue 54.6: a truncated or foreign Parquet file and a JSONL with bytes that are not UTF-8 are refused by
  `oapl-prepare data` in one line naming the file (exit 2), no traceback, nothing written."""
  path = tmp_path / name
  if content == "truncated":
    _write_parquet(str(path), GSM8K_TRAIN)
    path.write_bytes(path.read_bytes()[:-40])  # the footer cut off
  else:
    path.write_bytes(content)
  with pytest.raises(SystemExit) as exit_info:
    cli.run(prepare_app.main, ["data", "gsm8k", "--source", f"train={path}", "--out", str(tmp_path / "out")])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "Traceback" not in err
  assert re.match(rf"error: {re.escape(str(path))}( line 2)?: not ", err) and len(err.strip().splitlines()) == 1, err
  assert not (tmp_path / "out" / "train.jsonl").exists()


def test_a_missing_test_split_is_a_warning_naming_the_flag(tmp_path, capsys):
  """Issue 55.2: one local file fills train (and dev) only; the configs evaluate on test.jsonl, so prepare says
  which split is missing and the --source that gives it."""
  path = tmp_path / "train.parquet"
  _write_parquet(str(path), GSM8K_TRAIN)
  assert prepare_app.main(["data", "gsm8k", "--source", str(path), "--out", str(tmp_path / "out")]) == 0
  err = capsys.readouterr().err
  assert f"warning: no test split written: the configs read {tmp_path / 'out'}/test.jsonl" in err
  assert "--source test=PATH" in err
  assert prepare_app.main(["data", "gsm8k", "--source", f"train={path}", "--source", f"test={path}",
                           "--out", str(tmp_path / "both")]) == 0
  assert "warning" not in capsys.readouterr().err
