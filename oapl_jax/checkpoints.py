"""Everything needed to resume an OAPL run, with orbax's CheckpointManager.

A checkpoint is taken at a sync boundary (right before the sampler refresh), where the rollout
buffer is empty by construction, so it holds:
  state  the TrainState (step, params, optimizer state), restored straight into its shardings;
  meta   JSON: syncs done, the sampler snapshot version, the data position (prompts consumed)
         and the run seed from which every rng is derived (trainer: fold_in(seed, step);
         sampler: (seed, version, chunk)).

Restore order: build the TrainState's abstract shapes and shardings -> restore `state` into them
-> read `meta` -> set the sampler's snapshot version -> refresh the sampler from the restored
params -> reset the buffer to that version -> continue with the next sync window.
"""
import dataclasses
import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp


@dataclasses.dataclass
class Meta:
  syncs_done: int  # completed windows of L trainer steps
  snapshot_version: int  # the sampler's version when the checkpoint was taken
  data_position: int  # training prompts consumed so far
  seed: int

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


class Checkpointer:
  """Thin wrapper over ocp.CheckpointManager with a (state, meta) item pair."""

  def __init__(self, directory: str, max_to_keep: int = 3):
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        item_names=("state", "meta"))

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, meta: Meta) -> None:
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    meta=ocp.args.JsonSave(meta.to_json())))

  def restore(self, abstract_state: Any, step: Optional[int] = None) -> tuple[Any, Meta]:
    """`abstract_state`: jax.ShapeDtypeStruct leaves carrying the target shardings."""
    step = self.latest_step() if step is None else step
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return restored["state"], Meta(**restored["meta"])

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def abstract_like(state: Any) -> Any:
  """ShapeDtypeStructs (with shardings) of a live state: the restore target."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
