"""The `model` config section (ModelSpec) -> a CausalLM and its params: an HF checkpoint or a preset."""
import dataclasses
import os
import re
from typing import Optional

import jax

from oapl_jax import parallel, sections
from oapl_jax.models import api, hf
from oapl_jax.models.decoder_config import DecoderConfig
from oapl_jax.models.execution import EXECUTION_FIELDS, Execution
from oapl_jax.models.families import PRESETS


@dataclasses.dataclass(frozen=True)
class ModelSpec(Execution):
  """The `model` section: what the network is (an HF checkpoint directory of any family in
  models/families.py, its family from config.json's model_type; else a preset of any family, with
  architecture overrides) and how it runs (the Execution fields: dtypes, remat, attention kernel)."""
  checkpoint: str = ""  # an HF directory (then preset is ignored); '' = the preset from random weights
  preset: str = sections.rule("tiny", choices=tuple(PRESETS))  # a named architecture (models/families.py)
  overrides: dict = dataclasses.field(default_factory=dict)  # architecture fields of the preset

  def __post_init__(self):
    super().__post_init__()
    pinned = sorted(set(self.overrides) & set(EXECUTION_FIELDS))
    if pinned:
      raise ValueError(f"model.overrides sets {pinned}: how the model runs is set once, as model.{pinned[0]}")

  @property
  def execution(self) -> Execution:
    return Execution(**{name: getattr(self, name) for name in EXECUTION_FIELDS})

  @property
  def checkpoint_dir(self) -> str:
    return os.path.abspath(os.path.expanduser(self.checkpoint)) if self.checkpoint else ""


def architecture(spec: ModelSpec, *, preset_when_absent: bool = False) -> DecoderConfig:
  """The model's config without weights: the checkpoint's config.json, else the preset + overrides;
  run as spec's execution says. preset_when_absent: a checkpoint that is not on this host (compiling
  for a pod from a laptop) is read as the preset its name matches (Qwen3-4B-Thinking-2507 ->
  qwen3_4b_thinking_2507). Raises ValueError (hf.CheckpointError) naming the field."""
  path = spec.checkpoint_dir
  if path and (os.path.isdir(path) or not preset_when_absent):
    if not os.path.isdir(path):
      raise ValueError(f"model.checkpoint={spec.checkpoint!r}: not a directory")
    return hf.read_config(path, **spec.overrides).replace(execution=spec.execution)
  name = spec.preset
  if path:
    name = preset_named(os.path.basename(path.rstrip("/")))
    if name is None:
      raise ValueError(f"model.checkpoint={spec.checkpoint} is not here and its name matches no preset; pass "
                       f"--config.model.checkpoint= --config.model.preset=NAME (one of {sorted(PRESETS)})")
  base = PRESETS[name]()
  unknown = sorted(set(spec.overrides) - {f.name for f in dataclasses.fields(base)})
  if unknown:
    raise ValueError(f"model.overrides.{unknown[0]}: not a model setting; known: "
                     f"{sorted(f.name for f in dataclasses.fields(base) if f.name != 'execution')}")
  return base.replace(**spec.overrides, execution=spec.execution)


def _name_key(name: str) -> str:
  """Qwen2.5-7B, qwen2p5_7b -> qwen257b; Llama-3.2-1B, llama3_2_1b -> llama321b."""
  return re.sub(r"(?<=\d)p(?=\d)", "", re.sub(r"[^a-z0-9]", "", name.lower()))


def preset_named(directory_name: str) -> Optional[str]:
  """The preset a hub-style checkpoint name stands for (case, '-', '_' and '.' aside), or None."""
  matches = [preset for preset in PRESETS if _name_key(preset) == _name_key(directory_name)]
  return matches[0] if len(matches) == 1 else None


def model_of(spec: ModelSpec, *, preset_when_absent: bool = False) -> api.CausalLM:
  return api.for_config(architecture(spec, preset_when_absent=preset_when_absent))


def load_pretrained(path: str, layout: parallel.Layout, **execution):
  """(CausalLM, params) from an HF checkpoint directory, each device reading only its own blocks;
  `execution`: Execution fields (param_dtype, dtype, remat, attention, ...)."""
  execution = dict(execution)
  param_dtype, dtype = execution.pop("param_dtype", "float32"), execution.pop("dtype", None)
  config, params = hf.load(os.path.abspath(os.path.expanduser(path)), mesh=layout.mesh, dtype=param_dtype,
                           compute_dtype=dtype, rules=layout.rules, **execution)
  return api.for_config(config), params


def build_model(spec: ModelSpec, layout: parallel.Layout, seed: int, config: Optional[DecoderConfig] = None):
  """(CausalLM, params born sharded on `layout`): the checkpoint's weights, or the preset's from `seed`."""
  config = config or architecture(spec)
  if spec.checkpoint:
    loaded, params = load_pretrained(spec.checkpoint_dir, layout, **spec.overrides,
                                     **dataclasses.asdict(config.execution))
    return loaded, params
  model = api.for_config(config)
  params, _ = parallel.init_sharded(lambda: model.init_params(jax.random.PRNGKey(seed)), layout.mesh, layout.rules)
  return model, params
