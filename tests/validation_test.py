"""Tests for the checks before compute (run/check.py, tasks/problem_checks.py): every config rule with its message,
problem sets, the shipped configs."""
import copy
import json
import logging
import math

import pytest

from configs import arithmetic, gsm8k, math as math_config
from oapl_jax import sections
from oapl_jax.run import check, schema
from oapl_jax.tasks import problem_checks
from oapl_jax.models import hf
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.tasks import arithmetic as arithmetic_task, factory, sources
from oapl_jax.tasks.base import Problem
from oapl_jax.sections import ConfigError
from oapl_jax.tasks.sources import DataError


def _set(cfg: dict, path: str, value) -> None:
  *parents, last = path.split(".")
  for part in parents:
    cfg = cfg[part]
  if value is _DELETE:
    del cfg[last]
  else:
    cfg[last] = value


_DELETE = object()


def config_with(changes: dict, variant: str = "") -> dict:
  """The arithmetic config as plain dicts (so any value of any type can be set), with `changes`."""
  cfg = copy.deepcopy(arithmetic.get_config(variant).to_dict())
  for path, value in changes.items():
    _set(cfg, path, value)
  return cfg


def problems_of(changes: dict, variant: str = "") -> list[str]:
  with pytest.raises(ConfigError) as info:
    check.validate(config_with(changes, variant))
  assert str(info.value).startswith(f"{len(info.value.problems)} problem(s) in the config:")
  return info.value.problems


@pytest.mark.parametrize("variant", ["", "smoke", "grpo", "grpo,smoke"])
def test_shipped_arithmetic_configs_pass(variant):
  assert check.validate(arithmetic.get_config(variant)) == []  # the ConfigDict itself
  assert check.validate(config_with({}, variant)) == []  # and as plain dicts


