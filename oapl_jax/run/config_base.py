"""What every experiment config (configs/*.py) starts from. The defaults are not written here: each section's
live on its typed dataclass (run/schema.py names the owner of each), and this reads them.

It lives in the package (beside run/schema.py, whose defaults it hands out) so config files import it however they are
loaded (python -m, oapl-train, Colab): `from oapl_jax.run import config_base`."""
from ml_collections import ConfigDict

from oapl_jax.run import schema
from oapl_jax.tasks import arithmetic, records_task as records
from oapl_jax.tasks.factory import ChatSettings


def base_config() -> ConfigDict:
  """Every section with its defaults; a config then sets `task` and what it changes."""
  return schema.defaults()


def arithmetic_task(num_digits: int, num_train: int, num_held_out: int) -> ConfigDict:
  """tasks/arithmetic.ArithmeticSettings (teacher_slip_rate: demonstrations whose last digit is off by one)."""
  return schema.task_section(arithmetic.ArithmeticSettings, num_digits=num_digits, num_train=num_train,
                             num_held_out=num_held_out)


def chat_task(tokenizer_dir: str, train_path: str, eval_paths: dict, reward: str = "math_verify") -> ConfigDict:
  """tasks/factory.ChatSettings: problem/answer records (JSONL, Parquet or tfds:NAME/SPLIT) templated with the
  model's chat template."""
  return schema.task_section(ChatSettings, tokenizer_dir=tokenizer_dir, train_path=train_path,
                             eval_paths=dict(eval_paths), reward=reward)


def records_task(train_path: str, eval_paths: dict, reward: str = "exact_match", tokenizer: str = "chars",
                 demonstrations_path: str = "") -> ConfigDict:
  """tasks/records_task.RecordsSettings (its docstring documents every field): your own task from data files."""
  return schema.task_section(records.RecordsSettings, train_path=train_path, eval_paths=dict(eval_paths),
                             reward=reward, tokenizer=tokenizer, demonstrations_path=demonstrations_path)


def shrink_for_cpu(c: ConfigDict) -> None:
  """The same pipeline at toy size: one window of two trainer steps, float32, a few short rollouts."""
  c.model.update(dtype="float32", remat=False, remat_policy="full")
  c.task.update(reward_workers=1, max_train=8)
  c.trainer.micro_batches = 1
  c.sampler.update(num_slots=8, max_prefill_length=256, max_new_tokens=8, dtype="float32", steps_per_sync=4)
  c.loop.update(sync_every=2, num_syncs=1, batch_prompts=8, prompts_per_rollout=8, group_size=2, steps_per_rollout=1,
                eval_every_syncs=1)
  c.eval.update(num_prompts=2, samples=2, ks=(1, 2), max_new_tokens=8)
  c.mesh.update(trainer_ici=(1, -1, 1), sampler_ici=(1, -1, 1), sampler_devices=0)  # tiny heads: no tensor split
