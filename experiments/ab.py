"""A paired A/B comparison: arms that differ only by config overrides, run from one fixed warm start with the
same RL seeds, compared by seed (the first arm is the reference; every other arm minus it, paired).

  python -m experiments.ab --out reports/lora_vs_full --seeds 0,1,2,3,4 \
      --arm "full" --arm "lora trainer.lora.rank=8 trainer.optim.lr=1e-3"

  python -m experiments.ab --config configs/own_task.py --out reports/own_lora --arm full --arm "lora ..."

Each arm is 'NAME [dotted.key=value ...]' on top of --config FILE[:ARG] (any training config, split into
validation and test as the study does: experiments/task_config.py; default the claims study's task A,
configs/claims.py:arithmetic) and --set overrides shared by every arm. The config and its data are checked
first (experiments/task_config.preflight); the warm start is the study's (experiments/claims.warm_start: the
config's own, made once by apps/sweep_warmstart, keyed by what it is made from) under --warm. Per run: final test pass@k (the study's test eval, same seed for every arm), generations the sampler
made (rollout/generations: demonstrations put into the buffer are none; chunks made ahead and dropped at an early
refresh count), sampler refreshes, trainer steps, wall time; then the paired differences with 95% t-intervals and exact sign-flip p
(experiments/paired_stats.py), report.md, results.json and curves.png (the current policy's validation pass@1).
Runs are resumable: a finished run's final.json is reused.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

from experiments import claims, paired_stats, plan, results, stopping, task_config


def parse_arm(text: str) -> tuple[str, dict]:
  name, *sets = shlex.split(text)
  from oapl_jax.run import files  # pylint: disable=import-outside-toplevel
  return name, dict(files.parse_override(s) for s in sets)


def arm_loop(study: plan.Study, overrides: dict) -> tuple[dict, dict]:
  """(the arm's overrides with its loop shape applied as the study applies it, the shape's description).

  `shape=fresh|reuse2|off_by_one|on_policy` and `lag=L` name a shape; without them the arm gets its loss's
  study shape (OAPL and the others: fresh at the study's L; GRPO: off-by-one; on-policy GRPO: every step), so an
  arm given only trainer.loss=grpo runs as the study's GRPO, never at OAPL's lag. An arm that sets loop.* fields
  itself keeps them (they win over the shape's)."""
  own = dict(overrides)
  shape, lag = own.pop("shape", None), own.pop("lag", None)
  loss = str(own.get("trainer.loss", "oapl"))
  if shape is None:
    arm = study.tuning_arm(loss) if loss in plan.KNOBS else plan.Arm(loss, loss, "fresh", study.lag, "claim")
    shape, lag = arm.shape, lag or arm.lag
  lag = int(lag or (2 if shape == "off_by_one" else 1 if shape == "on_policy" else study.lag))
  loop = plan.loop_overrides(study, plan.Arm(loss, loss, str(shape), lag, "claim"))
  return {**loop, **own}, {"loss": loss, "shape": shape, "lag": lag}


def curve_metrics(workdir: str) -> dict:
  """The validation curve's area (the study's tuning score) and the late entropy, from the run's metrics.jsonl."""
  from experiments import tuning  # pylint: disable=import-outside-toplevel
  history = results.read_history(workdir)
  r = results.RunResult(None, {"trainer_steps": max((int(h["step"]) for h in history), default=0)}, history)
  curve = r.curve()
  return {"val_auc": tuning.auc(curve) if len(curve) > 1 else float("nan"),
          "val_entropy": r.late_mean("token_entropy")}


def run_one(study: plan.Study, overrides: dict, warm_dir: str, workdir: str) -> dict:
  """One run (resumable), then the study's final test eval; returns (and writes) final.json."""
  done = results.read_json(os.path.join(workdir, "final.json"))
  if done is not None:
    return done
  from oapl_jax import evaluation  # pylint: disable=import-outside-toplevel
  from oapl_jax.rl import loop  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import assemble, files, schema  # pylint: disable=import-outside-toplevel
  start = time.time()
  cfg = files.load(study.config, {**plan.shape_overrides(study), "model.checkpoint": warm_dir, "warmstart.steps": 0,
                                  **overrides})
  run = assemble.setup(cfg, workdir)
  summary = loop.train(run)
  if not summary["finished"]:
    raise RuntimeError(f"{workdir}: the run stopped before its last window ({summary})")
  rc, history = schema.from_config(cfg), run.reporter.history()
  _, tests = task_config.task_and_tests(rc.task)
  samples, ks = claims.final_sampling(study)
  params = run.sampler.prepare(run.policy_params(run.state))
  final = {"overrides": overrides, "trainer_steps": summary["trainer_steps"],
           "generations": sum(h.get("rollout/generations", 0.0) for h in history),
           "refreshes": sum("sampler/refresh_seconds" in h for h in history),
           "test": {name: evaluation.evaluate(run.sampler, params, run.task, problems, samples=samples, ks=ks,
                                              settings=run.eval_settings,
                                              seed=assemble.eval_seed(rc) + claims.FINAL_SEED_OFFSET)
                    for name, problems in tests.items()},
           "wall_seconds": time.time() - start}
  results.write_json(os.path.join(workdir, "final.json"), final)
  return final


def run_all(study: plan.Study, arms: dict, seeds: list[int], warm_dir: str, out: str, finals: dict,
            workdirs: dict) -> None:
  """Every arm x seed, seed-major (a cut-short A/B stays paired), filling finals and workdirs."""
  total, started, ran = len(arms) * len(seeds), time.time(), 0
  for i, (seed, arm) in enumerate((s, a) for s in seeds for a in arms):
    workdir = os.path.join(out, "runs", arm, f"seed{seed}")
    workdirs[arm][seed] = workdir
    ran += results.read_json(os.path.join(workdir, "final.json")) is None
    finals[arm][seed] = {**run_one(study, {**arms[arm], "seed": seed}, warm_dir, workdir), **curve_metrics(workdir)}
    eta = (time.time() - started) / max(ran, 1) * (total - i - 1)  # from the runs made here, not the reused
    print(f"[ab] {i + 1}/{total} {arm} seed {seed}: test pass@1 {value(finals[arm][seed], 'test/pass@1'):.4f}; "
          f"ETA {eta / 60:.1f} min", flush=True)


def compare(finals: dict[str, dict[int, dict]], metrics: list[str]) -> list[dict]:
  """Every arm after the first minus the first, per metric, paired by seed."""
  arms = list(finals)
  rows = []
  for arm in arms[1:]:
    for metric in metrics:
      a = {s: value(f, metric) for s, f in finals[arm].items()}
      b = {s: value(f, metric) for s, f in finals[arms[0]].items()}
      seeds, diffs = paired_stats.differences(a, b)
      s = paired_stats.paired(diffs)
      rows.append({"arm": arm, "reference": arms[0], "metric": metric, "seeds": seeds, "diffs": diffs,
                   "mean": s.mean, "ci_low": s.ci_low, "ci_high": s.ci_high, "p": s.p, "n": s.n})
  return rows


def value(final: dict, metric: str) -> float:
  """'test/pass@1' -> the mean over test sets; 'generations', 'refreshes', 'wall_seconds' as recorded."""
  if metric.startswith("test/"):
    key = metric.split("/", 1)[1]
    return sum(m[key] for m in final["test"].values()) / len(final["test"])
  return float(final[metric]) if metric in final else float("nan")


def plot_curves(out: str, workdirs: dict[str, dict[int, str]]) -> str:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(7, 4))
  for color, (arm, runs) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], workdirs.items()):
    for seed, workdir in runs.items():
      with open(os.path.join(workdir, "metrics.jsonl")) as f:
        history = [json.loads(line) for line in f]
      points = [(h["step"], v) for h in history for k, v in h.items()
                if k.startswith("policy_eval/") and k.endswith("/pass@1")]
      if points:
        ax.plot(*zip(*points), color=color, alpha=0.6, lw=1, label=arm if seed == min(runs) else None)
  ax.set(xlabel="trainer step", ylabel="validation pass@1 (current policy)", title=os.path.basename(out))
  ax.legend()
  path = os.path.join(out, "curves.png")
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path


