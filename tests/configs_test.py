"""Every config in configs/ builds, carries the paper's settings, and its smoke variant runs a step."""
import glob
import importlib
import json
import os

import numpy as np
import pytest

from oapl_jax import sections
from oapl_jax.run import assemble, check
from oapl_jax.tasks import problem_checks
from oapl_jax.rl import loop
from tests.hf_fixtures import make_chat_tokenizer, make_hf_checkpoint

CONFIGS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(os.path.dirname(__file__), "..", "configs", "*.py"))
                 if not os.path.basename(p).startswith("_"))


def test_all_configs_are_covered():
  assert set(CONFIGS) >= {"arithmetic", "math", "gsm8k"}


@pytest.mark.parametrize("name", CONFIGS)
def test_config_builds(name):
  module = importlib.import_module(f"configs.{name}")
  for arg in ("", "smoke"):
    c = module.get_config(arg)
    assert c.loop.batch_prompts <= c.loop.prompts_per_rollout
    assert c.trainer.loss in ("oapl", "grpo")
  with pytest.raises(ValueError, match="unknown variant"):
    module.get_config("no-such-variant")


def test_math_config_is_the_papers_setting():
  c = importlib.import_module("configs.math").get_config()
  assert (c.trainer.loss_settings.oapl.beta1, c.trainer.loss_settings.oapl.beta2) == (1.0, 1e-3)
  assert (c.loop.sync_every, c.loop.group_size, c.loop.prompts_per_rollout, c.loop.steps_per_rollout) == (50, 8, 128, 2)
  assert (c.trainer.optim.lr, c.trainer.optim.b1, c.trainer.optim.b2) == (1e-6, 0.9, 0.95)
  assert (c.sampler.temperature, c.sampler.top_p, c.sampler.max_new_tokens) == (1.0, 1.0, 16384)
  assert (c.eval.temperature, c.eval.top_p, c.eval.samples, tuple(c.eval.ks)) == (0.6, 0.95, 10, (1, 5, 10))
  assert set(c.task.eval_paths) == {"aime25", "hmmt25_feb", "hmmt25_nov", "brumo25"}
  assert "Qwen3-4B-Thinking-2507" in c.model.checkpoint


def test_missing_paths_name_the_config_field(tmp_path):
  c = importlib.import_module("configs.math").get_config("smoke")
  c.model.checkpoint = str(tmp_path / "nope")
  with pytest.raises(sections.ConfigError, match="model.checkpoint=.*nope': not a directory") as raised:
    assemble.setup(c, str(tmp_path / "run"))  # every missing path at once, before anything is built
  assert any(p.startswith("task.tokenizer_dir=") for p in raised.value.problems)


def test_batch_that_does_not_divide_over_the_mesh_is_refused(tmp_path):
  c = importlib.import_module("configs.arithmetic").get_config("smoke")
  c.loop.update(batch_prompts=2, prompts_per_rollout=2, group_size=3)  # 6 sequences for 8 devices
  with pytest.raises(ValueError, match=r"batch_prompts=2\b.* 6 sequences .* over the 8 devices"):
    assemble.setup(c, str(tmp_path))


@pytest.mark.slow  # a whole command; fast: golden_step_test (one online step), trainer_test's GRPO step by hand
def test_grpo_baseline_smoke_runs_a_step(tmp_path):
  """configs/arithmetic.py:smoke with the GRPO loss; OAPL runs end to end in loop_test, the notebook's
  test and the multi-process tests."""
  c = importlib.import_module("configs.arithmetic").get_config("grpo,smoke")
  assert c.trainer.loss == "grpo"
  summary = loop.train(assemble.setup(c, str(tmp_path)))
  assert summary["trainer_steps"] == 2 and summary["syncs"] == 1
  with open(tmp_path / "metrics.jsonl") as f:
    history = [json.loads(line) for line in f]
  clip = [h["train/clip_fraction"] for h in history if "train/clip_fraction" in h]
  assert len(clip) == 2 and all(0.0 <= x <= 1.0 for x in clip)  # GRPO's own metrics, from the GRPO loss


