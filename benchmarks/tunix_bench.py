"""Side by side with Tunix (google-tunix 0.1.7): its vanilla Sampler and GRPO train step against ours, one run.

    python -m benchmarks.tunix_bench --setup          # only make benchmarks/.tunix_venv (Tunix + our jax)
    python -m benchmarks.tunix_bench                  # Qwen3-0.6B width, 4 layers; batch 1, 16, 64; 2x4x256 step
    python -m benchmarks.tunix_bench --width tiny --layers 2 --repeats 3 --train_steps 2   # a quick check
    python -m benchmarks.tunix_bench --skip_train --out runs/tunix.md

One random HF checkpoint (transformers' Qwen3Config + save_pretrained, float32), loaded by each library's own
loader (ours: models/factory.load_pretrained; Tunix: models/qwen3/params.create_model_from_safe_tensors).
Tunix lives in its own venv (made on first run, git-ignored; never our dependency), so each side runs in its
own worker process (benchmarks/tunix_worker.py) and reports JSON; neither side shares threads or heap, and both
get the same glibc malloc policy (--malloc).
Sampling: both workers stay up and alternate run by run (each warmed up first); temperature 1, top-p 1, no
stop token, 128 new tokens after 8-token prompts; both return the sampled tokens' log-probs. Tokens/s from each
side's median run; the ratio is the median of per-pair ratios.
Train step: Tunix's RL Trainer with its registered "grpo" loss (beta 0, one iteration, sequence-mean-token-mean)
against our make_train_step with trainer.loss="grpo", on one batch (2 prompts x 4 samples x 256 tokens, old
log-probs = ours at the start + noise, so ratios clip sometimes; our sampler log-probs equal the old ones, so
our TIS weight is 1), AdamW with global-norm clipping 1.0. The sides run one process at a time (peak memory is
each process's peak RSS), alternating over --train_pairs pairs.
'% ceil': model FLOPs per second over this CPU's best float32 matmul rate (benchmarks/ceiling.py). The roofline
table: each batch's tokens/s against its memory-bound and compute-bound floors (benchmarks/roofline.py).
A benchmark, not a test.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUNIX_VENV = os.path.join(ROOT, "benchmarks", ".tunix_venv")
TUNIX_PACKAGE = "google-tunix==0.1.7"


def tunix_python(venv: str = TUNIX_VENV, setup: bool = True) -> str:
  """The Tunix venv's python, making the venv first (Tunix beside our jax version) where it is missing."""
  python = os.path.join(venv, "bin", "python")
  if os.path.exists(python) and _imports_tunix(python):
    return python
  if not setup:
    raise SystemExit(f"no Tunix venv at {venv}: run python -m benchmarks.tunix_bench --setup")
  import jax
  print(f"making {venv}: {TUNIX_PACKAGE} with jax[cpu]=={jax.__version__} (minutes) ...", flush=True)
  subprocess.run([sys.executable, "-m", "venv", venv], check=True)
  subprocess.run([python, "-m", "pip", "install", "-q", TUNIX_PACKAGE, f"jax[cpu]=={jax.__version__}"], check=True)
  if not _imports_tunix(python):
    raise SystemExit(f"{venv}: tunix does not import after the install")
  return python


def worker_env() -> dict:
  """The workers' environment: JAX on the CPU unless told otherwise (the Tunix venv's libtpu probes for a TPU)."""
  return {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS") or "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}


def _imports_tunix(python: str) -> bool:
  return subprocess.run([python, "-c", "import tunix.generate.sampler, tunix.rl.trainer"], capture_output=True,
                        env=worker_env()).returncode == 0


# ------------------------------------------------------------------------------ pure pieces (tested)
def hf_config(width: str, layers: int):
  """train_bench's width at Qwen3's real RoPE base 1e6: Tunix 0.1.7's Qwen3 attention calls apply_rope without
  the config's rope_theta, so it always runs at its default 1e6 (train_bench's 1e4 would not be the same model)."""
  import transformers
  from benchmarks import train_bench
  return transformers.Qwen3Config(num_hidden_layers=layers, rope_theta=1_000_000.0, **train_bench.WIDTHS[width])


