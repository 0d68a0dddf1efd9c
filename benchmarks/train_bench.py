"""Train-step throughput: our jitted OAPL step vs the same step in PyTorch + transformers.

    python -m benchmarks.train_bench                 # B=8 prompts x G=8, T=128, tiny Qwen3
    python -m benchmarks.train_bench --batch 4 --seq_len 256 --rounds 5
    python -m benchmarks.train_bench --single_thread   # both on one CPU thread (busy machines)
    python -m benchmarks.train_bench --width qwen3_0p6b --layers 4 --batch 2 --group 4 --seq_len 256 --rounds 3 --steps 1
                                                       # real width: Qwen3-0.6B's, vocab 151,936, 4 layers
    ... --keep_logits                                  # the backward reuses the logits (logprob_recompute=False)
    ... --recompute_logits                             # the backward projects again (logprob_keep_bytes=0)
    ... --isolate --pairs 2                            # each side in its own process (no shared threads or heap)

Both sides start from the same tiny random Qwen3 checkpoint (written with transformers) and run
the same batch: policy log-probs at the sampler temperature, the OAPL loss (Eq. 2-3), global-norm
clipping and AdamW. Torch projects every position onto the vocabulary; ours only the chunks holding response
tokens (prompts and padding are never read by the loss), as the trainer does. After warm-up, rounds of
`--steps` steps alternate between the two (fair on a shared machine); the median step time per side gives
tokens/s (every position fed to the model) and the ratio. In one process the two libraries share threads and
the heap, and each slows the other: at real width on a 2-core VM (2026-11-26), torch's step took 30.4 s beside
a JAX runtime holding 5 GB against 25.4 s alone, ours 27.9 s with torch imported against 23.6 s without.
--isolate runs each side alone in its own process instead (sides one after the other, --pairs times), ours
keeping freed host memory as the CPU entry points do (oapl_jax/host_memory.py), torch with glibc's defaults
(or the same, --torch_keeps_freed_memory); the report says what each worker's malloc did. The first-step
losses are printed as a check that both compute one thing.
Each side's rate is also given as a fraction of this CPU's measured compute ceiling (benchmarks/ceiling.py,
the best float32 matmul rate of either library): model FLOPs (6 x matmul weights x tokens + attention, what
one step needs) per second over the ceiling, and for ours also the FLOPs it executes (recomputation included).
With --floor, each round is followed by a timing of the matmuls the step cannot skip (benchmarks/matmul_floor.py):
the median of torch's step over that floor, "reachable <=", bounds the ratio a step running those float32
matmuls reaches here.
A benchmark, not a test.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
import torch
import transformers

from benchmarks import matmul_floor, random_models
from oapl_jax import host_memory, objectives, parallel
from oapl_jax.models import api, hf
from oapl_jax.rl import batch_spec, trainer
from oapl_jax.rl.optim import OptimConfig

BETA1, BETA2, LR, MAX_GRAD_NORM = 1.0, 1e-3, 1e-5, 1.0
WIDTHS, hf_config = random_models.WIDTHS, random_models.hf_config  # --width's choices (benchmarks/random_models.py)


def make_batch(B, G, T, vocab, seed=0, prompt_len=16, min_response=None):
  """Right-padded random [B,G,T] trainer batch: prompt, response of random length, padding."""
  rng = np.random.default_rng(seed)
  seq = rng.integers(0, vocab, (B, G, T + 1)).astype(np.int32)
  resp_len_BxG = rng.integers(T // 2 if min_response is None else min_response, T - prompt_len + 2, (B, G))
  t = np.arange(T)
  mask = (t >= prompt_len - 1) & (t < prompt_len - 1 + resp_len_BxG[..., None])
  return {
      "tokens": seq[..., :-1], "targets": seq[..., 1:],
      "positions": np.broadcast_to(t, (B, G, T)).astype(np.int32),
      "response_mask": mask.astype(np.float32),
      "sampler_token_logp": np.where(mask, -rng.uniform(4.0, 7.0, mask.shape), 0.0).astype(np.float32),
      "rewards": rng.integers(0, 2, (B, G)).astype(np.float32),
  }


def torch_step_fn(model, batch, temperature, autocast_dtype=None):
  """The same OAPL step written with PyTorch, on the model's device: returns step() -> loss (float).
  autocast_dtype (e.g. torch.bfloat16): the model runs under autocast, its float32 weights the master copy."""
  B, G, T = batch["tokens"].shape
  device = next(model.parameters()).device
  tt = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in batch.items()}
  tokens, targets, positions = (tt[k].reshape(B * G, T).long() for k in ("tokens", "targets", "positions"))
  mask, sampler, rewards = tt["response_mask"], tt["sampler_token_logp"], tt["rewards"]
  opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

  def step():
    with torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
      logits = model(input_ids=tokens, position_ids=positions).logits.float() / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0].reshape(B, G, T)
    seq_policy, seq_sampler = (logp * mask).sum(-1), (sampler * mask).sum(-1)
    v_star = BETA1 * (torch.logsumexp(rewards / BETA1, -1) - np.log(G))
    loss = ((BETA2 * (seq_policy - seq_sampler) - (rewards - v_star[:, None])) ** 2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    opt.step()
    return loss.item()

  return step


def logits_execution(keep_logits: bool = False, recompute_logits: bool = False) -> dict:
  """The model.* fields of --keep_logits / --recompute_logits; neither: the default (the backward reuses the
  forward's logits when they fit in model.logprob_keep_bytes, as they do at this benchmark's shapes)."""
  if keep_logits and recompute_logits:
    raise ValueError("--keep_logits and --recompute_logits exclude each other")
  return {"logprob_recompute": not keep_logits, **({"logprob_keep_bytes": 0} if recompute_logits else {})}


def jax_steps_fn(checkpoint: str, batch, temperature, keep_logits=False, compute_dtype="float32", **execution):
  """Our OAPL train step from an HF `checkpoint` (float32 master weights, `compute_dtype` activations, other
  models/execution.Execution fields in `execution`) on one device: returns (steps(n) -> the last step's metrics, run
  n steps on `batch` and wait for them; the model config)."""
  mesh = parallel.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  model_config, params = hf.load(checkpoint, mesh=mesh, dtype="float32", compute_dtype=compute_dtype)
  model_config = model_config.replace(**{**logits_execution(keep_logits), **execution})
  config = trainer.TrainConfig(
      loss="oapl", loss_settings=objectives.OAPLSettings(beta1=BETA1, beta2=BETA2), temperature=temperature,
      optim=OptimConfig(lr=LR, b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=MAX_GRAD_NORM))
  model, layout = api.for_config(model_config), parallel.Layout(mesh)
  state = trainer.create_train_state(config, model, params, layout)
  train_step = trainer.make_train_step(config, model, layout)
  batch_dev = batch_spec.put(batch, batch_spec.train_batch(*batch["tokens"].shape, layout))
  rng = jax.random.PRNGKey(0)

  def steps(n):
    nonlocal state
    for _ in range(n):
      state, metrics = train_step(state, batch_dev, rng)
    jax.block_until_ready(state)
    return metrics

  return steps, model_config


def _parser():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=8, help="prompts B")
  ap.add_argument("--group", type=int, default=8, help="samples per prompt G")
  ap.add_argument("--seq_len", type=int, default=128, help="positions T")
  ap.add_argument("--steps", type=int, default=3, help="steps per timed round")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--temperature", type=float, default=1.0)
  ap.add_argument("--single_thread", action="store_true", help="one CPU thread for XLA and torch")
  ap.add_argument("--width", choices=sorted(WIDTHS), default="tiny")
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--floor", action="store_true",
                  help="time the step's matmul floor (benchmarks/matmul_floor.py) after each round: torch's step "
                       "over it bounds the ratio reachable here")
  ap.add_argument("--keep_logits", action="store_true",
                  help="model.logprob_recompute=False: the backward reuses a block kept by the forward, as torch "
                       "keeps the logits")
  ap.add_argument("--recompute_logits", action="store_true",
                  help="model.logprob_keep_bytes=0: the backward projects the logits again whatever their size (the "
                       "default keeps them when they fit, as here)")
  ap.add_argument("--isolate", action="store_true",
                  help="each side in its own process, one after the other (--pairs times): no shared threads or "
                       "heap; ours keeps freed host memory as the CPU entry points do (oapl_jax/host_memory.py)")
  ap.add_argument("--pairs", type=int, default=1, help="--isolate: (ours, torch) process pairs, alternating")
  ap.add_argument("--torch_keeps_freed_memory", action="store_true",
                  help="--isolate: torch's process keeps freed memory too (glibc's defaults otherwise)")
  ap.add_argument("--side", choices=["jax", "torch"], help=argparse.SUPPRESS)  # --isolate's worker
  ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
  return ap


def _time_rounds(step_n, rounds, steps):
  """Seconds per step of each of `rounds` rounds of step_n(steps)."""
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    step_n(steps)
    times.append((time.perf_counter() - t0) / steps)
  return times


def _side(args):
  """--isolate's worker: one side alone on the shared checkpoint; prints one JSON line."""
  # before either library starts its threads
  kept = (args.side == "jax" or args.torch_keeps_freed_memory) and host_memory.keep_freed_memory()
  batch = make_batch(args.batch, args.group, args.seq_len, hf_config(args.width, args.layers).vocab_size)
  if args.side == "jax":
    jax_steps, _ = jax_steps_fn(args.checkpoint, batch, args.temperature,
                                **logits_execution(args.keep_logits, args.recompute_logits))
    step_n = lambda n: jax_steps(n)["loss"]  # noqa: E731
  else:
    model = transformers.Qwen3ForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32).train()
    torch_step = torch_step_fn(model, batch, args.temperature)
    step_n = lambda n: [torch_step() for _ in range(n)][-1]  # noqa: E731
  loss0 = float(step_n(1))
  step_n(1)
  times = _time_rounds(step_n, args.rounds, args.steps)
  print(json.dumps({"loss0": loss0, "times": times, "kept_freed_memory": bool(kept)}))


