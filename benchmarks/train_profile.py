"""Where a train step's time goes: XLA's own per-op trace of the jitted OAPL train step, by source op and by kind.

    python -m benchmarks.train_profile                                    # tiny model, 8 x 8 x 128
    python -m benchmarks.train_profile --width qwen3_0p6b --layers 4 --batch 2 --group 4 --seq_len 256 --keep_logits
                                                                          # train_bench's real-width shape

Builds the step as benchmarks/train_bench does (same batch, loss, AdamW), compiles it, runs it twice to warm up,
then --steps times under `jax.profiler.trace`. Thread time per HLO instruction (benchmarks/decode_profile.py's
parse: every thread, self time) is summed by the JAX op it came from and printed as thread-seconds per step and as
a share of all the thread time, then summed again by kind (`kind_of`): the matmuls (the vocabulary projection's
forward and gradients, the layers'), the vocabulary's softmax passes, the optimizer, copies and transposes, the
other elementwise work. XLA runs independent thunks on several threads, so thread time can exceed wall time; the
shares are of thread time. A benchmark, not a test.
"""
import argparse
import collections
import glob
import re
import tempfile
import time

import jax
from jax.profiler import ProfileData

from benchmarks import decode_profile, random_models, train_bench
from oapl_jax import host_memory, objectives, parallel
from oapl_jax.models import api, hf
from oapl_jax.rl import batch_spec, trainer
from oapl_jax.rl.optim import OptimConfig
from oapl_jax.run import compile_check

_COPIES = {"transpose", "copy", "dynamic_slice", "dynamic_update_slice", "concatenate", "gather", "scatter", "pad",
           "slice", "broadcast_in_dim", "reshape", "bitcast", "broadcast"}
_CONTROL = {"while", "call", "closed_call", "conditional", "cond", "tuple"}


def kind_of(label: str, instruction: str) -> str:
  """The kind of work an HLO instruction does, from its source op's label (op_name without the jit prefix; the
  instruction's own name where it has none) and the instruction's name.

  The vocabulary's chunks (models/vocab_logprobs.py, a custom_vjp whose work runs under a cond that skips dead
  chunks) read `jvp()/[while/body/closed_call/]cond/branch_1_fun/...` forward and the same under `transpose(jvp())`
  backward: the while is the map over whole chunks, the tails run outside it."""
  op = label.rsplit("/", 1)[-1]
  primitive = re.sub(r"[.\d]+$", "", op).replace("wrapped_", "")
  in_vocab = bool(re.search(r"logits|lm_head|embed\.attend|^(transpose\()?jvp\(\)\)?/(while/body/closed_call/)?"
                            r"cond/branch_1_fun/", label))
  if op == "dot_general" or re.match(r"(dot|convolution)[.\d]*$", instruction):
    if in_vocab:
      return "matmul: vocabulary projection (fwd, grads)"
    return "matmul: attention scores/values" if "->" in label else "matmul: layer projections"
  if in_vocab:
    return "vocabulary softmax / log-prob passes"
  if primitive in _COPIES or "dynamic_index" in label or "dynamic_update_index" in label:
    return "copies, transposes, slices"
  if primitive in _CONTROL:
    return "control (while, call, cond: self time)"
  if "Decoder" in label:
    return "layer elementwise (norms, rotary, SiLU, attention softmax)"
  return "outside the model (optimizer, grad norms, loss)"


def build_step(width, layers, B, G, T, keep_logits, temperature=1.0):
  """(the jitted train step, its state, its device batch) from a random checkpoint, as train_bench builds them."""
  batch = train_bench.make_batch(B, G, T, random_models.hf_config(width, layers).vocab_size)
  with tempfile.TemporaryDirectory() as ckpt:
    random_models.make_checkpoint(ckpt, hf_config=random_models.hf_config(width, layers))
    mesh = parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1])
    model_config, params = hf.load(ckpt, mesh=mesh, dtype="float32", compute_dtype="float32")
  model_config = model_config.replace(logprob_recompute=not keep_logits)
  config = trainer.TrainConfig(
      loss="oapl", loss_settings=objectives.OAPLSettings(beta1=train_bench.BETA1, beta2=train_bench.BETA2),
      temperature=temperature, optim=OptimConfig(lr=train_bench.LR, b1=0.9, b2=0.999, eps=1e-8,
                                                 max_grad_norm=train_bench.MAX_GRAD_NORM))
  model, layout = api.for_config(model_config), parallel.Layout(mesh)
  state = trainer.create_train_state(config, model, params, layout)
  step = trainer.make_train_step(config, model, layout)
  batch_dev = batch_spec.put(batch, batch_spec.train_batch(B, G, T, layout))
  return step, state, batch_dev, model_config