def grpo_batch(B: int, G: int, T: int, vocab: int, prompt_len: int = 16, seed: int = 0) -> dict:
  """B x G rows of a prompt (prompt_len tokens) and a right-padded completion (T - prompt_len slots, at least
  half used), tokens in [1, vocab) (0 pads), 0/1 rewards [B, G], old log-probs -ln(vocab) (tunix_bench sets
  them from our model) on the completion mask."""
  rng = np.random.default_rng(seed)
  C = T - prompt_len
  lengths_N = rng.integers(C // 2, C + 1, B * G)
  mask_NxC = np.arange(C) < lengths_N[:, None]
  return {"prompt_ids": rng.integers(1, vocab, (B * G, prompt_len)).astype(np.int32),
          "completion_ids": np.where(mask_NxC, rng.integers(1, vocab, (B * G, C)), 0).astype(np.int32),
          "completion_mask": mask_NxC.astype(np.int32),
          "rewards": rng.integers(0, 2, (B, G)).astype(np.float32),
          "old_logp": np.where(mask_NxC, -np.log(vocab), 0.0).astype(np.float32)}


def pair_summary(ours, theirs, higher_is_better: bool) -> dict:
  """Medians of alternating runs and the median of per-pair ratios, >1 meaning ours is ahead."""
  ratios = [(a / b if higher_is_better else b / a) for a, b in zip(ours, theirs)]
  return {"ours": statistics.median(ours), "tunix": statistics.median(theirs), "ratio": statistics.median(ratios),
          "pairs": len(ratios)}


def markdown_table(rows) -> str:
  """rows: (what, unit, summary from pair_summary, ours % ceiling or None, Tunix's or None)."""
  lines = ["| row | ours | Tunix | ours ahead by | ours % ceil | Tunix % ceil | pairs |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  pct = lambda x: "" if x is None else f"{x:.1%}"  # noqa: E731
  for what, unit, s, ours_ceil, tunix_ceil in rows:
    fmt = "{:.0f}" if unit == "tokens/s" else "{:.2f}"
    lines.append(f"| {what} ({unit}) | {fmt.format(s['ours'])} | {fmt.format(s['tunix'])} | {s['ratio']:.2f}x | "
                 f"{pct(ours_ceil)} | {pct(tunix_ceil)} | {s['pairs']} |")
  return "\n".join(lines)


# ------------------------------------------------------------------------------ workers
class Worker:
  """A tunix_worker process: started, warmed up (it says ready), then one JSON line per command."""

  def __init__(self, python, side, job, checkpoint, data, extra=()):
    cmd = [python, "-m", "benchmarks.tunix_worker", "--side", side, "--job", job, "--checkpoint", checkpoint,
           "--data", data, *extra]
    self.side, self.log = side, tempfile.TemporaryFile("w+")
    self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                 text=True, env=worker_env())
    self.ready = self._read()

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      self.log.seek(0)
      raise SystemExit(f"{self.side} worker died ({self.proc.wait()}):\n{self.log.read()[-4000:]}")
    return json.loads(line)

  def ask(self, command: str) -> dict:
    self.proc.stdin.write(command + "\n")
    self.proc.stdin.flush()
    return self._read()

  def close(self) -> None:
    self.proc.stdin.close()
    self.proc.wait()


def run_logps(python, side, checkpoint, data) -> np.ndarray:
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "logp.npy")
    run = subprocess.run([python, "-m", "benchmarks.tunix_worker", "--side", side, "--job", "logps", "--checkpoint",
                          checkpoint, "--data", data, "--out", out], cwd=ROOT, env=worker_env(), capture_output=True,
                         text=True)
    if not os.path.exists(out):
      raise SystemExit(f"{side} log-probs worker failed:\n{run.stderr[-4000:]}")
    return np.load(out)


