"""Where a decode step's time goes: XLA's own per-op trace of the sampler's jitted decode loop, by source op.

    python -m benchmarks.decode_profile                                          # tiny model, 64 slots
    python -m benchmarks.decode_profile --width qwen3_0p6b --layers 4 --batch 64  # real width

Compiles `Sampler.decode` for --steps steps at a full batch, runs it once to warm up, then once under
`jax.profiler.trace`. The trace's events (XLA thunks, one per fused op, on whichever thread ran them) are summed by
name and labelled with the op they came from (the `op_name` of the fusion in the compiled HLO; the same op in every
layer adds up), then printed as thread-milliseconds per decode step and as a share of the step's wall time. XLA
runs independent thunks on several threads, so the shares can add up to more than 100%. A benchmark, not a test.
"""
import argparse
import collections
import glob
import re
import tempfile
import time

import jax
import numpy as np
from jax.profiler import ProfileData

from benchmarks import random_models
from oapl_jax.models import api, hf
from oapl_jax.run import compile_check
from oapl_jax.sampler import core
from oapl_jax.sampler.settings import SamplingSettings

_OP_NAME = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = .*?op_name="([^"]+)"', re.M)
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = ', re.M)


def op_labels(hlo_text: str) -> dict[str, str]:
  """Instruction name -> the JAX op it came from, without the jit/while prefixes."""
  return {name: re.sub(r"^jit\([^)]*\)/(while/body/)?", "", op) for name, op in _OP_NAME.findall(hlo_text)}


def thread_times(profile: ProfileData, instructions) -> collections.Counter:
  """Summed self-time nanoseconds per HLO instruction, over every thread of the trace.

  XLA usually runs thunks on its `tf_XLAEigen` pool, but on a loaded host it runs some inline on the calling
  thread, so every thread counts. Only events named after an instruction of the compiled program count (not
  the executor's own wrappers), and each by its self time: a thunk that ran its body inline (a while, a cond)
  does not count its body twice."""
  totals = collections.Counter()
  for plane in profile.planes:
    for line in plane.lines:
      events = sorted((e for e in line.events if e.name in instructions), key=lambda e: (e.start_ns, -e.end_ns))
      open_events = []  # [name, end_ns, self_ns] of the enclosing events
      for event in events + [None]:
        while open_events and (event is None or event.start_ns >= open_events[-1][1]):
          name, _, self_ns = open_events.pop()
          totals[name] += self_ns
        if event is None:
          break
        if open_events:
          open_events[-1][2] -= event.duration_ns
        open_events.append([event.name, event.end_ns, event.duration_ns])
  return totals


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--width", choices=sorted(random_models.WIDTHS), default="tiny")
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--prompt_length", type=int, default=8)
  ap.add_argument("--cache_len", type=int, default=144, help="decode over a cache of this many positions")
  ap.add_argument("--steps", type=int, default=8)
  ap.add_argument("--top", type=int, default=15)
  args = ap.parse_args(argv)

  with tempfile.TemporaryDirectory() as tmp:
    random_models.make_checkpoint(tmp, hf_config=random_models.hf_config(args.width, args.layers))
    config, params = hf.load(tmp)
  S = args.batch
  sampler = core.Sampler(api.for_config(config), num_slots=S, max_prefill_length=max(16, args.prompt_length),
                         max_new_tokens=args.cache_len)
  sampler.refresh(params)
  prompts = np.random.RandomState(0).randint(0, config.vocab_size, (S, args.prompt_length)).tolist()
  settings = SamplingSettings(max_new_tokens=args.cache_len - args.prompt_length)
  state = sampler.init_decode_state(settings, max_len=args.cache_len)
  state = sampler.insert(sampler.prefill(sampler.params, prompts), state, range(S), range(S),
                         sampler.sample_keys(0, range(S), [0] * S))
  steps = np.int32(args.steps)
  with sampler.layout.context():
    with compile_check.without_persistent_cache():  # the op names read below are the current source's
      compiled = sampler._decode.lower(sampler.params, state, steps).compile()
  hlo_text = compiled.as_text()
  labels = op_labels(hlo_text)
  state = jax.block_until_ready(compiled(sampler.params, state, steps))  # warm-up
  with tempfile.TemporaryDirectory() as trace_dir:
    start = time.perf_counter()
    with jax.profiler.trace(trace_dir):
      state = jax.block_until_ready(compiled(sampler.params, state, steps))
    wall_ms = (time.perf_counter() - start) * 1e3 / args.steps
    profile = ProfileData.from_file(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[-1])
    totals = thread_times(profile, set(_INSTRUCTION.findall(hlo_text)))

  print(f"{args.width} Qwen3, {config.num_layers} layers, vocab {config.vocab_size}; {S} slots, cache "
        f"{args.cache_len}; {args.steps} steps traced: {wall_ms:.1f} ms a step (wall, profiler on)")
  by_op, fusions = collections.Counter(), collections.Counter()
  for name, ns in totals.items():  # one op's fusions in every layer add up under its label
    by_op[labels.get(name, name)] += ns
    fusions[labels.get(name, name)] += 1
  print(f"{'thread ms/step':>14} {'% of wall':>9} {'fusions':>7}  op")
  for op, ns in by_op.most_common(args.top):
    ms = ns / 1e6 / args.steps
    print(f"{ms:>14.2f} {ms / wall_ms:>9.1%} {fusions[op]:>7}  {op}")
  all_ms = sum(by_op.values()) / 1e6 / args.steps
  print(f"{all_ms:>14.2f} {all_ms / wall_ms:>9.1%} {len(totals):>7}  all ops")


if __name__ == "__main__":
  main()