# (changed field, value, the one message expected). The arithmetic config on 8 devices: B=16 prompts,
# P=32 per rollout, G=8, eval samples 4 with ks (1, 4), mesh (1, -1, 1), tiny model vocab 32 / hidden 128.
RULES = [
    ("loop.sync_every", -1, "loop.sync_every=-1: must be >= 1"),
    ("loop.sync_every", 2.5, "loop.sync_every=2.5: must be an integer >= 1"),
    ("loop.sync_every", None, "loop.sync_every=None: must be an integer >= 1"),
    ("loop.sync_every", True, "loop.sync_every=True: must be an integer >= 1"),
    ("loop.steps_per_rollout", 0, "loop.steps_per_rollout=0: must be >= 1"),
    ("loop.num_syncs", 0, "loop.num_syncs=0: must be >= 1"),
    ("loop.eval_every_syncs", 0, "loop.eval_every_syncs=0: must be >= 1"),
    ("loop.group_size", 1, "loop.group_size=1: must be >= 2 (loss 'oapl' compares the G samples of a prompt)"),
    ("loop.batch_prompts", 64, "loop.batch_prompts=64: exceeds loop.prompts_per_rollout=32"),
    ("loop.batch_prompts", 0, "loop.batch_prompts=0: must be >= 1"),
    ("trainer.loss", "ppo", "trainer.loss='ppo': must be one of ["),
    ("trainer.micro_batches", 0, "trainer.micro_batches=0: must be >= 1"),
    ("trainer.micro_batches", 3, "loop.batch_prompts=16: must split into trainer.micro_batches=3 micro-batches"),
    ("trainer.loss_settings.oapl.beta1", 0.0, "trainer.loss_settings.oapl.beta1=0.0: OAPLSettings.beta1 must be > 0"),
    ("trainer.loss_settings.oapl.beta2", math.nan,
     "trainer.loss_settings.oapl.beta2=nan: must be a finite number"),
    ("trainer.loss_settings.oapl.beta2", "1e-3",
     "trainer.loss_settings.oapl.beta2='1e-3': must be a finite number"),
    ("trainer.loss_settings.oapl.beta3", 1.0,
     "trainer.loss_settings.oapl.beta3: unknown setting; known: ['beta1', 'beta2', 'length_normalize']"),
    ("trainer.loss_settings.ppo", {}, "trainer.loss_settings.ppo: not a loss"),
    ("trainer.loss_config", {}, "trainer.loss_config: unknown setting"),
    ("trainer.optim.lr", math.nan, "trainer.optim.lr=nan: must be a finite number > 0"),
    ("trainer.optim.lr", math.inf, "trainer.optim.lr=inf: must be a finite number > 0"),
    ("trainer.optim.lr", -1e-4, "trainer.optim.lr=-0.0001: must be > 0"),
    ("trainer.optim.b2", 1.0, "trainer.optim.b2=1.0: must be in [0, 1)"),
    ("trainer.optim.warmup_ratio", 1.0, "trainer.optim.warmup_ratio=1.0: must be in [0, 1)"),
    ("trainer.optim.schedule", "cosine",
     "trainer.optim.schedule='cosine': needs trainer.optim.total_steps >= 1 (it is 0)"),
    ("trainer.optim.schedule", "linear", "trainer.optim.schedule='linear': must be one of ['constant', 'cosine']"),
    ("trainer.optim.lrr", 1.0, "trainer.optim.lrr: unknown setting"),
    ("warmstart.steps", -1, "warmstart.steps=-1: must be >= 0"),
    ("warmstart.batch_size", 0, "warmstart.batch_size=0: must be >= 1"),
    ("warmstart.batch_size", 12, "warmstart.batch_size=12: must be a multiple of the 8 devices"),
    ("warmstart.optim.eps", 0.0, "warmstart.optim.eps=0.0: must be > 0"),
    ("sampler.temperature", 0.0, "sampler.temperature=0.0: must be > 0"),
    ("sampler.temperature", -1.0, "sampler.temperature=-1.0: must be > 0"),
    ("sampler.top_p", 0.0, "sampler.top_p=0.0: must be in (0, 1]"),
    ("sampler.top_k", -1, "sampler.top_k=-1: must be >= 0"),
    ("sampler.max_new_tokens", 0, "sampler.max_new_tokens=0: must be >= 1"),
    ("sampler.max_prefill_length", 0, "sampler.max_prefill_length=0: must be >= 1"),
    ("sampler.num_slots", 12, "sampler.num_slots=12: must be a multiple of the 8 devices the sampler mesh"),
    ("sampler.dtype", "float64", "sampler.dtype='float64': must be one of ['bfloat16', 'float16', 'float32']"),
    ("eval.temperature", -0.5, "eval.temperature=-0.5: must be >= 0"),
    ("eval.top_p", 1.5, "eval.top_p=1.5: must be in (0, 1]"),
    ("eval.max_new_tokens", 0, "eval.max_new_tokens=0: must be >= 1"),
    ("eval.samples", 0, "eval.samples=0: must be >= 1"),
    ("eval.num_prompts", 0, "eval.num_prompts=0: must be >= 1"),
    ("eval.ks", (1, 8), "eval.ks=(1, 8): pass@k needs k <= eval.samples=4"),
    ("eval.ks", (), "eval.ks=(): must be a non-empty tuple of integers >= 1"),
    ("eval.ks", (0, 1), "eval.ks=(0, 1): must be a non-empty tuple of integers >= 1"),
    ("checkpoint.every_syncs", 0, "checkpoint.every_syncs=0: must be >= 1"),
    ("checkpoint.max_to_keep", 0, "checkpoint.max_to_keep=0: must be >= 1"),
    ("mesh.trainer_ici", (1, 3, 1), "mesh.trainer_ici=(1, 3, 1): cannot tile the trainer's 8 device(s)"),
    ("mesh.trainer_ici", (1, -1), "mesh.trainer_ici=(1, -1): must be 3 integers"),
    ("mesh.sampler_ici", (-1, -1, 1), "mesh.sampler_ici=(-1, -1, 1): must be 3 sizes"),
    ("mesh.sampler_devices", 8, "mesh.sampler_devices=8: must be in [0, 7]"),
    ("mesh.rules", {"embed": "model"}, "mesh.rules.embed='model': must be None, one of ('data', 'fsdp', 'tensor')"),
    ("model.preset", "gpt2", "model.preset='gpt2': must be one of ["),
    ("model.overrides.hidden_size", -128, "model.overrides: hidden_size=-128 must be an integer >= 1"),
    ("model.overrides.hiden_size", 64, "model.overrides.hiden_size: not a model setting"),
    ("model.overrides.num_kv_heads", 3, "model.overrides: num_heads=4 must be a multiple of num_kv_heads=3"),
    ("model.dtype", "fp8", "model.dtype='fp8': must be one of"),
    ("model.checkpoint", "/nonexistent/ckpt", "model.checkpoint='/nonexistent/ckpt': not a directory"),
    ("task.name", "nope", f"task.name='nope': must be one of {sorted(factory.TASKS)} or 'package.module:function'"),
    ("task.name", "no_such_pkg.mod:build",
     "task.name='no_such_pkg.mod:build': cannot be imported (ModuleNotFoundError"),
    ("task.num_train", 0, "task.num_train=0: must be >= 1"),
    ("task.teacher_slip_rate", 1.5, "task.teacher_slip_rate=1.5: must be in [0, 1]"),
    ("task.operations", ("^",), "task.operations=('^',): must be a non-empty tuple of"),
    ("validation", {"on_oversized": "truncate", "on_duplicates": "keep"},
     "validation.on_oversized='truncate': must be one of ['error', 'skip']"),
    ("seed", -1, "seed=-1: must be >= 0"),
    ("monitors.max_skipped_updates", 0, "monitors.max_skipped_updates=0: must be >= 1"),
    ("monitors.max_reward_failure_fraction", 1.5, "monitors.max_reward_failure_fraction=1.5: must be in [0, 1]"),
    ("monitors.loss_explosion_factor", 1.0, "monitors.loss_explosion_factor=1.0: must be > 1"),
    ("monitors.entropy_flor", 0.1, "monitors.entropy_flor: unknown setting"),
    ("task", _DELETE, "task: missing from the config"),
    ("trainer", 3, "trainer=3: must be a mapping"),
]


