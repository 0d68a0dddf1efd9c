"""The whole loop side by side: wall time to held-out pass@1 0.8 and 0.9, ours (OAPL at lags 1, 4, 10 and 40, GRPO
off-by-one and on policy) against Tunix 0.1.7's GRPO learner, on the demo's task from one warm start.

    taskset -c 1 .venv/bin/python -m benchmarks.loop_bench --stage tune      # each side at 3 lrs, seed 0
    taskset -c 1 .venv/bin/python -m benchmarks.loop_bench --stage seeds     # seeds 1, 2 at each side's picked lr
    .venv/bin/python -m benchmarks.loop_bench --stage report --out runs/loop_bench/report   # table + PNG (no runs)
    ... --workdir runs/loop_bench_cache --compile_cache runs/loop_bench_cache/jax_cache   # warm start-up: seed 0
        fills JAX's persistent cache (both sides), seeds 1 and 2 start from it

The warm start is the demo's (--config, default configs/arithmetic.py; made once by apps/sweep_warmstart into
WORKDIR/warmstart, with the character tokenizer written beside it as tokenizer.json); each library loads it with its
own loader, Tunix's given the checkpoint's rope_theta (tunix_worker.honour_rope_theta: 0.1.7's Qwen3 drops it), and
before any run the two libraries' logits on it are compared (same_model).
Every side: the demo's 2-digit addition, exact-match reward, 16 prompts x G = 8 per trainer step, 120 steps (--steps),
AdamW (b1 0.9, b2 0.95, clip 1.0), the same 256 held-out prompts, 4 samples each at temperature 0.6, top-p 0.95,
evaluated every 10 trainer steps with the trainer's current params (ours: eval.every_steps; Tunix: before the
learner's next batch). Wall time runs from the loop's start (compilation included) to each eval's end, eval time
excluded (reported apart). Ours runs with no checkpoint but the last (Tunix saves none). Each run is one process,
one at a time, on the CPU cores this is pinned to (taskset). Runs are kept under WORKDIR/<side>/lr*_s*/; a
finished one is not rerun. The lr is picked per side from LRS by the best final pass@1 on seed 0 (ties: the best
mean pass@1 over the curve), and seed 0's run is one of the 3 seeds. A benchmark, not a test.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks import loop_curves
from benchmarks.tunix_bench import ROOT, tunix_python, worker_env
from oapl_jax import parallel

WORKDIR = os.path.join(ROOT, "runs", "loop_bench")
CONFIG = os.path.join(ROOT, "configs", "arithmetic.py")  # the demo's; ":rope1e6" for its model at Qwen3's theta
LRS = (3e-5, 1e-4, 3e-4)
STEPS, EVAL_EVERY = 120, 10
COMMON = [f"--config.warmstart.steps=0", f"--config.eval.every_steps={EVAL_EVERY}",
          "--config.loop.eval_every_syncs=1000000", "--config.checkpoint.every_syncs=1000000"]
# Tunix's regime: the sampler refreshed after every step, a rollout of one step's 16 prompts, each trained once
ON_ARRIVAL = ["--config.loop.sync_every=1", "--config.loop.steps_per_rollout=1", "--config.loop.prompts_per_rollout=16"]
SIDES = {  # name: loop overrides of configs/arithmetic.py (B = 16, G = 8; 120 steps each), or None: Tunix
    "oapl_L10": [],  # the demo's settings (mesh.cpu_compile='fast_start' from 2026-11-29 on)
    "oapl_L4": ["--config.loop.sync_every=4"],
    "oapl_L40": ["--config.loop.sync_every=40"],
    # OAPL at its smallest lag, in Tunix's regime: a fresh rollout of each step's 16 prompts, trained once
    "oapl_L1": ON_ARRIVAL,
    # the same, at L = 2: a window's second chunk is sampled while its first trains (2026-11-30 on)
    "oapl_L2": [*ON_ARRIVAL[1:], "--config.loop.sync_every=2"],
    "grpo_obo": ["--config.trainer.loss=grpo", "--config.loop.sync_every=2",  # experiments/plan.py's shape
                 "--config.loop.steps_per_rollout=2", "--config.loop.prompts_per_rollout=32",  # off_by_one
                 "--config.loop.sampler_delay_windows=1"],
    "tunix_grpo": None,
    # our GRPO on policy, in the same regime
    "grpo_sync": ["--config.trainer.loss=grpo", *ON_ARRIVAL],
    # our programs at XLA's defaults (before 2026-11-29, the demo's), or each one compiled for a short start
    # (mesh.cpu_compile='fast_start': fusion emitters off, LLVM at -O1); Tunix under the same XLA options (as
    # XLA_FLAGS: it has no per-program setting)
    "oapl_L10_fast_code": ["--config.mesh.cpu_compile=fast_code"],
    "oapl_L10_fast_start": ["--config.mesh.cpu_compile=fast_start"],
    "tunix_grpo_fast_start": None,
    # the demo without the prefill cap (before 2026-11-29's sampler.max_prefill_batch: a prefill per fill's prompts)
    "oapl_L10_uncapped": ["--config.sampler.max_prefill_batch=0"],
    # the demo's vocabulary projection in 512-token chunks (before 2026-11-29's one chunk)
    "oapl_L10_chunked": ["--config.model.logprob_chunk_tokens=512"],
}
SIDE_ENV = {"tunix_grpo_fast_start": {"XLA_FLAGS": " ".join(f"--{name}={str(value).lower()}" for name, value
                                                            in parallel.CPU_COMPILE["fast_start"].items())}}


def prepare(workdir: str, config: str = CONFIG) -> tuple[str, str]:
  """(the warm start's HF directory with tokenizer.json, data.json for the Tunix worker), made once."""
  from oapl_jax.run import shared_warmstart
  shared_warmstart.ensure(config, workdir, [])
  warm, data = shared_warmstart.directory(workdir), os.path.join(workdir, "data.json")
  if not os.path.exists(data):
    from oapl_jax.run import assemble, export, files, schema
    rc = schema.from_config(files.load(config, []))
    task = assemble.build_task(rc)
    export.write_char_tokenizer(task.tokenizer, warm, rc.model.overrides["max_position_embeddings"])
    held = task.eval_sets["held_out"][:rc.eval.num_prompts]
    fields = lambda ps: [{"prompt": p.prompt, "answer": p.answer} for p in ps]  # noqa: E731
    o, s, e = rc.trainer.optim, rc.sampler, rc.eval
    out = {"train": fields(task.train), "held_out": fields(held),
           "optim": {"b1": o.b1, "b2": o.b2, "weight_decay": o.weight_decay, "max_grad_norm": o.max_grad_norm},
           "sampling": {"temperature": s.temperature, "top_p": s.top_p, "max_new_tokens": s.max_new_tokens,
                        "max_prompt_length": s.max_prefill_length},
           "eval": {"temperature": e.temperature, "top_p": e.top_p, "samples": e.samples,
                    "max_new_tokens": e.max_new_tokens}}
    task.close()
    with open(data + ".tmp", "w") as f:
      json.dump(out, f)
    os.replace(data + ".tmp", data)
  return warm, data


SAME_MODEL_TOLERANCE = 1e-3  # largest |logit| difference the two libraries may show on the warm start (float32)


def same_model(workdir: str, warm: str, data: str) -> float:
  """The largest |logit| difference between our loader's model and Tunix's on the first held-out prompt (kept in
  WORKDIR/same_model.json); refuses the benchmark above SAME_MODEL_TOLERANCE: the sides must train one model."""
  path = os.path.join(workdir, "same_model.json")
  if not os.path.exists(path):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    from oapl_jax.models import decoder, hf  # pylint: disable=import-outside-toplevel
    with open(data) as f:
      prompt = json.load(f)["held_out"][0]["prompt"]
    tokens = transformers.PreTrainedTokenizerFast.from_pretrained(warm)(prompt)["input_ids"]
    config, params = hf.load(warm)
    ours = np.asarray(decoder.logits(params, config, np.asarray([tokens], np.int32))[0])
    out = subprocess.run([tunix_python(), "-m", "benchmarks.tunix_logits", "--checkpoint", warm, "--tokens",
                          ",".join(map(str, tokens))], cwd=ROOT, capture_output=True, text=True, env=worker_env())
    if out.returncode:
      raise SystemExit(f"benchmarks.tunix_logits failed:\n{out.stderr[-2000:]}")
    theirs = np.asarray(json.loads(out.stdout.strip().splitlines()[-1])["logits"])
    record = {"prompt": prompt, "tokens": tokens, "max_abs_logit_diff": float(np.abs(ours - theirs).max()),
              "per_position": np.abs(ours - theirs).max(-1).tolist()}
    with open(path, "w") as f:
      json.dump(record, f, indent=1)
  with open(path) as f:
    diff = json.load(f)["max_abs_logit_diff"]
  if diff > SAME_MODEL_TOLERANCE:
    raise SystemExit(f"the two libraries do not run one model on {warm}: logits up to {diff:.3g} apart ({path}); "
                     "check tunix_worker.tunix_model's reading of the checkpoint's config.json")
  print(f"[loop_bench] one model: ours and Tunix's logits agree to {diff:.2g} on the warm start", flush=True)
  return diff


def run_dir(workdir: str, side: str, lr: float, seed: int) -> str:
  return os.path.join(workdir, side, f"lr{lr:g}_s{seed}")


def cpu_seconds() -> tuple[float, float]:
  """(busy seconds of the CPUs this process may run on, from /proc/stat; CPU seconds of its finished children):
  over a run, busy minus the run's own is what other processes took of those CPUs."""
  mine = {f"cpu{c}" for c in os.sched_getaffinity(0)}
  with open("/proc/stat") as f:
    rows = [line.split() for line in f if line.split()[0] in mine]
  ticks = os.sysconf("SC_CLK_TCK")
  busy = sum(sum(map(int, r[1:])) - int(r[4]) - int(r[5]) for r in rows) / ticks  # all but idle and iowait
  child = resource.getrusage(resource.RUSAGE_CHILDREN)
  return busy, child.ru_utime + child.ru_stime


def loop_args(side: str, steps: int, config: str = CONFIG) -> list[str]:
  """Our side's overrides for a run of `steps` trainer steps: its windows (num_syncs) from its lag."""
  from oapl_jax.run import files  # pylint: disable=import-outside-toplevel
  lag = files.load(config, SIDES[side]).loop.sync_every
  if steps % lag:
    raise SystemExit(f"--steps {steps} is not a whole number of {side}'s windows of {lag} steps")
  return [*SIDES[side], f"--config.loop.num_syncs={steps // lag}"]


def run(workdir: str, side: str, lr: float, seed: int, warm: str, data: str, env: dict | None = None,
        steps: int = STEPS, config: str = CONFIG) -> dict:
  """One run (skipped when its result.json exists); returns loop_curves.Result fields as a dict."""
  where = run_dir(workdir, side, lr, seed)
  result_path = os.path.join(where, "result.json")
  if os.path.exists(result_path):
    with open(result_path) as f:
      return json.load(f)
  shutil.rmtree(where, ignore_errors=True)  # a run cut short starts over: a resume would not be one run's time
  os.makedirs(where)
  print(f"[loop_bench] {side} lr {lr:g} seed {seed} ...", flush=True)
  if SIDES[side] is None:
    cmd = [tunix_python(), "-m", "benchmarks.loop_tunix_worker", "--checkpoint", warm, "--data", data,
           "--lr", str(lr), "--seed", str(seed), "--steps", str(steps), "--eval_every", str(EVAL_EVERY),
           "--out", os.path.join(where, "tunix.json")]
  else:
    cmd = [sys.executable, "-m", "oapl_jax.main", "--config", config, "--workdir", os.path.join(where, "run"),
           f"--config.model.checkpoint={warm}", f"--config.seed={seed}", f"--config.trainer.optim.lr={lr}",
           *COMMON, *loop_args(side, steps, config)]
  before, start = cpu_seconds(), time.perf_counter()
  with open(os.path.join(where, "log.txt"), "w") as log:
    env = {**worker_env(), **SIDE_ENV.get(side, {}), **(env or {})}
    if subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env).returncode:
      raise SystemExit(f"{side} lr {lr:g} seed {seed} failed; see {where}/log.txt")
  (busy0, own0), (busy1, own1) = before, cpu_seconds()
  result = (loop_curves.from_tunix(os.path.join(where, "tunix.json")) if SIDES[side] is None
            else loop_curves.from_ours(os.path.join(where, "run")))
  result["host"] = {"load_at_end": os.getloadavg(), "others_cpu_seconds": busy1 - busy0 - (own1 - own0),
                    "own_cpu_seconds": own1 - own0, "process_seconds": time.perf_counter() - start,
                    "cpus": sorted(os.sched_getaffinity(0))}  # others': what other processes took of our CPUs meanwhile
  with open(result_path, "w") as f:
    json.dump(result, f, indent=1)
  return result


