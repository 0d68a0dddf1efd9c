"""On a GPU: our kernels and loops against torch + transformers in one run, each against the chip's measured ceilings.

    python -m benchmarks.gpu_bench ceilings
    python -m benchmarks.gpu_bench attention --lengths 4096 16384       # cudnn vs blockwise vs torch SDPA, bf16
    python -m benchmarks.gpu_bench decode --widths qwen3_0p6b qwen3_1p7b --batches 1 16 64 256
    python -m benchmarks.gpu_bench train --lengths 2048 4096 8192 --tokens 8192

Ceilings (measured first, in JAX): HBM bandwidth, from a copy of 2 GiB (bytes read + written over the time), and the
bf16 matmul rate, from an 8192^3 product. Decode's roofline and the train step's MFU are given against these and,
beside them, against the card's datasheet (DATASHEETS, by the device name JAX reports; "-" for a card not listed). Times are the median of several runs after a warm-up, read after the
device is done (block_until_ready, or a host read of the result).

- attention: causal GQA (16 query heads, 8 kv heads, head dim 128), forward + backward of <out, cotangent>, bf16.
  Each kernel's output and gradients are compared with the blockwise kernel run in float32, as
  |x - x_f32| / |x_f32| (bf16 lands near 1e-3..1e-2); torch's SDPA is the peer.
- decode: random-weight Qwen3 widths at full depth, bf16, prompt 8 tokens, `--new_tokens` sampled at temperature 1
  and never stopped early; our rollout driver against `generate` of transformers (SDPA, its default cache), runs
  alternating. The roofline is the least time a step needs: max(bytes it must read / bandwidth, FLOPs / matmul
  rate), bytes = every matmul weight once (bf16) + the KV cache up to the mean context.
- train: our jitted OAPL step (float32 master weights, bf16 compute, Adam) against the same step in torch
  (train_bench.torch_step_fn under bf16 autocast, SDPA); MFU = model FLOPs (compile_check.train_flops: 6 x weights x
  tokens + attention) per second over the measured matmul rate, and over the datasheet's. Both live in one process and neither allocator gives
  memory back: on an 80 GB H100, Qwen3-0.6B at 4,096 positions a step needs --remat (without it our step asks for
  a 21.4 GiB temporary arena, and at 8,192 positions JAX's pool left torch too little).
A benchmark, not a test.
"""
import argparse
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import ceiling

BF16 = 2  # bytes
# NVIDIA's datasheets: dense bf16 tensor-core FLOP/s (without sparsity) and HBM bytes/s, keyed by JAX's device_kind.
DATASHEETS = {
    "NVIDIA H100 80GB HBM3": {"name": "H100 SXM", "matmul": 989e12, "bandwidth": 3.35e12},
    "NVIDIA H200": {"name": "H200 SXM", "matmul": 989e12, "bandwidth": 4.8e12},
}
WIDTHS = {  # published Qwen3 widths (vocab 151,936, tied embeddings), full depth unless --layers
    "qwen3_0p6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8),
    "qwen3_1p7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8),
}


def qwen3_config(width: str, layers=None):
  import transformers
  overrides = {"num_hidden_layers": layers} if layers else {}
  return transformers.Qwen3Config(vocab_size=151936, head_dim=128, tie_word_embeddings=True, rope_theta=1e6,
                                  max_position_embeddings=40960, **{**WIDTHS[width], **overrides})


def torch_device() -> str:
  import torch
  return "cuda" if torch.cuda.is_available() else "cpu"  # cpu: to try this file on a host without a GPU


def ceilings(copy_rows: int = 1024, matmul_n: int = 8192) -> dict:
  """{"bandwidth": bytes/s of a device copy (read + write), "matmul": bf16 FLOP/s of an n^3 product}."""
  x = jax.random.normal(jax.random.PRNGKey(0), (copy_rows, 1024 * 1024), jnp.bfloat16)  # 2 GiB at 1024 rows
  copy = jax.jit(lambda x: x + 1)
  bandwidth = 2 * x.nbytes / ceiling.median_seconds(lambda: copy(x).block_until_ready(), 10)
  del x
  a, b = (jax.random.normal(jax.random.PRNGKey(i), (matmul_n, matmul_n), jnp.bfloat16) for i in (1, 2))
  matmul = jax.jit(lambda a, b: a @ b)
  rate = 2 * matmul_n ** 3 / ceiling.median_seconds(lambda: matmul(a, b).block_until_ready(), 10)
  return {"bandwidth": bandwidth, "matmul": rate}