@pytest.mark.parametrize("path,value,message", RULES,  # ids the same in every process (pytest-xdist checks)
                         ids=[f"{p}={'<deleted>' if v is _DELETE else repr(v)}" for p, v, _ in RULES])
def test_each_rule_names_its_field(path, value, message):
  problems = problems_of({path: value})
  assert any(p.startswith(message) for p in problems), problems
  if path not in ("trainer", "loop.sync_every"):  # those also fail what they feed
    assert len(problems) == 1, problems


@pytest.mark.parametrize("changes", [
    # the sections' own fields, all at once
    {"loop.sync_every": -1, "trainer.loss_settings.oapl.beta1": 0.0, "trainer.optim.lr": math.nan,
     "eval.ks": (1, 8), "checkpoint.every_syncs": 0},
    # the cross-section rules (run/check.py), all at once, once every section is well-formed
    {"loop.group_size": 1, "sampler.num_slots": 12, "warmstart.batch_size": 12}])
def test_every_problem_is_listed_at_once(changes):
  problems = problems_of(changes)
  assert len(problems) == len(changes), problems
  for path in changes:
    assert sum(p.startswith(path + "=") for p in problems) == 1, (path, problems)


def test_group_size_one_is_fine_for_a_loss_without_groups():
  assert check.validate(config_with({"trainer.loss": "sft", "loop.group_size": 1})) == []


def test_greedy_eval_and_auto_warmstart_schedule_are_fine():
  cfg = config_with({"eval.temperature": 0.0, "warmstart.optim.schedule": "cosine", "warmstart.optim.total_steps": 0})
  assert check.validate(cfg) == []


def test_model_dimension_that_the_mesh_cannot_split():
  # tensor = 8 on the trainer: the tiny model's 4 heads, 2 kv heads and vocab 32 ... do not split 8 ways
  problems = problems_of({"mesh.trainer_ici": (1, 1, -1)})
  assert "model num_heads=4: does not divide over the 8 ways the trainer mesh" in "\n".join(problems)
  assert "model num_kv_heads=2: does not divide over the 8 ways the trainer mesh" in "\n".join(problems)
  assert not any(p.startswith("model vocab_size") for p in problems)  # 32 splits 8 ways


