"""oapl_jax.run.export: a run exported and run by transformers alone (AutoTokenizer encodes our prompts' ids, greedy
generate equals ours), a trained arithmetic run likewise, and a run started from an HF checkpoint with a tokenizer
(AutoTokenizer round trip, logits)."""
import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers

from configs import arithmetic
from oapl_jax import checkpoint_files, checkpoints, parallel, run_dir
from oapl_jax.run import assemble, config_base, export, schema
from oapl_jax.apps import eval as eval_cli
from oapl_jax.apps import export as export_app
from oapl_jax.models import decoder, factory, hf
from oapl_jax.rl import loop, trainer
from oapl_jax.sampler import core, rollout
from oapl_jax.sampler.settings import SamplingSettings
from oapl_jax.sampler.tokenizers import TokenIdTokenizer
from oapl_jax.tasks import records_task
from oapl_jax.tasks.factory import build_task
from tests.hf_fixtures import make_chat_tokenizer, make_hf_checkpoint


def _save_run(workdir: str, cfg, scale: float = 0.3):
  """A run directory as loop.train leaves it (config.json, a checkpoint at step 2) with random params of std
  `scale`: logits peaked enough that greedy decoding has no near-ties between JAX and torch."""
  rc = schema.from_config(cfg)
  layout = parallel.Layout.single_device()
  model, params = assemble.build_model(rc, layout)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: (scale * rng.standard_normal(x.shape)).astype(x.dtype), params)
  state = trainer.create_train_state(trainer.TrainConfig(), model, params, layout)
  saver = checkpoints.Checkpointer(f"{workdir}/checkpoints")
  saver.save(2, state, checkpoint_files.Meta(1, 1, 8, rc.seed))
  saver.close()
  run_dir.record_config(workdir, cfg)
  return model, params


def test_transformers_alone_encodes_our_prompts_and_answers_as_our_greedy_sampler(tmp_path):
  cfg = arithmetic.get_config("smoke")
  cfg.model.overrides["vocab_size"] = 18  # the characters and specials only, so every answer is readable
  workdir, out = str(tmp_path / "run"), str(tmp_path / "hf")
  model, params = _save_run(workdir, cfg)
  info = export.export(workdir, out)
  assert info["tokenizer"].startswith("the arithmetic character tokenizer") and "<bos> (id 1)" in info["tokenizer"]

  tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
  theirs_model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  task = build_task(schema.from_config(cfg).task)
  problems = task.eval_sets["held_out"]
  assert [tokenizer(p.prompt).input_ids for p in problems] == [list(p.prompt_tokens) for p in problems]

  asked = problems[:6]
  assert len({len(p.prompt) for p in asked}) > 1  # a batch that needs padding (on the left)
  batch = tokenizer([p.prompt for p in asked], return_tensors="pt", padding=True)
  with torch.no_grad():  # the export's generation_config: greedy here, its eos and pad ids
    generated = theirs_model.generate(**batch, do_sample=False, max_new_tokens=6)
  eos = tokenizer.eos_token_id
  theirs = [row[:row.index(eos) + 1] if eos in row else row for row in generated[:, batch.input_ids.shape[1]:].tolist()]

  sampler = core.Sampler(model, num_slots=8, max_prefill_length=8, max_new_tokens=6)
  greedy = SamplingSettings(max_new_tokens=6, temperature=0.0, stop_tokens=(task.tokenizer.eos_id,))
  ours = rollout.generate_groups(sampler, params, [p.prompt_tokens for p in asked], 1, greedy, seed=0)
  mine = [ours.response_tokens[i, 0, :ours.lengths[i, 0]].tolist() for i in range(len(asked))]
  print("prompt | transformers | ours:", *(f"{p.prompt} | {tokenizer.decode(t)!r} | {task.tokenizer.decode(m)!r}"
                                          for p, t, m in zip(asked, theirs, mine)), sep="\n  ")
  assert theirs == mine
  assert len({tuple(m) for m in mine}) > 1  # the answers differ by prompt: a comparison that could fail
  task.close()