def picked_lr(workdir: str, side: str) -> float | None:
  tuned = {lr: _load(run_dir(workdir, side, lr, 0)) for lr in LRS}
  return loop_curves.pick_lr({lr: r for lr, r in tuned.items() if r is not None})


def _load(where: str) -> dict | None:
  """A finished run's result, derived again from its files (so a fix in loop_curves reaches old runs)."""
  path = os.path.join(where, "result.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    host = json.load(f).get("host", {})
  tunix = os.path.join(where, "tunix.json")
  result = loop_curves.from_tunix(tunix) if os.path.exists(tunix) else loop_curves.from_ours(os.path.join(where, "run"))
  return {**result, "host": host}


def report(workdir: str, out: str) -> str:
  """The table (markdown) and curves (PNG) over every side's runs at its picked lr."""
  from benchmarks import ceiling
  rows, curves = [], {}
  for side in SIDES:
    lr = picked_lr(workdir, side)
    if lr is None:
      continue
    results = [r for s in range(3) if (r := _load(run_dir(workdir, side, lr, s))) is not None]
    rows.append(loop_curves.row(side, lr, results))
    curves[side] = results
  os.makedirs(out, exist_ok=True)
  png = os.path.join(out, "loop_bench.png")
  loop_curves.plot(curves, png)
  load = " ".join(f"{x:.2f}" for x in os.getloadavg())
  cpus = sorted({str(r["host"]["cpus"]) for rs in curves.values() for r in rs if "cpus" in r.get("host", {})})
  text = "\n".join([f"cpu: {ceiling.cpu_description()}; load average {load} at the report; the runs' CPUs "
                    f"(taskset): {', '.join(cpus) or 'not recorded'}", "",
                    loop_curves.markdown(rows), "", f"curves: {png}", ""])
  with open(os.path.join(out, "loop_bench.md"), "w") as f:
    f.write(text)
  return text


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--stage", choices=["tune", "seeds", "report"], required=True)
  ap.add_argument("--sides", nargs="*", default=list(SIDES), choices=list(SIDES))
  ap.add_argument("--lrs", type=float, nargs="*", default=list(LRS), help="tune: these of LRS only")
  ap.add_argument("--workdir", default=WORKDIR)
  ap.add_argument("--config", default=CONFIG, help="our side's config and the warm start's (give each its own "
                  "--workdir)")
  ap.add_argument("--out", default=os.path.join(WORKDIR, "report"))
  ap.add_argument("--steps", type=int, default=STEPS, help="trainer steps a run (every side; give each count its "
                  "own --workdir)")
  ap.add_argument("--compile_cache", help="JAX's persistent compilation cache for every run (both sides): a second "
                  "run in the same cache starts without compiling; use its own --workdir")
  args = ap.parse_args(argv)
  from benchmarks import ceiling
  print(f"cpu: {ceiling.cpu_description()}; CPUs {sorted(os.sched_getaffinity(0))}; load {os.getloadavg()}",
        flush=True)
  if args.stage == "report":
    return print(report(args.workdir, args.out))
  warm, data = prepare(args.workdir, args.config)
  if any(SIDES[side] is None for side in args.sides):
    same_model(args.workdir, warm, data)
  env = {"JAX_COMPILATION_CACHE_DIR": os.path.abspath(args.compile_cache)} if args.compile_cache else {}
  for side in args.sides:
    if args.stage == "tune":
      for lr in args.lrs:
        r = run(args.workdir, side, lr, 0, warm, data, env, args.steps, args.config)
        print(f"[loop_bench] {side} lr {lr:g}: final pass@1 {r['curve'][-1]['pass@1']:.3f}, "
              f"load {os.getloadavg()}", flush=True)
    else:
      lr = picked_lr(args.workdir, side)
      for seed in (1, 2) if lr is not None else ():
        r = run(args.workdir, side, lr, seed, warm, data, env, args.steps, args.config)
        print(f"[loop_bench] {side} lr {lr:g} seed {seed}: final pass@1 {r['curve'][-1]['pass@1']:.3f}, "
              f"load {os.getloadavg()}", flush=True)


if __name__ == "__main__":
  main()