def test_warnings_are_returned_not_raised(caplog):
  cfg = config_with({"trainer.optim.lr": 10.0, "eval.max_new_tokens": 60})
  with caplog.at_level(logging.WARNING, logger="oapl_jax.run.check"):
    warnings = check.validate(cfg)
  assert warnings == [
      "trainer.optim.lr=10.0: unusually large for AdamW (typical 1e-6 .. 1e-3); expect divergence",
      "sampler.max_prefill_length=8 + max_new_tokens=60 exceeds the model's max_position_embeddings=64"]
  assert [r.getMessage() for r in caplog.records] == [f"config: {w}" for w in warnings]


def _chat_files(tmp_path, max_positions: int):
  """A checkpoint directory whose config.json is Qwen3-4B-Thinking with `max_positions`, data files."""
  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  arch = QwenConfig.qwen3_4b_thinking_2507().replace(max_position_embeddings=max_positions)
  (ckpt / "config.json").write_text(json.dumps(hf.config_to_hf(arch, "bfloat16")))
  data = tmp_path / "data.jsonl"
  data.write_text('{"problem": "1+1?", "answer": "2"}\n')
  return str(ckpt), str(data)


@pytest.mark.parametrize("module", [math_config, gsm8k])
def test_chat_configs_pass_with_their_files_and_warn_past_max_positions(tmp_path, module):
  ckpt, data = _chat_files(tmp_path, max_positions=4096)
  cfg = module.get_config("")
  cfg.model.checkpoint = ckpt
  cfg.task.update(tokenizer_dir=ckpt, train_path=data, eval_paths={name: data for name in cfg.task.eval_paths})
  warnings = check.validate(cfg)
  prefill, new = cfg.sampler.max_prefill_length, max(cfg.sampler.max_new_tokens, cfg.eval.max_new_tokens)
  assert warnings == ([] if prefill + new <= 4096 else [
      f"sampler.max_prefill_length={prefill} + max_new_tokens={new} exceeds the model's max_position_embeddings=4096"])
  assert (module is math_config) == bool(warnings)  # math: 2048 + 16384 tokens; gsm8k: 512 + 1024


def test_chat_config_without_its_files(tmp_path):
  cfg = math_config.get_config("")
  cfg.model.checkpoint = ""  # the preset then
  cfg.task.update(tokenizer_dir=str(tmp_path / "tok"), train_path=str(tmp_path / "train.jsonl"))
  with pytest.raises(ConfigError) as info:
    check.validate(cfg)
  problems = info.value.problems
  assert f"task.tokenizer_dir='{tmp_path}/tok': not a directory (point it at the model's HF checkpoint)" in problems
  assert f"task.train_path='{tmp_path}/train.jsonl': no such file" in problems
  assert sum(p.startswith("task.eval_paths.") and p.endswith(": no such file") for p in problems) == 4


# ------------------------------------------------------------------------------------------------ problem sets
def _problem(text: str, answer: str = "0") -> Problem:
  return Problem(prompt=text, answer=answer, prompt_tokens=tuple(text.encode()))


def test_empty_set_names_it():
  with pytest.raises(DataError, match=r"^task.train_path /x.jsonl holds no records$"):
    problem_checks.validate_problems([], where="task.train_path /x.jsonl", max_prompt_tokens=8)


def test_oversized_prompt_names_file_and_line(tmp_path):
  path = tmp_path / "train.jsonl"
  path.write_text('{"problem": "abc", "answer": "1"}\n\n{"problem": "0123456789", "answer": "2"}\n'
                  '{"problem": "de", "answer": "3"}\n')
  records, locations = sources.load_jsonl(path, with_locations=True)
  problems = [_problem(r["problem"], r["answer"]) for r in records]
  with pytest.raises(DataError) as info:
    problem_checks.validate_problems(problems, where=f"task.train_path {path}", max_prompt_tokens=8, locations=locations)
  assert str(info.value) == (f"task.train_path {path}: 1 prompt(s) longer than sampler.max_prefill_length=8: "
                             f"{path} line 3 (10 tokens) (raise the limit, or set validation.on_oversized='skip')")