def profile_step(step, state, batch, steps, hlo_out=None):
  """(thread ns per instruction over `steps` steps, instruction -> label, wall seconds per step, the new state)."""
  rng = jax.random.PRNGKey(0)
  with compile_check.without_persistent_cache():  # the op names read below are the current source's
    compiled = step.lower(state, batch, rng).compile()
  hlo_text = compiled.as_text()
  if hlo_out:
    with open(hlo_out, "w") as f:
      f.write(hlo_text)
  for _ in range(2):  # warm-up: the first runs grow the heap
    state, _ = compiled(state, batch, rng)
  jax.block_until_ready(state)
  with tempfile.TemporaryDirectory() as trace_dir:
    start = time.perf_counter()
    with jax.profiler.trace(trace_dir):
      for _ in range(steps):
        state, _ = compiled(state, batch, rng)
      jax.block_until_ready(state)
    wall_s = (time.perf_counter() - start) / steps
    profile = ProfileData.from_file(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[-1])
    totals = decode_profile.thread_times(profile, set(decode_profile._INSTRUCTION.findall(hlo_text)))
  return totals, decode_profile.op_labels(hlo_text), wall_s, state


def summarize(totals, labels):
  """(thread ns by label, fusions by label, thread ns by kind)."""
  by_op, fusions, by_kind = collections.Counter(), collections.Counter(), collections.Counter()
  for name, ns in totals.items():
    label = labels.get(name, name)
    by_op[label] += ns
    fusions[label] += 1
    by_kind[kind_of(label, name)] += ns
  return by_op, fusions, by_kind


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--width", choices=sorted(random_models.WIDTHS), default="tiny")
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--group", type=int, default=8)
  ap.add_argument("--seq_len", type=int, default=128)
  ap.add_argument("--keep_logits", action="store_true", help="model.logprob_recompute=False, as train_bench's flag")
  ap.add_argument("--steps", type=int, default=1)
  ap.add_argument("--top", type=int, default=25)
  ap.add_argument("--hlo_out", help="write the compiled step's HLO text here (to read the fusions)")
  args = ap.parse_args(argv)
  host_memory.keep_freed_memory()  # as train_bench's side and the CPU entry points: no fresh pages a step

  step, state, batch, model_config = build_step(args.width, args.layers, args.batch, args.group, args.seq_len,
                                                args.keep_logits)
  totals, labels, wall_s, _ = profile_step(step, state, batch, args.steps, args.hlo_out)
  by_op, fusions, by_kind = summarize(totals, labels)
  all_s = sum(totals.values()) / 1e9 / args.steps
  from benchmarks import ceiling  # local: its import is slow and the test does not need it
  print(f"cpu: {ceiling.cpu_description()}")
  logits = "kept logits" if args.keep_logits else "logits kept when they fit (the default)"
  print(f"{args.width} Qwen3, {model_config.num_layers} layers, vocab {model_config.vocab_size}; "
        f"{args.batch} x {args.group} x {args.seq_len}, {logits}"
        f"; {args.steps} step(s) traced: {wall_s:.2f} s a step (wall, profiler on), {all_s:.2f} thread-s a step")
  print(f"{'thread s/step':>13} {'share':>6} {'fusions':>7}  op")
  for op, ns in by_op.most_common(args.top):
    s = ns / 1e9 / args.steps
    print(f"{s:>13.3f} {s / all_s:>6.1%} {fusions[op]:>7}  {op}")
  print(f"{'thread s/step':>13} {'share':>6}  kind")
  for kind, ns in by_kind.most_common():
    s = ns / 1e9 / args.steps
    print(f"{s:>13.3f} {s / all_s:>6.1%}  {kind}")
  matmul = sum(ns for kind, ns in by_kind.items() if kind.startswith("matmul")) / 1e9 / args.steps
  print(f"matmul share {matmul / all_s:.1%} ({matmul:.2f} of {all_s:.2f} thread-s a step)")


if __name__ == "__main__":
  main()
