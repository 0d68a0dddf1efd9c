"""The logits Tunix's Qwen3 gives one token sequence, as JSON (run in the Tunix venv; benchmarks/loop_bench.py
compares them with ours before any run, so the two sides train one model).

    benchmarks/.tunix_venv/bin/python -m benchmarks.tunix_logits --checkpoint WS --tokens 1,5,8,13
"""
import argparse
import json

import numpy as np

from benchmarks import tunix_worker


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--checkpoint", required=True, help="an HF directory (Tunix's safetensors loader reads it)")
  ap.add_argument("--tokens", required=True, help="comma-separated token ids")
  args = ap.parse_args(argv)
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  tokens = [int(t) for t in args.tokens.split(",")]
  model, _, mesh = tunix_worker.tunix_model(args.checkpoint)
  T = len(tokens)
  with mesh:
    out = model(jnp.asarray([tokens], jnp.int32), jnp.arange(T)[None], None, jnp.tril(jnp.ones((T, T), bool))[None])
  logits = out[0] if isinstance(out, tuple) else out
  print(json.dumps({"logits": np.asarray(logits[0], np.float32).tolist()}))


if __name__ == "__main__":
  main()