def test_a_tokenizer_without_an_hf_form_is_refused_unless_weights_only(tmp_path, monkeypatch, capsys):
  workdir, out = str(tmp_path / "run"), str(tmp_path / "hf")
  _save_run(workdir, arithmetic.get_config("smoke"))
  monkeypatch.setattr(export, "run_tokenizer", lambda cfg: TokenIdTokenizer(stop_tokens=(2,)))  # ids, no vocabulary
  with pytest.raises(SystemExit):
    export_app.main([workdir, out])
  assert "pass --weights_only" in capsys.readouterr().err and not os.path.exists(out)
  assert export_app.main([workdir, out, "--weights_only"]) == 0
  assert "tokenizer: none (--weights_only)" in capsys.readouterr().out and not hf.tokenizer_files(out)


def test_printable_tokenizer_exports_every_character():
  ours = records_task.PrintableTokenizer()
  theirs = ours.to_hf()
  text = ours.chars + "<eos>a"
  assert theirs(text).input_ids == [ours.bos_id, *ours.encode(text)]
  assert theirs(text, add_special_tokens=False).input_ids == ours.encode(text)
  assert theirs.decode(theirs(text).input_ids) == ours.decode([ours.bos_id, *ours.encode(text)])
  with pytest.raises(Exception, match="UNK"):  # no unknown token: a character outside is an error, as ours
    theirs("é")


def _arithmetic_config():
  c = arithmetic.get_config("smoke")
  c.model.overrides.update(hidden_size=64, intermediate_size=128, head_dim=16)
  c.warmstart.update(steps=40, batch_size=32)  # a peaked policy: greedy answers far from argmax ties
  c.eval.update(num_prompts=4, samples=2, ks=(1, 2))
  c.sampler.num_slots = 16
  return c


@pytest.mark.slow
def test_arithmetic_run_exports_and_transformers_generates_like_us(tmp_path, capsys):
  workdir, out = str(tmp_path / "run"), str(tmp_path / "hf")
  cfg = _arithmetic_config()
  run = assemble.setup(cfg, workdir)
  run_dir.record_config(workdir, cfg)  # what main does at start
  loop.train(run)
  assert export_app.main([workdir, out]) == 0
  printed = capsys.readouterr().out
  assert "exported step 2 (1 sync windows)" in printed
  assert "tokenizer: the arithmetic character tokenizer (oapl_jax.tasks.arithmetic.CharTokenizer)" in printed
  assert hf.tokenizer_files(out) == ["tokenizer.json", "tokenizer_config.json"]
  tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
  info = json.load(open(os.path.join(out, "export_info.json")))
  assert info["step"] == 2 and info["token_ids"] == {"eos": 2, "pad": 0, "bos": 1}

  # The exported weights are the trained ones, bit for bit.
  _, exported = hf.load(out)
  trained = jax.device_get(run.state.params)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), exported, trained)

  model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (2, 0)
  assert (model.config.eos_token_id, model.config.pad_token_id, model.config.bos_token_id) == (2, 0, 1)
  assert model.generation_config.temperature == pytest.approx(cfg.eval.temperature)

  problems = run.task.eval_sets["held_out"][:8]
  sampler = core.Sampler(run.model, num_slots=8, max_prefill_length=8, max_new_tokens=6)
  greedy = SamplingSettings(max_new_tokens=6, temperature=0.0, stop_tokens=(2,))
  ours = rollout.generate_groups(sampler, run.state.params, [p.prompt_tokens for p in problems], 1, greedy, seed=0)
  stopped = 0
  for i, problem in enumerate(problems):
    prompt = tokenizer(problem.prompt, return_tensors="pt").input_ids
    assert prompt[0].tolist() == list(problem.prompt_tokens)
    with torch.no_grad():
      theirs = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=6)
    theirs = theirs[0, prompt.shape[1]:].tolist()
    mine = ours.response_tokens[i, 0, :ours.lengths[i, 0]].tolist()
    assert theirs == mine, (problem.prompt, theirs, mine)
    stopped += mine[-1] == 2
  assert stopped >= 4  # most answers end at eos: generate's stop token came from the export

  # oapl-eval on the run's checkpoint reproduces the loop's final eval (same params, settings, seed), and
  # on the export (an HF directory, with the config file) gives the same numbers again.
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  final = {k.split("/")[-1][:-len(" (end)")]: v for k, v in summary.items() if k.endswith("(end)")}
  assert eval_cli.main([workdir]) == 0
  from_run = json.load(open(os.path.join(workdir, "eval", "step_2", "eval.json")))["sets"]["held_out"]
  assert {k: from_run[k] for k in final} == pytest.approx(final, rel=1e-6)
  assert eval_cli.main([out, "--config", "configs/arithmetic.py:smoke", "--samples", "2", "--ks", "1,2",
                        "--out", str(tmp_path / "eval_hf")]) == 0
  from_hf = json.load(open(tmp_path / "eval_hf" / "eval.json"))
  assert from_hf["kind"] == "hf" and from_hf["sets"]["held_out"]["prompts"] == 4
  for key in ("pass@1", "pass@2", "reward_mean", "response_length", "sequence_entropy"):
    assert from_hf["sets"]["held_out"][key] == pytest.approx(from_run[key], rel=1e-6), key
  assert "| held_out | 4 |" in open(tmp_path / "eval_hf" / "eval.md").read()