def write_report(out: str, argv: list[str], finals: dict, rows: list[dict], metrics: list[str], warm_line: str) -> str:
  lines = [f"# {os.path.basename(out)}", "", "Command: `python -m experiments.ab " + " ".join(map(shlex.quote, argv)) + "`",
           "", f"Seeds: {sorted(next(iter(finals.values())))}. " + warm_line, "",
           "| arm | overrides | " + " | ".join(f"mean {m}" for m in metrics) + " |", "|---|---|" + "---|" * len(metrics)]
  for arm, runs in finals.items():
    first = next(iter(runs.values()))
    means = [sum(value(f, m) for f in runs.values()) / len(runs) for m in metrics]
    shown = {k: v for k, v in first["overrides"].items() if k != "seed"}
    lines.append(f"| {arm} | `{shown}` | " + " | ".join(f"{x:.4g}" for x in means) + " |")
  lines += ["", "Paired by seed (arm minus reference):", "",
            "| arm - reference | metric | n | mean diff | 95% t-interval | sign-flip p | per-seed diffs |",
            "|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['arm']} - {r['reference']} | {r['metric']} | {r['n']} | {r['mean']:+.4g} | "
                 f"[{r['ci_low']:+.4g}, {r['ci_high']:+.4g}] | {r['p']:.4f} | "
                 + ", ".join(f"{d:+.3g}" for d in r["diffs"]) + " |")
  lines += ["", "![curves](curves.png)", ""]
  path = os.path.join(out, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  p.add_argument("--arm", action="append", required=True, help="'NAME key=value ...'; the first is the reference")
  p.add_argument("--seeds", default="0,1,2,3,4")
  p.add_argument("--config", help="FILE[:ARG]: any training config (default configs/claims.py:arithmetic)")
  p.add_argument("--smoke", action="store_true", help="the study's smoke sizes (a 5-step warm start, 8 eval prompts)")
  p.add_argument("--set", action="append", default=[], help="key=value for every arm")
  p.add_argument("--warm", help="the warm start's directory (default runs/ab/<task>/warm_<key>/warmstart)")
  p.add_argument("--steps", type=int, help="S, every arm's trainer steps (default the study's); a lag must divide it")
  p.add_argument("--metrics", default="test/pass@1,val_auc,val_entropy,test/pass@8,generations,refreshes,wall_seconds")
  args = p.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # --set reshapes the study itself (as experiments.study's --set): its batch B sizes every arm's chunks
  shared = dict(parse_arm("shared " + " ".join(args.set))[1])
  study = plan.make_study(None if args.config else "arithmetic", args.config, smoke=args.smoke, steps=args.steps,
                          sets=shared)
  try:
    task_config.preflight(study.config, dict(plan.shape_overrides(study)))
  except task_config.ConfigRefused as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  out = os.path.abspath(os.path.expanduser(args.out))
  warm_dir = os.path.abspath(os.path.expanduser(args.warm)) if args.warm else \
      claims.warm_dir_of(os.path.join(plan.REPO, "runs", "ab"), study)
  arms, shapes = {}, {}
  for text in args.arm:
    name, sets = parse_arm(text)
    arms[name], shapes[name] = arm_loop(study, {**shared, **sets})
    print(f"[ab] arm {name}: {shapes[name]['loss']}, shape {shapes[name]['shape']} at L = {shapes[name]['lag']}",
          flush=True)
  seeds = [int(s) for s in args.seeds.split(",")]
  metrics = args.metrics.split(",")
  warm = claims.warm_start(study, warm_dir)
  finals: dict = {arm: {} for arm in arms}
  workdirs: dict = {arm: {} for arm in arms}
  with stopping.one_line_stop("ab"):
    run_all(study, arms, seeds, warm_dir, out, finals, workdirs)
  rows = compare(finals, metrics)
  results.write_json(os.path.join(out, "results.json"), {"arms": arms, "shared": shared, "finals": finals, "paired": rows})
  plot_curves(out, workdirs)
  warm_test = {name: m["pass@1"] for name, m in warm["test"].items()}
  warm_line = f"The warm start every run starts from ({warm_dir}): test pass@1 {warm_test}."
  print(open(write_report(out, argv, finals, rows, metrics, warm_line)).read())
  return 0


if __name__ == "__main__":
  sys.exit(main())
