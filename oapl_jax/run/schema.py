"""The typed run config: one section per package that uses it, each with its defaults and rules there.

    rc = from_config(cfg)      # ConfigDict / dict -> RunConfig, or ConfigError listing every bad field
    rc = from_run_dir(workdir) # the config a run directory recorded (run_dir.record_config), typed
    cfg = defaults()           # the ConfigDict every configs/*.py starts from (config_base.base_config)
    record = to_mapping(rc)    # plain JSON-ready dicts; from_config(record) gives rc back

Section owners: model -> models/factory.ModelSpec (architecture source + models/execution.Execution),
task -> tasks/factory (each task's own settings, by name), warmstart -> rl/warmstart, trainer ->
rl/trainer (its loss's settings: objectives/), sampler -> sampler/settings, loop -> rl/schedule,
eval -> evaluation, checkpoint -> checkpoints, validation -> tasks/problem_checks, monitors ->
rl/monitors, mesh -> parallel, report -> event_writers, offline (optional) -> rl/offline.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from ml_collections import ConfigDict

from oapl_jax import run_dir, sections
from oapl_jax.checkpoints import CheckpointConfig
from oapl_jax.event_writers import ReportConfig
from oapl_jax.evaluation import EvalConfig
from oapl_jax.models.factory import ModelSpec
from oapl_jax.parallel import MeshConfig
from oapl_jax.rl.monitors import MonitorConfig
from oapl_jax.rl.offline import OfflineConfig
from oapl_jax.rl.schedule import LoopConfig
from oapl_jax.rl.trainer import TrainConfig
from oapl_jax.rl.warmstart import WarmStartConfig
from oapl_jax.sampler.settings import SamplerConfig
from oapl_jax.tasks import factory as task_factory
from oapl_jax.tasks.problem_checks import ValidationConfig


def _task(section, path: str, problems: sections.Problems, _values) -> Any:
  settings = task_factory.settings_of(section, problems)
  return sections.MISSING if settings is None else settings


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The run config: its sections, of which `task` holds the chosen task's settings (task.name picks the task)
  and trainer.loss_settings one entry per loss (trainer.loss picks the one read)."""
  seed: int = sections.rule(0, low=0)  # every random draw of the run: a preset's init, data order, sampling, eval
  model: ModelSpec = ModelSpec()
  task: Any = sections.rule(None, convert=_task)  # the task's typed settings (tasks/factory.TASKS)
  warmstart: WarmStartConfig = WarmStartConfig()
  trainer: TrainConfig = TrainConfig()
  sampler: SamplerConfig = SamplerConfig()
  loop: LoopConfig = LoopConfig()
  eval: EvalConfig = EvalConfig()
  checkpoint: CheckpointConfig = CheckpointConfig()
  validation: ValidationConfig = ValidationConfig()
  monitors: MonitorConfig = MonitorConfig()
  mesh: MeshConfig = MeshConfig()
  report: ReportConfig = ReportConfig()
  offline: Optional[OfflineConfig] = None  # the two-stage offline mode (rl/offline.py), when present

  @property
  def is_offline(self) -> bool:
    return self.offline is not None


# Fields earlier versions recorded (a run's config.json) that no longer exist: (section, field) -> why.
RETIRED = {("model", "logprob_chunk"): "positions per chunk, every row; now model.logprob_chunk_tokens (tokens per "
                                       "chunk, rows and positions): the recorded value is dropped for the default"}


def _drop_retired(values: dict) -> dict:
  for (section, field), why in RETIRED.items():
    if isinstance(values.get(section), dict) and field in values[section]:
      values = {**values, section: {k: v for k, v in values[section].items() if k != field}}
      logging.warning("config: %s.%s is retired (%s)", section, field, why)
  return values


def from_config(cfg: Any) -> RunConfig:
  """A resolved config (ConfigDict or nested dicts, e.g. a run's config.json) as the typed RunConfig;
  raises sections.ConfigError listing every bad field. The cross-section rules are check.check's."""
  if isinstance(cfg, RunConfig):
    return cfg
  problems = sections.Problems()
  values = cfg.to_dict() if hasattr(cfg, "to_dict") else cfg
  values = _drop_retired(values) if isinstance(values, dict) else values
  if isinstance(values, dict) and "task" not in values:
    problems.add("task", sections.MISSING, "missing from the config (e.g. config_base.arithmetic_task(...))")
  rc = sections.build(RunConfig, values, "", problems)
  problems.raise_if_any()
  return rc


def from_run_dir(workdir: str) -> RunConfig:
  """The config a run directory recorded, typed (from_config: a bad or retired field is said as such)."""
  values = run_dir.recorded_config(workdir)
  if values is None:
    raise FileNotFoundError(f"{workdir} has no {run_dir.CONFIG_JSON}: it was not started by oapl_jax.main (or by a "
                            "version that did not record its config); pass the config explicitly (--config FILE:ARG)")
  return from_config(values)


def to_mapping(rc: RunConfig) -> dict:
  """rc as plain dicts, the chosen loss's settings under trainer.loss_settings.<loss>."""
  out = sections.to_mapping(rc)
  out["trainer"]["loss_settings"] = {rc.trainer.loss: sections.to_mapping(rc.trainer.loss_settings)}
  out["task"] = dict(rc.task) if isinstance(rc.task, dict) else sections.to_mapping(rc.task)
  out["offline"] = None if rc.offline is None else sections.to_mapping(rc.offline)
  return out


def defaults() -> ConfigDict:
  """Every section's defaults (no task: a config picks one), every loss's settings listed."""
  values = sections.to_mapping(RunConfig())
  values["trainer"]["loss_settings"] = TrainConfig.default_loss_settings()
  del values["task"], values["offline"]
  return ConfigDict(values)


def task_section(kind: type, **values) -> ConfigDict:
  """A task section from its settings' defaults and `values` (config_base's helpers)."""
  return ConfigDict(sections.to_mapping(sections.build(kind, values, "task")))
