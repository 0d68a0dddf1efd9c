"""Write a Hugging Face directory from any checkpoint of a run (oapl_jax/run/export.py does the work).

  oapl-export runs/demo /tmp/demo_hf                 # the newest checkpoint
  oapl-export runs/demo /tmp/demo_hf --step 40       # a given one (oapl-checkpoints list runs/demo)
  oapl-export RUN_DIR OUT_DIR --config configs/X.py[:ARG]   # a run directory without config.json

The directory loads with transformers alone (AutoTokenizer, AutoModelForCausalLM). Neither the task's data
nor its reward is read.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

from oapl_jax.apps import cli

cli.prepare_host()

from oapl_jax.run import export  # noqa: E402


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = cli.parser("oapl-export", __doc__)
  p.add_argument("run_dir", help="a run directory (holds checkpoints/ and config.json)")
  p.add_argument("out_dir", help="the Hugging Face directory to write")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest)")
  p.add_argument("--weights_only", action="store_true",
                 help="export even when the run's tokenizer cannot be written as HF tokenizer files")
  cli.add_config(p)
  args, cfg = cli.parse(p, argv)
  out_dir = os.path.abspath(os.path.expanduser(args.out_dir))
  try:
    info = export.export(args.run_dir, out_dir, args.step, cfg, weights_only=args.weights_only)
  except export.TokenizerNotExportable as e:
    p.error(str(e))
  print(f"exported step {info['step']} ({info['syncs_done']} sync windows) of {info['run_dir']} to {out_dir}")
  print(f"  token ids: {info['token_ids']}")
  print(f"  tokenizer: {info['tokenizer']}")
  if "prompt_suffix" in info:
    print(f"  prompts: the run appended {info['prompt_suffix']!r} to each before encoding it")
  return 0


def run() -> None:
  """Console script entry point (oapl-export)."""
  cli.run(main)


if __name__ == "__main__":
  run()
