"""Fetch a Qwen or Llama checkpoint or a data set and check it the way a run will read it.

  oapl-prepare model Qwen/Qwen3-0.6B --out ~/models/Qwen3-0.6B [--revision REV]   # hub id, or a local directory
  oapl-prepare data gsm8k --out ~/data/gsm8k                       # gsm8k | math | deepscaler | livecodebench
  oapl-prepare data gsm8k --out ~/data/gsm8k --source raw/gsm8k/   # the published files, already on this host
  oapl-train --config configs/gsm8k.py --workdir runs/gsm8k        # reads ~/models/Qwen3-0.6B and ~/data/gsm8k

Offline: HF_HUB_OFFLINE=1 resolves hub ids from the local cache (HF_HUB_CACHE).
"""
from __future__ import annotations

import json
import sys
from typing import Optional, Sequence

from oapl_jax.apps import cli

cli.prepare_host()

from oapl_jax.models.hf import CheckpointError  # noqa: E402
from oapl_jax.prepare import data, model  # noqa: E402
from oapl_jax.prepare.hub import PrepareError  # noqa: E402

_SHOWN = 200  # characters of each field of the sample record


def _model(args) -> int:
  path = model.fetch(args.source, args.out, args.revision)
  print(model.describe(model.verify(path)))
  return 0


def _data(args) -> int:
  written = data.prepare(args.name, args.out, sources=args.source or (), revision=args.revision,
                         dev_size=args.dev_size, seed=args.seed)
  for w in written:
    print(f"  {w.split:5s} {w.count:7d} records  {w.path}" + (f"  ({w.note})" if w.note else ""))
  missing = sorted({part.split for part in data.SOURCES[args.name].parts} - {w.split for w in written})
  for split in missing:  # a local source given as one file fills train only; the configs evaluate on test.jsonl
    print(f"warning: no {split} split written: the configs read {args.out}/{split}.jsonl; give it with "
          f"--source {split}=PATH (the published {split} file)", file=sys.stderr)
  with open(written[0].path, encoding="utf-8") as f:
    sample = json.loads(f.readline())
  print(f"sample ({written[0].split}[0]):")
  for key, value in sample.items():
    text = value if isinstance(value, str) else json.dumps(value)
    print(f"  {key}: {text[:_SHOWN]!r}" + (" ..." if len(text) > _SHOWN else ""))
  return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = cli.parser("oapl-prepare", __doc__)
  verbs = p.add_subparsers(dest="verb", required=True)
  m = verbs.add_parser("model", help="download (or take a local) Qwen or Llama checkpoint and load it with our loader")
  m.add_argument("source", help="hub repo id (Qwen/Qwen3-0.6B) or a local checkpoint directory")
  m.add_argument("--out", help="where the checkpoint goes (default: ~/models/NAME; a local source: verified in place)")
  m.add_argument("--revision", help="hub branch, tag or commit (default: main)")
  d = verbs.add_parser("data", help="write a data set's train/dev/test JSONL as the configs read them")
  d.add_argument("name", choices=sorted(data.SOURCES))
  d.add_argument("--out", required=True, help="directory for train.jsonl, dev.jsonl, test.jsonl")
  d.add_argument("--source", action="append", metavar="[SPLIT=]PATH",
                 help="read local files of the published format instead of the hub (repeatable)")
  d.add_argument("--revision", help="hub revision of the data set (default: main)")
  d.add_argument("--dev_size", type=int, default=500, help="records carved from train for dev (at most a tenth)")
  d.add_argument("--seed", type=int, default=0, help="seed of the dev slice")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  try:
    return _model(args) if args.verb == "model" else _data(args)
  except (PrepareError, CheckpointError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def run() -> None:
  """Console script entry point (oapl-prepare)."""
  cli.run(main)


if __name__ == "__main__":
  run()
