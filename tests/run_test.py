"""The front door (oapl_jax/run/): the typed RunConfig round-trips, defaults come from the sections alone,
architecture equality ignores execution, the sequence-length rule, and the command line's overrides."""
import dataclasses

import pytest

from configs import arithmetic, code, own_task
from oapl_jax import sections
from oapl_jax.run import config_base
from oapl_jax.models import api, factory
from oapl_jax.models.execution import Execution
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.rl.optim import OptimConfig
from oapl_jax.rl.warmstart import WarmStartConfig
from oapl_jax.run import assemble, files, schema


@pytest.mark.parametrize("module,variant", [(arithmetic, ""), (arithmetic, "grpo"), (own_task, ""), (code, "smoke")])
def test_typed_config_round_trips_through_its_record(module, variant):
  rc = schema.from_config(module.get_config(variant))
  assert schema.from_config(schema.to_mapping(rc)) == rc  # what a run records (config.json) reads back as itself


def test_defaults_are_the_sections_own():
  base = config_base.base_config()
  # hand-written expectations, one per owner: the trainer's AdamW is the paper's math setting (b2 0.95, clip 1)
  assert (base.trainer.optim.b2, base.trainer.optim.max_grad_norm, base.trainer.optim.lr) == (0.95, 1.0, 1e-6)
  assert (OptimConfig().b2, OptimConfig().max_grad_norm) == (0.95, 1.0)
  assert base.warmstart.optim.to_dict() == sections.to_mapping(WarmStartConfig().optim)
  assert (base.warmstart.optim.lr, base.warmstart.optim.schedule) == (1e-4, "cosine")
  assert set(base.trainer.loss_settings) == {"oapl", "grpo", "grpo_onpolicy", "asymre", "opmd", "m2po"}
  assert base.trainer.loss_settings.oapl.to_dict() == dict(beta1=1.0, beta2=1e-3, length_normalize=False)
  assert base.loop.sync_every == 50 and base.eval.ks == (1, 5, 10) and base.mesh.trainer_ici == (1, -1, 1)


def test_a_warm_start_cosine_without_total_steps_spans_the_warm_start():
  ws = WarmStartConfig(steps=300, batch_size=8)
  assert ws.optim.total_steps == 0 and ws.optimizer().total_steps == 300  # the config keeps what the user wrote


def test_architecture_equality_ignores_how_the_model_runs():
  plain = QwenConfig.tiny()
  pinned = QwenConfig.tiny(attention="reference", dtype="bfloat16", remat=True, attention_block_q=64)
  assert pinned.attention == "reference" and pinned.execution.dtype == "bfloat16"
  assert pinned != plain and pinned.architecture == plain.architecture
  assert api.for_config(pinned).same_architecture(api.for_config(plain))
  assert not api.for_config(plain).same_architecture(api.for_config(plain.replace(num_layers=3)))


def test_execution_is_set_once_not_in_overrides():
  with pytest.raises(sections.ConfigError, match=r"model.overrides sets \['attention'\]: how the model runs is set once"):
    schema.from_config(dict(arithmetic.get_config().to_dict(), model=dict(overrides=dict(attention="reference"))))
  spec = factory.ModelSpec(attention="reference", overrides=dict(num_layers=3))
  config = factory.architecture(spec)
  assert config.num_layers == 3 and config.execution == Execution(attention="reference")


def test_one_sequence_length_rule_online_and_offline():
  online = schema.from_config(arithmetic.get_config())  # sampler 6 and eval 6 new tokens
  assert assemble.seq_len(online, 8) == 8 + 6 - 1
  longer_eval = dataclasses.replace(online, eval=dataclasses.replace(online.eval, max_new_tokens=9))
  assert assemble.seq_len(longer_eval, 8) == 8 + 9 - 1  # an online buffer also holds eval's lengths
  offline = schema.from_config(code.get_config("smoke"))
  assert offline.is_offline and assemble.seq_len(offline, 8) == 8 + offline.sampler.max_new_tokens - 1


def test_command_line_overrides_keep_types_and_name_bad_fields():
  cfg = files.load("configs/arithmetic.py:smoke", ["--config.mesh.trainer_ici=(1,2,-1)", "--config.trainer.loss=grpo",
                                                  "--config.trainer.optim.lr=1"])
  rc = schema.from_config(cfg)
  assert rc.mesh.trainer_ici == (1, 2, -1) and rc.trainer.loss == "grpo" and rc.trainer.optim.lr == 1.0
  with pytest.raises(ValueError, match="loop.nope is not a field"):
    files.load("configs/arithmetic.py", {"loop.nope.deeper": 1})
  with pytest.raises(sections.ConfigError, match=r"loop.nonexistent: unknown setting"):
    schema.from_config(files.load("configs/arithmetic.py", {"loop.nonexistent": 3}))


def test_a_run_recorded_before_a_field_was_retired_still_reads(caplog):
  """config.json of a run made before model.logprob_chunk became model.logprob_chunk_tokens: eval, serve and
  export read it (the retired field dropped, with a warning), and an unknown field is still an error."""
  recorded = schema.to_mapping(schema.from_config(arithmetic.get_config()))
  recorded["model"]["logprob_chunk"] = 256
  with caplog.at_level("WARNING"):
    rc = schema.from_config(recorded)
  assert rc.model == schema.from_config(arithmetic.get_config()).model and "model.logprob_chunk is retired" in caplog.text
  recorded["model"]["logprob_chunks"] = 256
  with pytest.raises(sections.ConfigError, match="model.logprob_chunks: unknown setting"):
    schema.from_config(recorded)