def _isolated(args, ckpt):
  """(jax times, torch times, jax loss0, torch loss0, how each side's malloc ran) from --pairs alternating
  worker processes."""
  forwarded = [a for a in sys.argv[1:] if a not in ("--isolate", "--floor")]
  results = {"jax": [], "torch": []}
  for pair in range(args.pairs):
    for side in ("jax", "torch"):
      print(f"[pair {pair + 1}/{args.pairs}] {side} in its own process ...", flush=True)
      out = subprocess.run([sys.executable, "-m", "benchmarks.train_bench", *forwarded, "--side", side,
                            "--checkpoint", ckpt], capture_output=True, text=True, check=False)
      if out.returncode:
        raise SystemExit(f"{side} worker failed ({out.returncode}):\n{out.stderr[-3000:]}")
      results[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
  times = {side: [t for r in rs for t in r["times"]] for side, rs in results.items()}
  malloc = {side: "keeps freed host memory" if rs[0]["kept_freed_memory"] else "has glibc defaults"
            for side, rs in results.items()}
  return (times["jax"], times["torch"], results["jax"][0]["loss0"], results["torch"][0]["loss0"],
          f"ours {malloc['jax']}, torch {malloc['torch']}")


def main():
  args = _parser().parse_args()
  if args.side:
    return _side(args)
  if args.single_thread:  # before JAX starts its backend
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                               " intra_op_parallelism_threads=1").strip()
    torch.set_num_threads(1)

  hf_cfg = hf_config(args.width, args.layers)
  torch.manual_seed(0)
  batch = make_batch(args.batch, args.group, args.seq_len, hf_cfg.vocab_size)
  B, G, T = batch["tokens"].shape
  tokens, response_tokens = B * G * T, int(batch["response_mask"].sum())
  with tempfile.TemporaryDirectory() as ckpt:
    transformers.Qwen3ForCausalLM(hf_cfg).save_pretrained(ckpt)
    model_config = hf.read_config(ckpt).replace(**logits_execution(args.keep_logits, args.recompute_logits))
    floor_shapes = matmul_floor.train_shapes(model_config, tokens, response_tokens)
    floor_times = []
    if args.isolate:
      jax_times, torch_times, jax_loss0, torch_loss0, malloc = _isolated(args, ckpt)
      if args.floor:  # after all of them: one per round of either side
        floor_times = [matmul_floor.floor_seconds(floor_shapes) for _ in range(len(jax_times))]
    else:
      torch_model = transformers.Qwen3ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).train()
      jax_steps, _ = jax_steps_fn(ckpt, batch, args.temperature,
                                  **logits_execution(args.keep_logits, args.recompute_logits))
  if not args.isolate:
    torch_step = torch_step_fn(torch_model, batch, args.temperature)
    metrics = jax_steps(1)  # compile + first step; loss is at the shared initial params
    jax_loss0, torch_loss0 = float(metrics["loss"]), torch_step()
    jax_steps(1)
    torch_step()
    jax_times, torch_times = [], []
    for _ in range(args.rounds):  # alternating: fair on a shared machine
      jax_times += _time_rounds(jax_steps, 1, args.steps)
      torch_times += _time_rounds(lambda n: [torch_step() for _ in range(n)], 1, args.steps)
      if args.floor:
        floor_times.append(matmul_floor.floor_seconds(floor_shapes))

  jax_s, torch_s = float(np.median(jax_times)), float(np.median(torch_times))
  where = (f"each side in its own process, {args.pairs} pair(s); {malloc}" if args.isolate
           else "one process, alternating rounds, glibc malloc defaults")
  print(f"batch B={B} x G={G} x T={T} ({tokens} positions, {response_tokens} response tokens); "
        f"jax devices: {jax.devices()[0].platform} x1, torch threads: {torch.get_num_threads()}; {where}")
  print(f"first-step loss: jax {jax_loss0:.6f}  torch {torch_loss0:.6f}")
  print(f"jax   (oapl_jax jit step):       {jax_s * 1e3:8.1f} ms/step  {tokens / jax_s:10.0f} tokens/s  "
        f"(rounds {', '.join(f'{t:.2f}' for t in jax_times)} s)")
  print(f"torch (transformers + AdamW):    {torch_s * 1e3:8.1f} ms/step  {tokens / torch_s:10.0f} tokens/s  "
        f"(rounds {', '.join(f'{t:.2f}' for t in torch_times)} s)")
  print(f"speed-up jax / torch: {torch_s / jax_s:.2f}x")
  if args.floor:  # in one process, the floor was timed right after each round's two steps
    reachable = np.median([t / f for t, f in zip(torch_times, floor_times)])
    ours_over = np.median([j / f for j, f in zip(jax_times, floor_times)])
    print(f"matmul floor (every projection's forward and two gradients, the vocabulary's on the response tokens, "
          f"faster library per shape): {np.median(floor_times) * 1e3:.1f} ms; jax step = {ours_over:.2f} x floor; "
          f"reachable <= {reachable:.2f}x torch")
  from benchmarks import ceiling  # local: tests import make_batch from here, and these imports take seconds
  from oapl_jax.run import compile_check
  from oapl_jax.models import vocab_logprobs
  vocab_tokens = vocab_logprobs.projected_tokens(  # one device: one row shard
      response_tokens, tokens, model_config.logprob_chunk_tokens, model_config.logprob_tail_levels)
  flops = compile_check.train_flops(model_config, B * G, T, vocab_tokens=vocab_tokens)
  peak = ceiling.measure(repeats=3)
  top = max(peak["jax"], peak["torch"])
  print(f"cpu: {ceiling.cpu_description()}")
  print(f"compute ceiling (best f32 matmul here): jax {peak['jax']:.1f}, torch {peak['torch']:.1f} GFLOP/s")
  print(f"model FLOPs per step {flops['model'] / 1e9:.1f} G: jax {flops['model'] / jax_s / 1e9:.1f} GFLOP/s "
        f"({flops['model'] / jax_s / 1e9 / top:.0%} of the ceiling), torch {flops['model'] / torch_s / 1e9:.1f} "
        f"GFLOP/s ({flops['model'] / torch_s / 1e9 / top:.0%}); jax executes {flops['executed'] / 1e9:.1f} G "
        f"({flops['executed'] / jax_s / 1e9 / top:.0%} of the ceiling; the vocabulary projection on "
        f"{vocab_tokens} of {tokens} tokens: the chunks and tails holding response tokens)")


if __name__ == "__main__":
  main()
