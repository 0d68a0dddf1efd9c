"""A run's checkpoints and their health, without building the model (oapl_jax/checkpoint_files.py).

  oapl-checkpoints list runs/demo           # a run dir or its checkpoints/ dir
  oapl-checkpoints list runs/demo --deep    # also check every crc32 and read every array into host memory

Exit status: 0 when every committed step is healthy, 1 when one is damaged, 2 for a bad path.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

from oapl_jax.apps import cli

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a listing must not take the accelerators a running job holds

from oapl_jax import checkpoint_files  # noqa: E402

META_FIELDS = ("syncs_done", "snapshot_version", "data_position", "seed")


def format_table(table: list[dict]) -> str:
  columns = ("step", "size", *META_FIELDS, "health")
  cells = [[row.get(c, "-") for c in columns] for row in table]
  widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
  line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()
  return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = cli.parser("oapl-checkpoints", __doc__)
  commands = p.add_subparsers(dest="command", required=True)
  listing = commands.add_parser("list", help="a table of the checkpoints with their health")
  listing.add_argument("path", help="a run directory (with checkpoints/) or a checkpoint directory")
  listing.add_argument("--deep", action="store_true",
                       help="also check every file's crc32 and restore every step's arrays to host numpy")
  args, _ = cli.parse(p, argv)
  directory = checkpoint_files.resolve(args.path)
  table = checkpoint_files.rows(directory, deep=args.deep)
  print(f"checkpoints in {directory}\n{format_table(table)}")
  return 0 if all(row["ok"] for row in table) else 1


def run() -> None:
  """Console script entry point (oapl-checkpoints)."""
  cli.run(main)


if __name__ == "__main__":
  run()
