"""configs/gsm8k.py:smoke end to end on whatever devices JAX has, with wall times; nothing from a hub.

    python -m benchmarks.gsm8k_smoke [--workdir DIR]

The checkpoint (a tiny random Qwen3), its byte-level chat tokenizer and eight GSM8K-format records
({"question", "answer": "... #### N"}) are made here, as tests/configs_test.py makes them; the run is the
config's own (setup, one window of two trainer steps, the end-of-run eval). Prints the wall time of the
set-up and of the run, and the run's summary.
"""
import argparse
import json
import os
import tempfile
import time

import jax


def make_assets(root: str):
  from tests.hf_fixtures import make_chat_tokenizer, make_hf_checkpoint
  model_dir, data = os.path.join(root, "model"), os.path.join(root, "gsm8k.jsonl")
  make_hf_checkpoint(model_dir, "qwen3", vocab_size=384)
  make_chat_tokenizer(model_dir)
  with open(data, "w") as f:
    for a in range(1, 9):
      f.write(json.dumps({"question": f"What is {a}+{a}?", "answer": f"{a}+{a}={2 * a}\n#### {2 * a}"}) + "\n")
  return model_dir, data


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workdir", help="the run's directory (default: a temporary one)")
  args = ap.parse_args(argv)
  from configs import gsm8k
  from oapl_jax.rl import loop
  from oapl_jax.run import assemble
  with tempfile.TemporaryDirectory() as root:
    model_dir, data = make_assets(root)
    c = gsm8k.get_config("smoke")
    c.model.checkpoint = model_dir
    c.task.update(tokenizer_dir=model_dir, train_path=data)
    c.task.eval_paths = {"test": data}
    workdir = os.path.expanduser(args.workdir) if args.workdir else os.path.join(root, "run")
    start = time.perf_counter()
    run = assemble.setup(c, workdir)
    setup_s = time.perf_counter() - start
    summary = loop.train(run)
    run_s = time.perf_counter() - start - setup_s
  print(f"gsm8k:smoke on {jax.devices()[0].platform} ({jax.devices()[0].device_kind}): set-up {setup_s:.1f} s, "
        f"train + eval {run_s:.1f} s; trainer steps {summary['trainer_steps']}")
  print(json.dumps({k: v for k, v in summary.items() if isinstance(v, (int, float, str))}, indent=1))


if __name__ == "__main__":
  main()