def datasheet() -> dict:
  """This device's datasheet peaks (DATASHEETS), or {} for a card not listed."""
  return DATASHEETS.get(jax.devices()[0].device_kind, {})


def print_ceilings(peak):
  sheet = datasheet()
  print(f"device: {jax.devices()[0].device_kind}; measured: HBM {peak['bandwidth'] / 1e12:.2f} TB/s, "
        f"bf16 matmul {peak['matmul'] / 1e12:.0f} TFLOP/s; datasheet: " +
        (f"{sheet['name']}, HBM {sheet['bandwidth'] / 1e12:.2f} TB/s, dense bf16 {sheet['matmul'] / 1e12:.0f} TFLOP/s"
         if sheet else "none listed for this device (DATASHEETS)"))


def _percent(x) -> str:
  return "-" if x is None else f"{x:.1%}"


# ---- attention

def attention(args):
  import torch
  from oapl_jax.models.attention import attend
  B, H, K, D = 1, 16, 8, 128
  print(f"causal attention, B={B}, {H} query heads, {K} kv heads, head dim {D}; forward + backward")
  print(f"{'T':>6} {'kernel':>10} {'dtype':>8} {'ms':>8} {'TFLOP/s':>8} {'out err':>9} {'dq err':>9} {'dk err':>9} "
        f"{'dv err':>9}")

  def grads_fn(kernel):
    def grads(q, k, v, cotangent):
      pos = jnp.broadcast_to(jnp.arange(q.shape[1], dtype=jnp.int32), q.shape[:2])
      fn = lambda q, k, v: attend(q, k, v, q_positions_BxT=pos, kv_positions_BxS=pos, implementation=kernel)
      out, vjp = jax.vjp(fn, q, k, v)
      return (out, *vjp(cotangent.astype(out.dtype)))
    return jax.jit(grads)

  for T in args.lengths:
    keys = jax.random.split(jax.random.PRNGKey(T), 4)
    shapes = [(B, T, H, D), (B, T, K, D), (B, T, K, D), (B, T, H, D)]
    inputs = [jax.random.normal(key, s, jnp.float32) for key, s in zip(keys, shapes)]
    truth = jax.block_until_ready(grads_fn("blockwise")(*inputs))
    flops = 3.5 * 4 * B * H * D * T * T / 2  # causal: half the scores; backward 2.5x the forward
    kernels = ["cudnn", "blockwise"] + (["reference"] if T <= args.max_reference_len else [])
    for kernel in kernels:
      low = [x.astype(jnp.bfloat16) for x in inputs]
      fn = grads_fn(kernel)
      got = jax.block_until_ready(fn(*low))
      seconds = ceiling.median_seconds(lambda: jax.block_until_ready(fn(*low)), args.repeats)
      errors = [float(jnp.linalg.norm((g.astype(jnp.float32) - t).ravel()) / jnp.linalg.norm(t.ravel()))
                for g, t in zip(got, truth)]
      print(f"{T:>6} {kernel:>10} {'bf16':>8} {seconds * 1e3:>8.2f} {flops / seconds / 1e12:>8.0f} "
            + " ".join(f"{e:>9.2e}" for e in errors))
    # the peer: torch's SDPA (flash) in bf16, [B, H, T, D] layout, same inputs
    q, k, v, cot = (torch.from_numpy(np.array(x)).to(torch_device(), torch.bfloat16).transpose(1, 2)
                    for x in inputs)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()

    def torch_run():
      out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
      dq, dk, dv = torch.autograd.grad(out, (q, k, v), cot)
      out = out.detach()
      torch.cuda.synchronize() if q.is_cuda else None
      return out, dq, dk, dv

    got = torch_run()
    seconds = ceiling.median_seconds(torch_run, args.repeats)
    errors = [float(torch.linalg.norm((g.float().transpose(1, 2).cpu() - torch.from_numpy(np.array(t))).ravel())
                    / np.linalg.norm(np.asarray(t).ravel())) for g, t in zip(got, truth)]
    print(f"{T:>6} {'torch sdpa':>10} {'bf16':>8} {seconds * 1e3:>8.2f} {flops / seconds / 1e12:>8.0f} "
          + " ".join(f"{e:>9.2e}" for e in errors))


