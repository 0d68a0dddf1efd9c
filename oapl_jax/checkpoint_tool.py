"""A run's checkpoints and their health, without building the model.

    table = rows(resolve("runs/demo"), deep=False)   # CLI: oapl-checkpoints list RUN_DIR [--deep] (apps/)
    print(format_table(table))

Health comes from the files alone (their sizes against the record taken at save, meta JSON,
orbax's list of saved arrays; see checkpoint_files.py); --deep also checks every file's crc32 and
restores each step's arrays to host numpy. Steps moved aside by a
restore (damaged/) and interrupted saves (orbax tmp directories) are listed after the steps.
"""
import jax
from etils import epath

from oapl_jax import checkpoint_files

META_FIELDS = ("syncs_done", "snapshot_version", "data_position", "seed")


def resolve(path: str) -> epath.Path:
  """A run dir (holding checkpoints/) or a checkpoint dir; raises FileNotFoundError otherwise."""
  given = checkpoint_files.absolute(path)
  for candidate in (given / "checkpoints", given):
    steps, interrupted = checkpoint_files.step_dirs(candidate)
    if steps or interrupted or (candidate / checkpoint_files.DAMAGED_DIR).is_dir():
      return candidate
  raise FileNotFoundError(f"{path} holds no checkpoints (looked for step directories in {given / 'checkpoints'} and {given})")


def human_size(num_bytes: int) -> str:
  for unit in ("B", "KiB", "MiB", "GiB"):
    if num_bytes < 1024 or unit == "GiB":
      return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
    num_bytes /= 1024
  raise AssertionError("unreachable")


def _meta_cells(step_dir: epath.Path, step: int) -> dict:
  try:
    return {k: str(v) for k, v in checkpoint_files.read_meta(step_dir, step).to_json().items()}
  except checkpoint_files.DamagedCheckpoint:
    return {}


def _step_row(step: int, step_dir: epath.Path, deep: bool) -> dict:
  row = {"step": str(step), "size": human_size(sum(checkpoint_files.list_files(step_dir).values())), "ok": False,
         **_meta_cells(step_dir, step)}
  try:
    _, saved = checkpoint_files.check_files(step_dir, step)
    if deep:
      tree, _ = checkpoint_files.restore_to_host(step_dir, step)
      arrays = jax.tree.leaves(tree)
      row["health"] = f"ok (read {len(arrays)} arrays, {human_size(sum(a.nbytes for a in arrays))})"
    elif (step_dir / checkpoint_files.RECORD).exists():
      row["health"] = f"ok ({len(saved)} arrays, file sizes as saved; --deep checks contents)"
    else:
      row["health"] = f"ok? ({len(saved)} arrays; no file record, data unchecked: use --deep)"
    row["ok"] = True
  except checkpoint_files.DamagedCheckpoint as d:
    row["health"] = f"DAMAGED: {d.detail}"
  return row


def rows(directory: epath.Path, deep: bool = False) -> list[dict]:
  """One dict per committed step, moved-aside step and interrupted save (string values, plus `ok`)."""
  steps, interrupted = checkpoint_files.step_dirs(directory)
  table = [_step_row(step, path, deep) for step, path in steps.items()]
  aside = directory / checkpoint_files.DAMAGED_DIR
  for path in sorted(aside.iterdir()) if aside.is_dir() else ():
    if path.is_dir():
      reason = epath.Path(f"{path}{checkpoint_files.REASON_SUFFIX}")
      why = reason.read_text().strip() if reason.exists() else path.name
      step = path.name.split("-")[0]
      table.append({"step": step, "size": human_size(sum(checkpoint_files.list_files(path).values())),
                    "health": f"moved aside to {checkpoint_files.DAMAGED_DIR}/{path.name}: {why}", "ok": True,
                    **(_meta_cells(path, int(step)) if step.isdigit() else {})})
  for path in interrupted:
    table.append({"step": path.name.split(".")[0], "size": human_size(sum(checkpoint_files.list_files(path).values())),
                  "health": f"interrupted save {path.name} (never committed; ignored)", "ok": True})
  return table


def format_table(table: list[dict]) -> str:
  columns = ("step", "size", *META_FIELDS, "health")
  cells = [[row.get(c, "-") for c in columns] for row in table]
  widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
  line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()
  return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])