def test_run_from_hf_checkpoint_exports_its_tokenizer(tmp_path):
  source, workdir, out = tmp_path / "source", str(tmp_path / "run"), str(tmp_path / "hf")
  torch_source = make_hf_checkpoint(source, "qwen3", vocab_size=320)
  tokenizer = make_chat_tokenizer(source)
  cfg = config_base.base_config()
  cfg.model.checkpoint = str(source)
  cfg.task = config_base.chat_task(str(source), "train.jsonl", {})  # the data is not read by an export
  layout = parallel.Layout.single_device()
  model, params = factory.load_pretrained(str(source), layout, param_dtype="float32", dtype="float32")
  state = trainer.create_train_state(trainer.TrainConfig(), model, params, layout)
  moved = jax.tree.map(lambda x: x + 0.01 * jax.random.normal(jax.random.PRNGKey(1), x.shape), state.params)
  saver = checkpoints.Checkpointer(f"{workdir}/checkpoints")
  saver.save(7, state.replace(params=moved),
             checkpoint_files.Meta(syncs_done=3, snapshot_version=4, data_position=96, seed=0))
  saver.close()
  run_dir.record_config(workdir, cfg)

  with pytest.raises(ValueError, match=r"no checkpoint at step 5; it has steps \[7\]"):
    export.export(workdir, out, step=5)
  info = export.export(workdir, out, step=7)
  assert (info["syncs_done"], info["snapshot_version"]) == (3, 4)
  assert info["tokenizer"].startswith(f"copied from {source}: tokenizer.json, tokenizer_config.json")

  loaded = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
  text = "What is 1+1? The answer is \\boxed{2}. New words é ü"
  assert loaded.encode(text) == tokenizer.encode(text) and loaded.decode(loaded.encode(text)) == text
  messages = [{"role": "user", "content": "2+2?"}]
  assert loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
      tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  assert (loaded.eos_token_id, loaded.pad_token_id) == (info["token_ids"]["eos"], info["token_ids"]["pad"])
  generation = transformers.GenerationConfig.from_pretrained(out)
  assert (generation.eos_token_id, generation.pad_token_id, generation.top_k) == (loaded.eos_token_id, loaded.pad_token_id, 0)
  assert (generation.temperature, generation.top_p, generation.do_sample) == (0.6, 0.95, True)

  # The weights are the checkpoint's (moved away from the source), read by transformers as we compute them.
  exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  tokens = np.array([loaded.encode(text)])
  with torch.no_grad():
    theirs = exported(torch.tensor(tokens)).logits.numpy()
    source_logits = torch_source(torch.tensor(tokens)).logits.numpy()
  mine = np.asarray(decoder.logits(jax.device_get(moved), model.config, tokens))
  assert np.max(np.abs(theirs - mine)) / np.max(np.abs(mine)) < 1e-4
  assert np.max(np.abs(theirs - source_logits)) > 1e-2