# ---- decode

def decode_floor_seconds(config, rows: int, context: float, peak: dict) -> float:
  """The least time of one bf16 decode step of `rows` rows attending over `context` positions: every matmul weight
  and each row's KV cache read once at peak["bandwidth"], or 2 FLOPs per weight per row at peak["matmul"]."""
  from oapl_jax.run import compile_check
  weights = compile_check.train_flops(config, 1, 1)["matmul_weights"]
  kv_bytes_per_row = BF16 * 2 * config.num_layers * config.num_kv_heads * config.head_dim * context
  return max((BF16 * weights + rows * kv_bytes_per_row) / peak["bandwidth"], 2 * weights * rows / peak["matmul"])


def decode(args, peak):
  import torch
  from benchmarks import sampler_bench
  from oapl_jax.models import api, hf
  from oapl_jax.sampler import core
  print(f"decode: prompt {args.prompt_length} tokens, {args.new_tokens} new tokens, temperature 1, bf16; "
        f"median of {args.repeats} alternating runs")
  print(f"{'width':>11} {'batch':>5} {'ours tok/s':>10} {'hf tok/s':>9} {'ratio':>6} {'ours ms/step':>12} "
        f"{'floor ms':>8} {'ours % roofline':>15} {'hf % roofline':>13} {'sheet floor ms':>14} {'ours % sheet':>12} "
        f"{'hf % sheet':>10} {'compile s':>9}")
  sheet = datasheet()
  rng = np.random.RandomState(0)
  for width in args.widths:
    with tempfile.TemporaryDirectory() as tmp:
      torch_model = sampler_bench.make_checkpoint(tmp, hf_config=qwen3_config(width, args.layers),
                                                  device=torch_device(), dtype=torch.bfloat16)
      config, params = hf.load(tmp, dtype="bfloat16")
    model = api.for_config(config)
    context = args.prompt_length + (args.new_tokens + 1) / 2
    for batch in args.batches:
      prompts = rng.randint(0, config.vocab_size, (batch, args.prompt_length)).tolist()
      sampler = core.Sampler(model, num_slots=batch, max_prefill_length=max(16, args.prompt_length),
                             max_new_tokens=args.new_tokens)
      sampler.refresh(params)
      ours_s, theirs_s, ratio, compile_s, _ = sampler_bench.time_interleaved(
          sampler_bench.ours_runner(sampler, prompts, args.new_tokens, args.steps_per_sync),
          sampler_bench.hf_runner(torch_model, prompts, args.new_tokens), args.repeats)
      floor = decode_floor_seconds(config, batch, context, peak)
      sheet_floor = decode_floor_seconds(config, batch, context, sheet) if sheet else None
      step_ours, step_theirs = ours_s / args.new_tokens, theirs_s / args.new_tokens
      tokens = batch * args.new_tokens
      print(f"{width:>11} {batch:>5} {tokens / ours_s:>10.0f} {tokens / theirs_s:>9.0f} {ratio:>5.2f}x "
            f"{step_ours * 1e3:>12.2f} {floor * 1e3:>8.3f} {floor / step_ours:>15.1%} {floor / step_theirs:>13.1%} "
            f"{'-' if sheet_floor is None else f'{sheet_floor * 1e3:.3f}':>14} "
            f"{_percent(sheet_floor and sheet_floor / step_ours):>12} "
            f"{_percent(sheet_floor and sheet_floor / step_theirs):>10} {compile_s:>9.1f}", flush=True)
      del sampler
    del torch_model, params
    torch.cuda.empty_cache()


# ---- train

