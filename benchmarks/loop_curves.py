"""loop_bench's pure pieces (tested in tests/loop_bench_test.py): a run's eval curve and rates from our run
directory or the Tunix worker's JSON, time to a pass@1 threshold, the lr pick, the table and the PNG.

A result: {"curve": [{"step", "seconds" (loop wall time at the eval's end, eval time excluded), "pass@1",
"generations" (sampled so far)}], "run_seconds", "eval_seconds", "generated_tokens", "trained_tokens",
"trainer_wait_seconds", "sampler_wait_seconds", "phases"}.
"""
import json
import math
import os
import statistics
from typing import Optional, Sequence

THRESHOLDS = (0.8, 0.9)
PASS_KEYS = ("policy_eval/held_out/pass@1", "eval/held_out/pass@1")  # the trainer's policy first


def time_to(curve: Sequence[dict], threshold: float) -> Optional[float]:
  """Seconds (eval excluded) at which pass@1 first reaches `threshold`, linear between the last eval below it and
  the first at or above it; the first eval's time if it starts there; None if never reached."""
  before = None
  for point in curve:
    if point["pass@1"] >= threshold:
      if before is None:
        return point["seconds"]
      frac = (threshold - before["pass@1"]) / (point["pass@1"] - before["pass@1"])
      return before["seconds"] + frac * (point["seconds"] - before["seconds"])
    before = point
  return None


def median_time(times: Sequence[Optional[float]]) -> Optional[float]:
  """The median with 'not reached' (None) counted as later than any time; None when that is the median."""
  median = statistics.median([math.inf if t is None else t for t in times])
  return None if math.isinf(median) else median


def pick_lr(tuned: dict) -> Optional[float]:
  """The lr whose run ends with the best pass@1 (ties: the best mean pass@1 over its curve); None if none ran."""
  score = lambda r: (r["curve"][-1]["pass@1"], statistics.fmean(p["pass@1"] for p in r["curve"]))  # noqa: E731
  return max(tuned, key=lambda lr: score(tuned[lr])) if tuned else None


def from_ours(workdir: str) -> dict:
  """A result from our run directory: metrics.jsonl (the evals and their time marks) and summary.json (phases)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    history = [json.loads(line) for line in f if line.strip()]
  with open(os.path.join(workdir, "summary.json")) as f:
    phases = json.load(f)["phase_seconds"]
  pass1, marks = {}, {}
  for h in history:
    for key in PASS_KEYS[::-1]:  # the policy probe's value wins where both were logged at one step
      if key in h:
        pass1[h["step"]] = h[key]
    if "time/loop_seconds" in h:
      marks[h["step"]] = (h["time/loop_seconds"], h["time/eval_seconds"])
  rollouts = [h for h in history if "rollout/generations" in h]
  last = max(marks)
  curve = [{"step": s, "seconds": loop - ev, "pass@1": pass1[s],
            "generations": sum(h["rollout/generations"] for h in rollouts if h["step"] < s or s == last)}
           for s, (loop, ev) in sorted(marks.items())]
  return {"curve": curve, "run_seconds": curve[-1]["seconds"], "eval_seconds": marks[last][1],
          "generated_tokens": sum(h["rollout/generations"] * h["rollout/response_length"] for h in rollouts),
          "trained_tokens": sum(h["train/tokens"] for h in history if "train/tokens" in h),
          "trainer_wait_seconds": phases["trainer"].get("waiting for samples", 0.0),
          "sampler_wait_seconds": max(0.0, phases.get("sampler", {}).get("waiting for the trainer", 0.0)
                                      - phases["trainer"].get("eval", 0.0)),  # not while the trainer evaluates
          "phases": phases}


def from_tunix(path: str) -> dict:
  """A result from loop_tunix_worker's JSON. Tunix samples and trains one after the other (one mesh): the trainer
  waits while the rollout samples and scores, the sampler the rest of the time (eval time excluded)."""
  with open(path) as f:
    raw = json.load(f)
  curve = [{"step": p["step"], "seconds": p["loop_seconds"] - p["eval_seconds"], "pass@1": p["pass@1"],
            "generations": p["generations"]} for p in raw["curve"]]
  run_seconds, phases = curve[-1]["seconds"], raw["phases"]
  return {"curve": curve, "run_seconds": run_seconds, "eval_seconds": raw["curve"][-1]["eval_seconds"],
          "generated_tokens": raw["tokens"]["generated"], "trained_tokens": raw["tokens"]["trained"],
          "trainer_wait_seconds": phases["sampling"] + phases["scoring"],
          "sampler_wait_seconds": run_seconds - phases["sampling"] - phases["scoring"], "phases": phases}


def row(side: str, lr: float, results: Sequence[dict]) -> dict:
  """Medians over seeds of one side's results."""
  med = lambda f: statistics.median(f(r) for r in results)  # noqa: E731
  return {"side": side, "lr": lr, "seeds": len(results),
          **{f"to {t}": median_time([time_to(r["curve"], t) for r in results]) for t in THRESHOLDS},
          "final pass@1": med(lambda r: r["curve"][-1]["pass@1"]), "run s": med(lambda r: r["run_seconds"]),
          "eval s": med(lambda r: r["eval_seconds"]),
          "generated tok/s": med(lambda r: r["generated_tokens"] / r["run_seconds"]),
          "trained tok/s": med(lambda r: r["trained_tokens"] / r["run_seconds"]),
          "trainer waits": med(lambda r: r["trainer_wait_seconds"] / r["run_seconds"]),
          "sampler waits": med(lambda r: r["sampler_wait_seconds"] / r["run_seconds"]),
          "others_cpu": statistics.median([h["others_cpu_seconds"] / h["process_seconds"] for r in results
                                            if (h := r.get("host"))] or [math.nan])}


def markdown(rows: Sequence[dict]) -> str:
  secs = lambda t: "not reached" if t is None else f"{t:.0f}"  # noqa: E731
  share = lambda x: "n/a" if math.isnan(x) else f"{x:.0%}"  # noqa: E731
  lines = ["| side | lr | seeds | s to pass@1 0.8 | s to 0.9 | final pass@1 | run s | eval s (apart) | "
           "generated tok/s | trained tok/s | trainer waits | sampler waits | others' CPU share |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['side']} | {r['lr']:g} | {r['seeds']} | {secs(r['to 0.8'])} | {secs(r['to 0.9'])} | "
                 f"{r['final pass@1']:.3f} | {r['run s']:.0f} | {r['eval s']:.0f} | {r['generated tok/s']:.0f} | "
                 f"{r['trained tok/s']:.0f} | {r['trainer waits']:.0%} | {r['sampler waits']:.0%} | "
                 f"{share(r['others_cpu'])} |")
  return "\n".join(lines)


def plot(curves: dict, path: str) -> None:
  """pass@1 against wall time (eval excluded) and against generations; one colour per side, one line per seed."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
  for i, (side, results) in enumerate(curves.items()):
    for j, r in enumerate(results):
      for ax, x in zip(axes, ("seconds", "generations")):
        ax.plot([p[x] for p in r["curve"]], [p["pass@1"] for p in r["curve"]], color=f"C{i}", alpha=0.8,
                marker="o", markersize=3, label=side if j == 0 else None)
  for ax, xlabel in zip(axes, ("wall seconds from the loop's start, eval excluded", "generations sampled")):
    ax.set(xlabel=xlabel, ylabel="held-out pass@1", ylim=(0, 1.02))
    for t in THRESHOLDS:
      ax.axhline(t, color="gray", lw=0.5, ls="--")
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