def test_oversized_prompts_skipped_and_counted(caplog):
  problems = [_problem("abc"), _problem("x" * 9), _problem("defgh"), _problem("y" * 20)]
  with caplog.at_level(logging.WARNING):
    kept, counts = problem_checks.validate_problems(problems, where="set", max_prompt_tokens=8, on_oversized="skip")
  assert kept == [problems[0], problems[2]]
  assert counts == dict(records=4, kept=2, oversized_skipped=2, duplicates=0, duplicates_dropped=0,
                        conflicting_answers=0)
  assert ("set: skipped 2 prompt(s) longer than sampler.max_prefill_length=8, e.g. set record 2 (9 tokens)"
          in caplog.text)
  with pytest.raises(DataError, match="none of its 1 records is usable"):
    problem_checks.validate_problems([problems[1]], where="set", max_prompt_tokens=8, on_oversized="skip")


@pytest.mark.parametrize("policy,kept_indices", [("keep", [0, 1, 2, 3, 4]), ("drop", [0, 1, 3])])
def test_duplicates_counted_then_kept_or_dropped(caplog, policy, kept_indices):
  problems = [_problem("a", "1"), _problem("b", "2"), _problem("a", "1"), _problem("a", "7"), _problem("b", "2")]
  with caplog.at_level(logging.WARNING):
    kept, counts = problem_checks.validate_problems(problems, where="set", max_prompt_tokens=8, on_duplicates=policy)
  assert kept == [problems[i] for i in kept_indices]
  assert counts["duplicates"] == 2 and counts["duplicates_dropped"] == (2 if policy == "drop" else 0)
  assert counts["conflicting_answers"] == 1  # "a" with answer 7 after answer 1
  assert "set record 3 repeats set record 1" in caplog.text
  assert "set record 4 has answer '7', set record 1 '1'" in caplog.text


def test_empty_prompt_and_foreign_token_ids_are_errors():
  with pytest.raises(DataError, match="^set record 2: the prompt has no tokens$"):
    problem_checks.validate_problems([_problem("a"), _problem("")], where="set", max_prompt_tokens=8)
  with pytest.raises(DataError, match=r"set record 1: prompt token ids outside the model's vocabulary \[0, 98\): "
                                      r"\[98\]"):
    problem_checks.validate_problems([_problem("ab")], where="set", max_prompt_tokens=8, vocab_size=98)  # b = 98


def test_validate_task_arithmetic(caplog):
  cfg = arithmetic.get_config("")
  task = arithmetic_task.make_task(num_train=200, num_held_out=8, seed=0)
  demands = lambda: problem_checks.Demands(  # noqa: E731
      max_prompt_tokens=cfg.sampler.max_prefill_length, policy=problem_checks.ValidationConfig(),
      warmstart_steps=cfg.warmstart.steps, warmstart_batch=cfg.warmstart.batch_size, seed=cfg.seed,
      vocab_size=cfg.model.overrides.vocab_size)
  out, counts = problem_checks.validate_task(task, demands())
  assert out.train == task.train and out.eval_sets == task.eval_sets
  assert counts["train"]["kept"] == 200 and counts["held_out"] == dict(
      records=8, kept=8, oversized_skipped=0, duplicates=0, duplicates_dropped=0, conflicting_answers=0, in_train=0)
  cfg.warmstart.batch_size = 201  # demonstrations: one per training problem
  with pytest.raises(DataError, match="^warmstart.batch_size=201 exceeds the 200 demonstrations of task 'arithmetic'$"):
    problem_checks.validate_task(task, demands())
  cfg.warmstart.batch_size = 128
  cfg.sampler.max_prefill_length = 6  # one token per character after bos: "ab+cd=" is 7 tokens, "a+cd=" 6
  too_long = sum(len(p.prompt) + 1 > 6 for p in task.train)
  assert 0 < too_long < 200
  with pytest.raises(DataError, match=rf"^task 'arithmetic' train set: {too_long} prompt\(s\) longer than sampler"):
    problem_checks.validate_task(task, demands())
  cfg.sampler.max_prefill_length = 8
  with pytest.raises(DataError, match="^task 'arithmetic' held_out set holds no records$"):
    problem_checks.validate_task(task.__class__(**{**task.__dict__, "eval_sets": {"held_out": []}}), demands())
  leaked = task.__class__(**{**task.__dict__, "eval_sets": {"held_out": list(task.train[:3])}})
  with caplog.at_level(logging.WARNING):
    _, counts = problem_checks.validate_task(leaked, demands())
  assert counts["held_out"]["in_train"] == 3 and "eval set 'held_out': 3 prompt(s) also in the train set" in caplog.text