@pytest.fixture(scope="module")
def chat_assets(tmp_path_factory):
  root = tmp_path_factory.mktemp("chat")
  model_dir = root / "model"
  make_hf_checkpoint(model_dir, "qwen3", vocab_size=384)
  make_chat_tokenizer(model_dir)
  records = [{"problem": f"What is {a}+{a}?", "answer": str(2 * a), "question": f"What is {a}+{a}?",
              "answer_gsm": f"{a}+{a}={2 * a}\n#### {2 * a}"} for a in range(1, 9)]
  data = root / "data.jsonl"
  with open(data, "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  return str(model_dir), str(data)


@pytest.mark.slow  # whole commands; fast: tasks_templates_test (the chat template), test_config_builds
@pytest.mark.parametrize("name", ["math", "gsm8k"])
def test_chat_smoke_runs_a_step(name, chat_assets, tmp_path):
  model_dir, data = chat_assets
  c = importlib.import_module(f"configs.{name}").get_config("smoke")
  c.model.checkpoint = model_dir
  c.task.update(tokenizer_dir=model_dir, train_path=data)
  c.task.eval_paths = {"test": data}  # replace the paper's eval sets (update() would merge)
  if name == "gsm8k":
    c.task.answer_key = "answer_gsm"  # "... #### 4": the answer after '####' is what is scored
  run = assemble.setup(c, str(tmp_path))
  assert run.task.train[0].answer == "2"
  summary = loop.train(run)
  assert summary["trainer_steps"] == 2 and "eval/test/pass@1 (end)" in summary


@pytest.mark.slow  # a whole command; fast: sampler_core_test's refresh across meshes, parallel_test's placement
def test_separate_sampler_and_trainer_meshes(tmp_path):
  """mesh.sampler_devices: the sampler gets the last 4 of the 8 devices, the trainer FSDP over the first 4."""
  c = importlib.import_module("configs.arithmetic").get_config("smoke")
  c.mesh.sampler_devices = 4
  c.loop.update(batch_prompts=4, prompts_per_rollout=4)  # the trainer splits the batch over its 4 devices
  run = assemble.setup(c, str(tmp_path))
  trainer_devices = {d.id for d in run.state.params["embed"]["embedding"].sharding.device_set}
  sampler_devices = set(run.sampler.mesh.device_ids.flat)
  assert trainer_devices == {0, 1, 2, 3} and sampler_devices == {4, 5, 6, 7}
  summary = loop.train(run)
  assert summary["trainer_steps"] == 2
  assert {d.id for d in run.sampler.params["embed"]["embedding"].sharding.device_set} == {4, 5, 6, 7}


def test_every_preset_builds():
  from oapl_jax.models import families
  for name in families.PRESETS:
    assert families.preset(name).num_layers >= 1, name
  assert families.preset("deepseek_r1_distill_qwen_14b").max_position_embeddings == 131072


@pytest.mark.parametrize("directory,preset", [
    ("Qwen3-4B-Thinking-2507", "qwen3_4b_thinking_2507"), ("Qwen2.5-7B", "qwen2p5_7b"), ("Qwen3-0.6B", "qwen3_0p6b"),
    ("Llama-3.2-1B", "llama3_2_1b"), ("Llama-3.1-8B", "llama3_1_8b"), ("Qwen3-0.6B-Base", None)])
def test_an_absent_checkpoint_is_read_as_the_preset_its_name_names(directory, preset):
  """Compiling for a pod from a laptop: the hub name of a checkpoint not on this host picks the preset
  (case, '-', '_' and '.' aside); a name no preset has is refused naming the flag to set."""
  from oapl_jax.models import factory, families
  spec = factory.ModelSpec(checkpoint=f"/nowhere/{directory}")
  if preset is None:
    with pytest.raises(ValueError, match="matches no preset.*--config.model.preset=NAME"):
      factory.architecture(spec, preset_when_absent=True)
  else:
    assert factory.architecture(spec, preset_when_absent=True) == families.preset(preset)


def _check_study_variant(arg, task, tests, rc, demos):
  """A study variant's demonstrations fit the sampler and eval budgets (a truncated answer scores 0), its prompts
  the prefill, its tokenizer the model; validation, test and train are disjoint; the full size has the study's
  split and run shape."""
  from configs import claims
  assert max(len(d.completion_tokens) for d in demos) <= rc.sampler.max_new_tokens == rc.eval.max_new_tokens
  prompts = [p.prompt_tokens for p in [*task.train, *task.eval_sets["val"], *tests["test"]]]
  assert max(map(len, prompts)) <= rc.sampler.max_prefill_length
  assert rc.sampler.max_prefill_length + rc.sampler.max_new_tokens <= rc.model.overrides["max_position_embeddings"]
  assert task.tokenizer.vocab_size <= rc.model.overrides["vocab_size"]
  val, test = task.eval_sets["val"], tests["test"]
  assert not {p.prompt for p in val} & {p.prompt for p in test}
  assert not {p.prompt for p in task.train} & {p.prompt for p in [*val, *test]}
  if "smoke" not in arg:
    assert (len(val), len(test)) == (128, 256)
    arithmetic = claims.get_config("arithmetic")  # the study's shape: B x G, S and L as the other variants
    for key in ("batch_prompts", "group_size", "sync_every", "num_syncs", "steps_per_rollout"):
      assert rc.loop.__getattribute__(key) == arithmetic.loop[key], key


@pytest.mark.parametrize("arg", ["code", "code,smoke"])
def test_claims_code_variant_fits_its_longest_program_and_grades_in_the_sandbox(arg):
  """configs/claims.py:code: the teacher's programs fit the budgets, slip at the configured rate, the tokenizer fits
  the model, the splits are disjoint, and the sandboxed reward grades a right and a slipped program (cached)."""
  from configs import claims
  from experiments import task_config
  from oapl_jax.run import schema
  from oapl_jax.tasks import code_task
  assert task_config.preflight(f"configs/claims.py:{arg}", {}) == []
  rc = schema.from_config(claims.get_config(arg))
  check.check(rc)
  task, tests = task_config.task_and_tests(rc.task)
  demos = task.demonstrations(rc.seed)
  decoded = [task.tokenizer.decode(d.completion_tokens) for d in demos]
  right = [code_task.teacher_program(p.prompt, slip=False) + code_task.EOS for p in task.train]
  wrong = [text != right[i % len(task.train)] for i, text in enumerate(decoded)]
  assert len(demos) == claims.CODE_COPIES * len(task.train)
  assert abs(sum(wrong) / len(wrong) - claims.CODE_SLIP_RATE) < 0.1
  _check_study_variant(arg, task, tests, rc, demos)
  problem = task.eval_sets["val"][0]
  graded = [code_task.teacher_program(problem.prompt, slip) + code_task.EOS for slip in (False, True)]
  for _ in range(2):  # the second call is answered by the cache, with the same rewards
    np.testing.assert_array_equal(task.reward_fn(graded, [problem.answer] * 2).rewards, [1, 0])
  task.close()


@pytest.mark.parametrize("arg", ["chain", "chain,smoke"])
def test_claims_chain_variant_fits_its_longest_demonstration(arg):
  """configs/claims.py:chain builds (the study's own preflight), its answers fit the sampler and eval budgets (a
  truncated answer scores 0), its tokenizer fits the model, and its split and run shape are the study's."""
  from configs import claims
  from experiments import task_config
  from oapl_jax.run import schema
  from oapl_jax.tasks import chain_task
  assert task_config.preflight(f"configs/claims.py:{arg}", {}) == []
  rc = schema.from_config(claims.get_config(arg))
  check.check(rc)
  task, tests = task_config.task_and_tests(rc.task)
  demos = task.demonstrations(rc.seed)
  wrong = [chain_task.score(task.tokenizer.decode(d.completion_tokens), p.answer) == 0 for d, p in zip(demos, task.train)]
  assert abs(sum(wrong) / len(wrong) - claims.CHAIN_SLIP_RATE) < 0.1  # the imperfect teacher: that share slips
  budget = chain_task.max_completion_len(claims.CHAIN_TERMS, claims.CHAIN_DIGITS)
  assert budget == rc.sampler.max_new_tokens
  _check_study_variant(arg, task, tests, rc, demos)
  task.close()