def test_clear_errors_for_missing_config_and_sets_the_task_cannot_take(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"no config.json.*--config FILE:ARG"):
    export.export(str(tmp_path), str(tmp_path / "out"))
  with pytest.raises(FileNotFoundError, match=r"neither a run directory .* nor a Hugging Face directory"):
    eval_cli.main([str(tmp_path)])
  (tmp_path / "checkpoints").mkdir()
  with pytest.raises(ValueError, match=r"task 'arithmetic' takes no eval_paths"):
    eval_cli.main([str(tmp_path), "--config", "configs/arithmetic.py:smoke", "--sets", "mine=data.jsonl"])
  with pytest.raises(ValueError, match=r"expected NAME=PATH"):
    eval_cli.main([str(tmp_path), "--config", "configs/arithmetic.py:smoke", "--sets", "data.jsonl"])


def test_run_dir_records_the_config_and_refuses_a_changed_resume(tmp_path):
  workdir = str(tmp_path)
  cfg = arithmetic.get_config("smoke")
  run_dir.record_config(workdir, cfg)
  recorded = json.load(open(tmp_path / "config.json"))
  assert recorded["loop"]["sync_every"] == 2 and recorded["mesh"]["trainer_ici"] == [1, -1, 1]
  assert "sync_every: 2" in open(tmp_path / "config.yaml").read()
  assert schema.from_run_dir(workdir).task.teacher_slip_rate == 0.7
  # The same config (tuples and lists alike) and an operational field: no difference.
  same = arithmetic.get_config("smoke")
  assert run_dir.check_resume(workdir, same) == []
  older = str(tmp_path / "older")  # recorded before the report section: resumed with either events writer
  run_dir.record_config(older, {k: v for k, v in recorded.items() if k != "report"})
  same.report.events = "tensorboard"
  assert run_dir.check_resume(older, same, defaults=schema.defaults().to_dict()) == []
  assert run_dir.check_resume(workdir, same) == []
  changed = arithmetic.get_config("smoke")
  changed.loop.sync_every = 4
  changed.mesh.trainer_ici = (1, 1, -1)
  changed.model.overrides["num_layers"] = 3
  with pytest.raises(run_dir.ConfigChanged) as error:
    run_dir.check_resume(workdir, changed)
  assert error.value.differences == ["loop.sync_every: 2 -> 4", "mesh.trainer_ici: [1, -1, 1] -> [1, 1, -1]",
                                     "model.overrides.num_layers: 2 -> 3"]
  assert "allow the change explicitly" in str(error.value)
  assert json.load(open(tmp_path / "config.json")) == recorded  # a refused resume changes nothing
  # Allowed: the differences are returned, the old config kept, the new one recorded.
  assert len(run_dir.check_resume(workdir, changed, allow_changes=True)) == 3
  assert json.load(open(tmp_path / "config.previous-1.json")) == recorded
  assert run_dir.check_resume(workdir, changed) == []
  added = arithmetic.get_config("smoke")
  added.loop.sync_every, added.mesh.trainer_ici, added.model.overrides["num_layers"] = 4, (1, 1, -1), 3
  del added.model.overrides["head_dim"]
  assert run_dir.check_resume(workdir, added, allow_changes=True) == ["model.overrides.head_dim: 32 -> <absent>"]
