"""The command-line apps on a run directory given as a user types it: relative, or with ~ (issue 27.2),
and oapl-serve at float32 on a run's (host numpy) params (issue 27.4). A healthy checkpoint is never
called damaged, and every app reads the same params the run saved. The installed commands on the README's
own task, from the repo root (issue 41)."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import transformers

from configs import arithmetic as arithmetic_config
from oapl_jax import checkpoint_files, checkpoints, parallel, run_dir
from oapl_jax.apps import checkpoints as checkpoints_app
from oapl_jax.apps import eval as eval_app
from oapl_jax.apps import export as export_app
from oapl_jax.apps import serve as serve_app
from oapl_jax.models import hf
from oapl_jax.rl import trainer
from oapl_jax.run import assemble, schema
from oapl_jax.sampler.engine import InvalidRequest
from oapl_jax.tasks import arithmetic, records_task


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
  """A run directory as loop.train leaves it: config.json and one checkpoint (step 2) of seeded params."""
  root = tmp_path_factory.mktemp("apps")
  cfg = arithmetic_config.get_config("smoke")
  cfg.eval.update(num_prompts=2, samples=2, ks=(1, 2))
  rc = schema.from_config(cfg)
  layout = parallel.Layout.single_device()
  model, params = assemble.build_model(rc, layout)
  state = trainer.create_train_state(trainer.TrainConfig(), model, params, layout)
  ckpt = checkpoints.Checkpointer(str(root / "run" / "checkpoints"))
  ckpt.save(2, state, checkpoint_files.Meta(1, 1, 8, rc.seed))
  ckpt.close()
  run_dir.record_config(str(root / "run"), cfg)
  return root, jax.device_get(state.params)


@pytest.fixture(params=["relative", "home"])
def run_path(request, saved_run, monkeypatch):
  """The run directory spelled 'run' (from its parent) or '~/run' (HOME is its parent)."""
  root, _ = saved_run
  if request.param == "relative":
    monkeypatch.chdir(root)
    return "run"
  monkeypatch.setenv("HOME", str(root))
  monkeypatch.chdir("/")
  return "~/run"


def test_checkpoint_listing_calls_a_healthy_step_healthy(run_path, capsys):
  assert checkpoints_app.main(["list", run_path, "--deep"]) == 0
  out = capsys.readouterr().out
  assert "DAMAGED" not in out and "absolute" not in out
  assert out.splitlines()[3].split()[0] == "2"  # the one step, after the title, the header and its rule


def test_export_writes_the_saved_params(run_path, saved_run, tmp_path):
  _, params = saved_run
  assert export_app.main([run_path, str(tmp_path / "hf")]) == 0
  info = json.load(open(tmp_path / "hf" / "export_info.json"))
  assert info["step"] == 2 and os.path.isabs(info["run_dir"])
  _, loaded = hf.load(str(tmp_path / "hf"))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded), params)


def test_eval_reports_beside_the_run(run_path, saved_run):
  root, _ = saved_run
  assert eval_app.main([run_path, "--samples", "2", "--ks", "1,2"]) == 0
  report = json.load(open(root / "run" / "eval" / "step_2" / "eval.json"))
  assert report["step"] == 2 and report["sets"]["held_out"]["prompts"] == 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_serve_builds_an_engine_on_the_saved_params(run_path, saved_run, dtype):
  _, params = saved_run
  engine = serve_app.build_engine(*serve_app.parse([
      "--checkpoint", run_path, "--dtype", dtype, "--slots", "2", "--max_prefill_length", "16",
      "--max_decode_length", "4"]))
  snapshot = engine.load_params()
  want = engine.sampler.prepare(jax.device_put(params))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(snapshot), jax.device_get(want))
  assert all(x.dtype == np.dtype(dtype) for x in jax.tree.leaves(snapshot))
  # Text is encoded as the run's prompts were: <bos>, then the arithmetic characters.
  assert engine.check_prompt_text("12+34=") == [1, *arithmetic.CharTokenizer().encode("12+34=")]
  with pytest.raises(InvalidRequest, match="cannot be encoded .*UNK"):
    engine.check_prompt_text("what is 1+1?")


def test_serve_without_its_extra_says_which_to_install_in_one_line():
  """JetStream is the `serve` extra (it brings TensorFlow): oapl-serve without it is one line and exit 2."""
  hide = "import sys, runpy; sys.modules['jetstream'] = None; sys.argv = ['oapl-serve', '--help']; " \
         "runpy.run_module('oapl_jax.apps.serve', run_name='__main__')"
  out = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 2 and out.stdout == ""
  assert out.stderr.strip().splitlines() == ["error: oapl-serve needs JetStream, the package's `serve` extra (it "
                                             "brings TensorFlow, ~2 GB): pip install -e '.[serve]'"]


@pytest.mark.slow
def test_installed_commands_on_the_readmes_own_task_from_the_repo_root(tmp_path):
  """oapl-train, oapl-eval and oapl-export by their installed names (sys.path[0] is their bin/, not the
  repo) on configs/own_task.py, whose reward is the import path examples.sort_letters.reward:score."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  bin_dir, run, out = os.path.dirname(sys.executable), str(tmp_path / "own"), str(tmp_path / "own_hf")
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL")}

  def command(name, *args, cwd=repo):
    done = subprocess.run([os.path.join(bin_dir, name), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr

  trained = command("oapl-train", "--config", "configs/own_task.py:smoke", "--workdir", run,
                    "--config.warmstart.steps=2", "--config.eval.num_prompts=4", "--config.sampler.num_slots=16")
  assert "window 1/1 | step 2/2" in trained and "=== OAPL run finished ===" in trained
  for noise in ("\r", "port.cc", "cudart_stub", "InitializeLog", "cuInit"):  # a piped console: plain lines only
    assert noise not in trained, noise
  evaluated = command("oapl-eval", run, "--samples", "2", "--ks", "1,2", "--num_prompts", "4")
  assert "dev (4 prompts x 2 samples): pass@1=" in evaluated and "test (4 prompts x 2 samples)" in evaluated
  # From another directory, where neither the reward nor the data could be found: export reads neither.
  exported = command("oapl-export", run, out, cwd=str(tmp_path))
  assert "exported step 2 (1 sync windows)" in exported

  with open(os.path.join(repo, "examples/sort_letters/dev.jsonl")) as f:
    prompt = json.loads(f.readline())["prompt"]
  tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
  assert tokenizer(prompt).input_ids == [1, *records_task.PrintableTokenizer().encode(prompt)]
