"""Do the sampler and the trainer overlap? The same run with rollouts in their own thread (the loop's
default) and inline in the trainer's thread (what several CPU processes must use), side by side.

    python -m benchmarks.overlap_bench                 # 8 fake CPU devices: trainer 0-3, sampler 4-7
    python -m benchmarks.overlap_bench --rounds 3 --config configs/claims.py:chain,smoke

Each round runs both modes (alternating which goes first) from the same config and seed in fresh
workdirs after one warm-up run of each (compiles). It prints, per mode, the median wall seconds of
`loop.train`, the trainer's summed wait for rollouts (`train/wait_seconds`) and the sampler's summed
generation time (`rollout/seconds`), and the ratio inline / threaded: 1.0 means no overlap, and the
most overlap can give is (train + generate) / max(train, generate). Both modes must log the same
losses (the worker's chunks and seeds do not depend on the thread), which it checks.
A benchmark, not a test; on a machine with few cores both sides also share the CPU.
"""
import argparse
import contextlib
import io
import json
import os
import statistics
import tempfile
import time

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
from oapl_jax import fake_devices  # noqa: E402  (imports nothing of JAX)
fake_devices.make_room_for_collectives()

from oapl_jax.run import assemble, files  # noqa: E402
from oapl_jax.rl import loop  # noqa: E402


def load_config(spec: str, sampler_devices: int, num_syncs: int):
  cfg = files.load(spec)
  cfg.mesh.sampler_devices = sampler_devices
  cfg.loop.num_syncs = num_syncs
  cfg.loop.eval_every_syncs = 1_000_000  # generation for training only (one eval at the start)
  cfg.checkpoint.every_syncs = 1_000_000
  return cfg


def run_once(cfg, inline: bool, root: str) -> dict:
  workdir = tempfile.mkdtemp(dir=root)
  run = assemble.setup(cfg, workdir)
  start = time.perf_counter()
  with contextlib.redirect_stdout(io.StringIO()):
    loop.train(run, inline_rollouts=inline)
  seconds = time.perf_counter() - start
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    history = [json.loads(line) for line in f]
  total = lambda key: sum(h.get(key, 0.0) for h in history)  # noqa: E731
  return dict(seconds=seconds, wait=total("train/wait_seconds"), generate=total("rollout/seconds"),
              losses=[h["train/loss"] for h in history if "train/loss" in h])


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/arithmetic.py:smoke")
  parser.add_argument("--sampler_devices", type=int, default=4)
  parser.add_argument("--num_syncs", type=int, default=4)
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  cfg = load_config(args.config, args.sampler_devices, args.num_syncs)
  steps = cfg.loop.sync_every * cfg.loop.num_syncs
  print(f"{args.config}: {steps} trainer steps in {cfg.loop.num_syncs} windows; sampler on "
        f"{args.sampler_devices} of 8 CPU devices; {os.cpu_count()} CPU cores", flush=True)
  results = {True: [], False: []}
  with tempfile.TemporaryDirectory() as root:
    for inline in (False, True):  # warm-up: compiles
      run_once(cfg, inline, root)
    for r in range(args.rounds):
      for inline in ((False, True) if r % 2 == 0 else (True, False)):
        results[inline].append(run_once(cfg, inline, root))
        print(f"round {r + 1}/{args.rounds} {'inline' if inline else 'thread'}: "
              f"{results[inline][-1]['seconds']:.2f}s", flush=True)
  if results[True][0]["losses"] != results[False][0]["losses"]:
    raise AssertionError("inline and threaded rollouts logged different losses")
  print(f"\n{'rollouts':8} {'train() s':>10} {'trainer waited s':>17} {'generating s':>13}")
  medians = {}
  for inline, name in ((False, "thread"), (True, "inline")):
    med = {k: statistics.median(x[k] for x in results[inline]) for k in ("seconds", "wait", "generate")}
    medians[name] = med
    print(f"{name:8} {med['seconds']:>10.2f} {med['wait']:>17.2f} {med['generate']:>13.2f}")
  print(f"\ninline / thread wall time: {medians['inline']['seconds'] / medians['thread']['seconds']:.2f}x "
        f"(losses identical in both modes: yes)")


if __name__ == "__main__":
  main()