def train(args, peak):
  import torch
  import transformers
  from benchmarks import train_bench
  from oapl_jax.run import compile_check
  print(f"train step: {args.width}, {args.tokens} positions a step, bf16 compute over float32 master weights")
  print(f"{'T':>6} {'seqs':>4} {'ours ms':>8} {'torch ms':>8} {'ratio':>6} {'ours MFU':>8} {'torch MFU':>9} "
        f"{'ours MFU sheet':>14} {'torch MFU sheet':>15} {'loss ours':>10} {'loss torch':>10}")
  sheet = datasheet()
  hf_cfg = qwen3_config(args.width, args.layers)
  torch.manual_seed(0)
  with tempfile.TemporaryDirectory() as ckpt:
    transformers.Qwen3ForCausalLM(hf_cfg).save_pretrained(ckpt)
    for T in args.lengths:
      group = min(4, max(1, args.tokens // T))
      prompts = max(1, args.tokens // T) // group
      seqs = prompts * group  # what the batch holds (--tokens rounded down to whole groups of T)
      batch = train_bench.make_batch(prompts, group, T, hf_cfg.vocab_size)
      jax_steps, model_config = train_bench.jax_steps_fn(ckpt, batch, 1.0, compute_dtype="bfloat16",
                                                         remat=args.remat)
      torch_model = transformers.Qwen3ForCausalLM.from_pretrained(
          ckpt, dtype=torch.float32, attn_implementation="sdpa").to(torch_device()).train()
      torch_step = train_bench.torch_step_fn(torch_model, batch, 1.0, autocast_dtype=torch.bfloat16)
      loss_ours, loss_torch = float(jax_steps(1)["loss"]), torch_step()  # compile; the shared initial params
      jax_steps(1), torch_step()
      ours, theirs = [], []
      for _ in range(args.repeats):
        start = time.perf_counter()
        jax_steps(1)
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        torch_step()  # returns loss.item(): waits for the step
        theirs.append(time.perf_counter() - start)
      ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
      flops = compile_check.train_flops(model_config, seqs, T)["model"]
      print(f"{T:>6} {seqs:>4} {ours_s * 1e3:>8.1f} {theirs_s * 1e3:>8.1f} {theirs_s / ours_s:>5.2f}x "
            f"{flops / ours_s / peak['matmul']:>8.1%} {flops / theirs_s / peak['matmul']:>9.1%} "
            f"{_percent(flops / ours_s / sheet['matmul'] if sheet else None):>14} "
            f"{_percent(flops / theirs_s / sheet['matmul'] if sheet else None):>15} "
            f"{loss_ours:>10.6f} {loss_torch:>10.6f}", flush=True)
      del jax_steps, torch_model, torch_step
      torch.cuda.empty_cache()


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("what", choices=["ceilings", "attention", "decode", "train"])
  ap.add_argument("--lengths", type=int, nargs="+", help="attention: T (4096 16384); train: T (2048 4096 8192)")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--max_reference_len", type=int, default=4096, help="attention: run the reference kernel up to")
  ap.add_argument("--widths", nargs="+", default=sorted(WIDTHS), choices=sorted(WIDTHS), help="decode")
  ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256], help="decode")
  ap.add_argument("--new_tokens", type=int, default=128, help="decode")
  ap.add_argument("--prompt_length", type=int, default=8, help="decode")
  ap.add_argument("--steps_per_sync", type=int, default=32, help="decode: steps between host checks")
  ap.add_argument("--width", default="qwen3_0p6b", choices=sorted(WIDTHS), help="train")
  ap.add_argument("--tokens", type=int, default=8192, help="train: positions a step (sequences = tokens / T)")
  ap.add_argument("--remat", action="store_true", help="train: rematerialise each layer")
  ap.add_argument("--layers", type=int, help="decode, train: fewer layers than the published depth")
  args = ap.parse_args(argv)
  if args.what == "attention":
    args.lengths = args.lengths or [4096, 16384]
    return attention(args)
  peak = ceilings()
  print_ceilings(peak)
  if args.what == "decode":
    decode(args, peak)
  elif args.what == "train":
    args.lengths = args.lengths or [2048, 4096, 8192]
    train(args, peak)


if __name__ == "__main__":
  main()
