"""The warm start (rl/warmstart.py): each process feeds only its rows of the batch, and the result is the
same train steps on the same rows as a plain loop over the whole numpy batch."""
import jax
import numpy as np
import pytest

from oapl_jax import objectives, parallel
from oapl_jax.models import api, decoder
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.rl import trainer, warmstart
from oapl_jax.rl.optim import OptimConfig
from oapl_jax.tasks.base import Demonstration

CONFIG = QwenConfig.tiny()


def _demos(n, seed=0):
  rng = np.random.default_rng(seed)
  return [Demonstration(tuple(int(t) for t in rng.integers(3, CONFIG.vocab_size, 3)),
                        tuple(int(t) for t in rng.integers(3, CONFIG.vocab_size, 1 + i % 4))) for i in range(n)]


@pytest.mark.devices(8)
def test_warm_start_equals_plain_steps_on_the_same_rows():
  mesh = parallel.make_mesh((1, -1, 1))  # 8 devices: the batch arrives split over them
  model, layout = api.for_config(CONFIG), parallel.Layout(mesh)
  params, _ = parallel.init_sharded(lambda: decoder.init_params(CONFIG, jax.random.PRNGKey(0)), mesh,
                                    parallel.DEFAULT_RULES)
  demos, seq_len, batch_size, steps = _demos(24), 8, 8, 3
  config = warmstart.WarmStartConfig(steps=steps, batch_size=batch_size, optim=OptimConfig(lr=1e-2))
  logged = []
  warmed = warmstart.warm_start(demos, params, model, layout, config, seq_len=seq_len, seed=5,
                                log=lambda step, metrics: logged.append((step, metrics)))

  train_config = trainer.TrainConfig(loss="sft", loss_settings=objectives.SFTSettings(), optim=config.optim)
  state = trainer.create_train_state(train_config, model, params, layout)
  step_fn = trainer.make_train_step(train_config, model, layout)
  data, rng = warmstart.pack_demonstrations(demos, seq_len), np.random.default_rng(5)
  for step in range(steps):
    rows = rng.choice(len(demos), size=batch_size, replace=False)
    state, _ = step_fn(state, {k: v[rows] for k, v in data.items()}, jax.random.PRNGKey(step))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), warmed, state.params)
  assert not all(np.array_equal(np.asarray(a), np.asarray(b))
                 for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(warmed)))  # it did train
  assert [step for step, _ in logged] == [steps - 1]
