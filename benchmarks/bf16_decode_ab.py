"""A/B of the bfloat16 decode's dots, in one process: "before" (bf16 x bf16 -> bf16 dots, as up to 33acd94) against
"after" (models/projection_grad.low_precision_dot: bf16 x bf16 -> f32, rounded once to bf16).

    taskset -c 1 python -m benchmarks.bf16_decode_ab                       # batches 1 and 16, 32 new tokens
    taskset -c 1 python -m benchmarks.bf16_decode_ab --batches 16 --repeats 7 --dtype float32

XLA:CPU rewrites a bf16 -> bf16 dot as an f32 dot on converted operands, and the decode loop's weight converts
are hoisted out of the loop: each step reads float32 weights. "before" re-creates the old dots by patching the
three functions back while its sampler traces and runs (models/projection_grad._contract, models/decoder._attend
and _attention_mix); both samplers hold the same random Qwen3-0.6B-width weights (--layers layers). The two
sides alternate, one warm-up each (compile + one run, not timed); tokens/s from each side's median run, and the
median of the per-pair ratios (pairs run back to back, so load drifts on a shared CPU mostly cancel: only ratios
within one run are comparable). A benchmark, not a test.
"""
import argparse
import contextlib
import statistics

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oapl_jax.models import api, decoder, projection_grad
from oapl_jax.models.qwen.config import QwenConfig
from oapl_jax.sampler import core, rollout
from oapl_jax.sampler.settings import SamplingSettings


# ---- the dots as they were (33acd94): in the operands' dtype
def _contract_before(n, precision, x, w):
  return lax.dot_general(x, w, ((tuple(range(x.ndim - n, x.ndim)), tuple(range(n))), ((), ())), precision=precision)


def _attend_before(embed, hidden_BxTxE):
  hidden_BxTxE, table_VxE = embed.promote_dtype(hidden_BxTxE, embed.embedding, dtype=embed.dtype)
  return lax.dot_general(hidden_BxTxE, table_VxE, (((hidden_BxTxE.ndim - 1,), (1,)), ((), ())))


def _attention_mix_before(probs_BxKxGxTxS, v_BxKxSxD):
  B, K, G, T, S = probs_BxKxGxTxS.shape
  out_BxKxQxD = jnp.einsum("bkqs,bksd->bkqd", probs_BxKxGxTxS.reshape(B, K, G * T, S), v_BxKxSxD)
  return out_BxKxQxD.reshape(B, K, G, T, v_BxKxSxD.shape[-1]).transpose(0, 3, 1, 2, 4)


@contextlib.contextmanager
def before_dots():
  """The old dots while tracing (and running, harmlessly) inside this block."""
  patches = [(projection_grad, "_contract", _contract_before), (decoder, "_attend", _attend_before),
             (decoder, "_attention_mix", _attention_mix_before)]
  saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
  for mod, name, fn in patches:
    setattr(mod, name, fn)
  try:
    yield
  finally:
    for mod, name, fn in saved:
      setattr(mod, name, fn)


def weight_converts(sampler, new_tokens: int, patch) -> int:
  """How many weight-sized (>= 1M elements) f32 converts the compiled decode's entry computation makes."""
  state = sampler.init_decode_state(SamplingSettings(max_new_tokens=new_tokens), max_len=16 + new_tokens)
  with patch(), sampler.layout.context():
    text = sampler._decode.lower(sampler.params, state, np.int32(16)).compile().as_text()
  entry = text[text.index("\nENTRY"):]
  shapes = [line.split(" = f32[")[1].split("]")[0] for line in entry.splitlines()
            if " = f32[" in line and "convert" in line]
  return sum(1 for s in shapes if s and np.prod([int(d) for d in s.split(",")]) >= 1 << 20)


def runner(sampler, prompts, new_tokens, patch):
  def run(seed):
    settings = SamplingSettings(max_new_tokens=new_tokens, steps_per_sync=16)
    with patch():
      groups = rollout.generate_groups(sampler, sampler.params, prompts, 1, settings, seed=seed)
    assert groups.num_tokens == len(prompts) * new_tokens
    return groups.wall_seconds
  return run


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--new_tokens", type=int, default=32)
  ap.add_argument("--prompt_length", type=int, default=8)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
  args = ap.parse_args(argv)

  config = QwenConfig.qwen3_0p6b().replace(num_layers=args.layers, param_dtype=args.dtype, dtype=args.dtype)
  model = api.for_config(config)
  params = nn.unbox(jax.jit(model.init_params)(jax.random.PRNGKey(0)))
  print(f"Qwen3-0.6B width, {args.layers} layers, {args.dtype}; {args.prompt_length}-token prompts, "
        f"{args.new_tokens} new tokens, 16 steps per sync; {args.repeats} alternating pairs", flush=True)
  print(f"{'batch':>5} {'converts before/after':>21} {'before tok/s':>12} {'after tok/s':>11} "
        f"{'after/before (median of pairs)':>30}")
  for B in args.batches:
    prompts = np.random.RandomState(0).randint(0, config.vocab_size, (B, args.prompt_length)).tolist()
    sides = {}
    for name, patch in (("before", before_dots), ("after", contextlib.nullcontext)):
      sampler = core.Sampler(model, num_slots=B, max_prefill_length=16, max_new_tokens=args.new_tokens)
      sampler.refresh(params)
      sides[name] = (runner(sampler, prompts, args.new_tokens, patch),
                     weight_converts(sampler, args.new_tokens, patch))
      sides[name][0](0)  # warm-up: compile + one run
    times = [(sides["before"][0](r + 1), sides["after"][0](r + 1)) for r in range(args.repeats)]
    tok = B * args.new_tokens
    before_s, after_s = statistics.median(t for t, _ in times), statistics.median(t for _, t in times)
    print(f"{B:>5} {sides['before'][1]:>10} / {sides['after'][1]:<8} {tok / before_s:>12.1f} {tok / after_s:>11.1f} "
          f"{statistics.median(b / a for b, a in times):>30.2f}", flush=True)


if __name__ == "__main__":
  main()