def bench_sampling(pythons, checkpoint, tmp, batch, args):
  prompts = np.random.default_rng(batch).integers(1, args.vocab, (batch, args.prompt_length))
  data = os.path.join(tmp, f"prompts_{batch}.npz")
  np.savez(data, prompts=prompts)
  extra = ["--new_tokens", str(args.new_tokens), "--malloc", args.malloc, "--dtype", args.dtype]
  workers = {side: Worker(pythons[side], side, "sample", checkpoint, data, extra) for side in ("ours", "tunix")}
  times = {"ours": [], "tunix": []}
  for r in range(args.repeats):
    for side in ("ours", "tunix") if r % 2 == 0 else ("tunix", "ours"):
      times[side].append(workers[side].ask(f"run {r + 1}")["seconds"])
  for w in workers.values():
    w.close()
  rate = lambda ts: [batch * args.new_tokens / t for t in ts]  # noqa: E731
  return pair_summary(rate(times["ours"]), rate(times["tunix"]), higher_is_better=True), \
      {s: w.ready["setup_and_first_s"] for s, w in workers.items()}


def bench_train(pythons, checkpoint, data, args):
  steps, peaks, first = {"ours": [], "tunix": []}, {"ours": [], "tunix": []}, {}
  for pair in range(args.train_pairs):
    for side in ("ours", "tunix") if pair % 2 == 0 else ("tunix", "ours"):
      print(f"[train pair {pair + 1}/{args.train_pairs}] {side} ...", flush=True)
      keep = [f for f, on in (("--keep_logits", args.keep_logits), ("--recompute_logits", args.recompute_logits))
              if on and side == "ours"]
      w = Worker(pythons[side], side, "train", checkpoint, data, ["--malloc", args.malloc, *keep])
      runs = [w.ask(f"run {s}") for s in range(args.train_steps)]
      steps[side].append(statistics.median(r["seconds"] for r in runs))
      peaks[side].append(w.ask("stats")["peak_rss_gb"])
      first.setdefault(side, [w.ready["first"][1:], (runs[0]["loss"], runs[0]["grad_norm"])])
      w.close()
  print(f"train s/step per process, in pair order: ours {steps['ours']}, Tunix {steps['tunix']}", flush=True)
  return (pair_summary(steps["ours"], steps["tunix"], higher_is_better=False),
          pair_summary(peaks["ours"], peaks["tunix"], higher_is_better=False), first, steps)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--setup", action="store_true", help="make the Tunix venv and stop")
  ap.add_argument("--width", choices=["tiny", "qwen3_0p6b"], default="qwen3_0p6b")
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--batches", type=int, nargs="*", default=[1, 16, 64])
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--prompt_length", type=int, default=8)
  ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                  help="sampling: both sides' weights (and so their KV caches) in this dtype")
  ap.add_argument("--repeats", type=int, default=5, help="alternating sampling runs per side and batch")
  ap.add_argument("--skip_train", action="store_true")
  ap.add_argument("--train_shape", type=int, nargs=3, default=[2, 4, 256], metavar=("B", "G", "T"))
  ap.add_argument("--train_steps", type=int, default=3, help="timed steps per process (after 1 warm-up)")
  ap.add_argument("--train_pairs", type=int, default=3, help="(ours, Tunix) process pairs, alternating order")
  ap.add_argument("--malloc", choices=["keep", "default"], default="keep",
                  help="both workers' glibc malloc policy (tunix_worker --malloc)")
  ap.add_argument("--keep_logits", action="store_true",
                  help="our train step with model.logprob_recompute=False (Tunix keeps its logits too)")
  ap.add_argument("--recompute_logits", action="store_true",
                  help="our train step with model.logprob_keep_bytes=0: the logits projected again in the backward "
                       "(the default keeps them when they fit in model.logprob_keep_bytes, as at these shapes)")
  ap.add_argument("--out", help="also write the markdown table here")
  args = ap.parse_args(argv)
  pythons = {"ours": sys.executable, "tunix": tunix_python()}
  if args.setup:
    return print(f"Tunix venv ready: {pythons['tunix']}")

  from benchmarks import ceiling, roofline, sampler_bench
  from oapl_jax.run import compile_check
  from oapl_jax.models import hf
  hf_cfg = hf_config(args.width, args.layers)
  args.vocab = hf_cfg.vocab_size
  rows, notes, sampled = [], [], []
  with tempfile.TemporaryDirectory() as tmp:
    checkpoint = os.path.join(tmp, "ckpt")
    sampler_bench.make_checkpoint(checkpoint, hf_config=hf_cfg)
    config = hf.read_config(checkpoint)
    context = args.prompt_length + (args.new_tokens + 1) / 2
    decode_flops = 2 * compile_check.train_flops(config, 1, 1)["matmul_weights"] + \
        4 * config.num_layers * config.num_heads * config.head_dim * context
    for batch in args.batches:
      print(f"sampling, batch {batch} ...", flush=True)
      s, first = bench_sampling(pythons, checkpoint, tmp, batch, args)
      sampled.append((batch, s))
      rows.append((f"sampling, batch {batch}, {args.new_tokens} new tokens", "tokens/s", s,
                   s["ours"] * decode_flops, s["tunix"] * decode_flops))
      notes.append(f"batch {batch}: compile + first run ours {first['ours']:.1f} s, Tunix {first['tunix']:.1f} s")
    if not args.skip_train:
      B, G, T = args.train_shape
      batch = grpo_batch(B, G, T, args.vocab)
      data = os.path.join(tmp, "grpo.npz")
      np.savez(data, **batch)
      ours_logp = run_logps(pythons["ours"], "ours", checkpoint, data)
      tunix_logp = run_logps(pythons["tunix"], "tunix", checkpoint, data)
      mask = batch["completion_mask"].astype(bool)
      notes.append(f"per-token log-probs at the start, ours vs Tunix: max |diff| "
                   f"{np.abs(ours_logp - tunix_logp)[mask].max():.2e} (mean {ours_logp[mask].mean():.3f})")
      noise = np.random.default_rng(1).uniform(-0.3, 0.3, mask.shape)
      batch["old_logp"] = np.where(mask, ours_logp + noise, 0.0).astype(np.float32)
      np.savez(data, **batch)
      step, peak, first, per_pair = bench_train(pythons, checkpoint, data, args)
      notes.append("train s/step by pair: " + "; ".join(
          f"ours {a:.2f}, Tunix {b:.2f}" for a, b in zip(per_pair["ours"], per_pair["tunix"])))
      flops = compile_check.train_flops(config, B * G, T)["model"]
      rows.append((f"GRPO train step, {B}x{G}x{T}", "s/step", step, flops / step["ours"], flops / step["tunix"]))
      rows.append((f"train peak RSS, {B}x{G}x{T}", "GB", peak, None, None))
      for side in ("ours", "tunix"):
        (l0, g0), (l1, g1) = first[side]
        notes.append(f"{side}: loss {l0:.9f} then {l1:.9f}; grad norm {g0:.6f} then {g1:.6f}")
  peak_flops = ceiling.measure(repeats=3)
  top = 1e9 * max(peak_flops["jax"], peak_flops["torch"])
  rows = [(w, u, s, o and o / top, t and t / top) for w, u, s, o, t in rows]
  table = markdown_table(rows)
  gbps = roofline.read_gbps()
  nbytes = 2 if args.dtype == "bfloat16" else 4
  matmul = peak_flops["jax"] if nbytes == 4 else \
      ceiling.measure(repeats=3, with_torch=False, dtype=args.dtype)["jax"]  # the dtype's own rate
  floors = [(b, roofline.floors(roofline.decode_bytes(config, b, context, nbytes, nbytes), b * decode_flops, b, gbps,
                                matmul), s["ours"], s["tunix"]) for b, s in sampled]
  table += (f"\n\nRoofline ({args.dtype} weights and cache; read {gbps:.1f} GB/s, XLA's best {args.dtype} matmul "
            f"{matmul:.1f} GFLOP/s; benchmarks/roofline.py):\n\n" + roofline.markdown(floors))
  with open("/proc/loadavg") as f:
    load = f.read().split()[:3]
  header = (f"cpu: {ceiling.cpu_description()}; load average {' '.join(load)} at the end\n"
            f"compute ceiling (best f32 matmul): jax {peak_flops['jax']:.1f}, torch {peak_flops['torch']:.1f} "
            f"GFLOP/s\n{args.width} Qwen3, {config.num_layers} layers, vocab {config.vocab_size}, float32 checkpoint, sampled "
            f"in {args.dtype}; "
            f"malloc: {args.malloc}; our logits in the backward: "
            f"{'kept' if args.keep_logits else 'recomputed' if args.recompute_logits else 'the default'}")
  print(header, table, *notes, sep="\n")
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      f.write("\n".join([header, "", table, "", *(f"- {n}" for n in notes)]) + "\n")


if __name__ == "__main__":
  main()
