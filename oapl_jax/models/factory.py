"""Model params from the `model` section of an experiment config: an HF checkpoint or a preset."""
import os
from typing import Any, Mapping

import jax

from oapl_jax import parallel
from oapl_jax.models import hf, qwen
from oapl_jax.models.config import QwenConfig, preset


def build_model(cfg: Mapping[str, Any], mesh, rules, seed: int):
  """(QwenConfig, params born sharded on `mesh`).

  cfg.checkpoint: an HF directory to load (then cfg.preset is ignored), or '' to initialise
  cfg.preset (+ cfg.overrides) from random weights.
  """
  dtypes = dict(param_dtype=cfg["param_dtype"], dtype=cfg["dtype"], remat=cfg["remat"])
  if cfg["checkpoint"]:
    path = os.path.expanduser(cfg["checkpoint"])
    if not os.path.isdir(path):
      raise FileNotFoundError(f"config field model.checkpoint: {path} is not a directory")
    return hf.load(path, mesh=mesh, dtype=cfg["param_dtype"], compute_dtype=cfg["dtype"],
                   rules=rules, remat=cfg["remat"])
  config: QwenConfig = preset(cfg["preset"], **dict(cfg["overrides"]), **dtypes)
  params, _ = parallel.init_sharded(lambda: qwen.init_params(config, jax.random.PRNGKey(seed)), mesh, rules)
  return config, params