def test_validate_task_names_the_chat_files(tmp_path):
  cfg = math_config.get_config("")
  cfg.task.update(train_path=str(tmp_path / "train.jsonl"), eval_paths={"aime25": str(tmp_path / "aime.jsonl")})
  cfg.warmstart.steps = 0
  task = arithmetic_task.make_task(num_train=4, num_held_out=2)
  task = task.__class__(**{**task.__dict__, "eval_sets": {"aime25": []}})
  with pytest.raises(DataError, match=f"^task.eval_paths.aime25 {tmp_path}/aime.jsonl holds no records$"):
    problem_checks.validate_task(task, problem_checks.Demands(max_prompt_tokens=64,
                                                              policy=problem_checks.ValidationConfig()),
                                 task_settings=schema.from_config(cfg).task)


@pytest.mark.parametrize("field,value,message", [
    ("num_digits", 4, "task.num_digits=4: must be in [1, 3]"),
    ("held_out_fraction", 1.0, "task.held_out_fraction=1.0: must be in (0, 1)"),
    ("teacher_copies", 0, "task.teacher_copies=0: must be >= 1"),
    ("reward_timeout_s", 0.0, "task.reward_timeout_s=0.0: must be > 0")])
def test_code_synthetic_task_fields_are_checked(field, value, message):
  import importlib  # pylint: disable=import-outside-toplevel
  cfg = importlib.import_module("configs.code").get_config("smoke")
  assert check.validate(cfg) == []
  cfg.task[field] = value
  with pytest.raises(ConfigError) as info:
    check.validate(cfg)
  assert [p for p in info.value.problems if p.startswith(message)], info.value.problems


def test_a_remat_policy_without_remat_is_a_warning():
  assert check.validate(config_with({"model.remat_policy": "offload_layer_input"})) == [
      "model.remat_policy='offload_layer_input' has no effect with model.remat=False"]
  assert check.validate(config_with({"model.remat_policy": "offload_layer_input", "model.remat": True})) == []


def test_a_bad_field_does_not_hide_a_cross_section_problem():
  """Found by tests/fuzz_test.py: with checkpoint.every_syncs=0 (a field rule) the typed config could not be built,
  so loop.group_size=1 (a rule across loss and loop) went unreported until the first was fixed."""
  import copy  # pylint: disable=import-outside-toplevel
  from configs import arithmetic  # pylint: disable=import-outside-toplevel
  from oapl_jax import sections  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import check  # pylint: disable=import-outside-toplevel
  cfg = copy.deepcopy(arithmetic.get_config("").to_dict())
  cfg["checkpoint"]["every_syncs"], cfg["loop"]["group_size"] = 0, 1
  with pytest.raises(sections.ConfigError) as info:
    check.validate(cfg)
  assert info.value.problems == ["checkpoint.every_syncs=0: must be >= 1",
                                 "loop.group_size=1: must be >= 2 (loss 'oapl' compares the G samples of a prompt)"]


def test_demonstrations_longer_than_the_token_budget_are_one_config_problem():
  """Before: the warm start's packing raised 'prompt (7) + response (4) tokens exceed the trainer's sequence length'
  from deep inside; the RL answers would have been cut at the same budget."""
  from oapl_jax.run import assemble
  cfg = arithmetic.get_config("smoke")
  cfg.sampler.max_new_tokens = cfg.eval.max_new_tokens = 1
  rc = schema.from_config(cfg)
  task = assemble.build_task(rc)
  longest = max(len(d.completion_tokens) for d in task.demonstrations(rc.seed))
  with pytest.raises(ConfigError, match=rf"sampler.max_new_tokens=1: task 'arithmetic' has demonstrations of up to "
                                        rf"{longest} completion tokens"):
    assemble.warm_start(rc, task, None, None, None, 8, lambda *a: None)
  task.close()
