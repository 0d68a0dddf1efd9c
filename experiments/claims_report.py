"""The claims study's report: tables (mean ± sd over seeds), PNGs, and one verdict line per claim.

Every number comes from a run directory: final_eval.json (the harness's val/test pass@k with
`final_samples` per prompt) and metrics.jsonl (the loop's in-loop validation curve and per-step
trainer metrics). A cell (loss, lag) with no finished seed is listed as missing, never guessed.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import numpy as np

from oapl_jax.apps import sweep
from experiments import claims

CURVE_KEY = "eval/val/pass@1"
COLLAPSE_FRACTION = 0.5  # pass@1 falling to half its best


@dataclasses.dataclass
class RunResult:
  cell: claims.Cell
  final: dict  # final_eval.json
  curve: list[tuple[int, float]]  # (trainer step, in-loop validation pass@1)
  entropy: list[tuple[int, float]]  # (step, trainer per-token entropy of the sampled responses)
  log_ratio: list[tuple[int, float]]  # (step, mean |log pi - log pi_sampler| per sequence)
  loss: list[tuple[int, float]]
  generations_per_step: float

  @property
  def collapsed(self) -> bool:
    """pass@1 fell to half its best (or below) at some eval after the best."""
    values = [v for _, v in self.curve]
    best = int(np.argmax(values)) if values else 0
    return bool(values) and values[best] > 0 and min(values[best:]) <= COLLAPSE_FRACTION * values[best]

  def final_entropy(self) -> float:
    """Trainer per-token entropy, averaged over the last quarter of training."""
    if not self.entropy:
      return float("nan")
    last = self.entropy[-1][0]
    return float(np.mean([v for s, v in self.entropy if s >= 0.75 * last]))

  def test_nll_per_token(self) -> float:
    """The final policy's -log p per response token on its own test samples (eval sampling)."""
    return self.final["test"]["sequence_entropy"] / max(self.final["test"]["response_length"], 1e-9)

  def mean_log_ratio(self) -> float:
    return float(np.mean([v for _, v in self.log_ratio])) if self.log_ratio else float("nan")

  def generations_to(self, target: float) -> float:
    """Sampled responses before the first in-loop eval at or above `target` (inf: never)."""
    return next((step * self.generations_per_step for step, v in self.curve if v >= target), float("inf"))


def _series(history: list[dict], key: str) -> list[tuple[int, float]]:
  return [(h["step"], h[key]) for h in history if key in h]


def load_run(study: claims.Study, runs_dir: str, cell: claims.Cell) -> RunResult | None:
  workdir = os.path.join(runs_dir, claims.run_dir_name(study, cell))
  if not claims.is_done(workdir):
    return None
  final, history = claims.read_final(workdir), sweep.read_history(workdir)
  return RunResult(cell, final, _series(history, CURVE_KEY), _series(history, "train/entropy"),
                   _series(history, "train/seq_log_ratio_abs_mean"), _series(history, "train/loss"),
                   final["generations"] / max(final["trainer_steps"], 1))


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
  values = np.asarray(values, np.float64)
  return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def fmt(values: Sequence[float], digits: int = 3) -> str:
  """'mean ± sd (n=N)'; the sd is over seeds (ddof 1; 0 for one seed)."""
  if not len(values):
    return "missing"
  finite = [v for v in values if np.isfinite(v)]
  if len(finite) < len(values):
    return f"{len(values) - len(finite)}/{len(values)} never" + (f"; rest {fmt(finite, digits)}" if finite else "")
  m, s = mean_sd(values)
  return f"{m:.{digits}f} ± {s:.{digits}f} (n={len(values)})"


def compare(a: Sequence[float], b: Sequence[float]) -> str:
  """'better' / 'worse' if mean(a) - mean(b) exceeds the larger of the two seed sds, else 'tie';
  'one seed' when either side has fewer than two (no spread to compare against)."""
  if min(len(a), len(b)) < 2:
    return "one seed"
  (ma, sa), (mb, sb) = mean_sd(a), mean_sd(b)
  margin = max(sa, sb)
  return "better" if ma - mb > margin else "worse" if mb - ma > margin else "tie"


def _verdict(outcomes: Sequence[str]) -> str:
  """supported: better at most lags and worse at none; not supported: better at none; else inconclusive
  (also when no lag has two seeds on both sides, or nothing was compared)."""
  better, worse = outcomes.count("better"), outcomes.count("worse")
  if not outcomes or "one seed" in outcomes:
    return "inconclusive"
  if better * 2 > len(outcomes) and not worse:
    return "supported"
  if not better:
    return "not supported"
  return "inconclusive"


# ------------------------------------------------------------------------------ the report
def write_report(study: claims.Study, runs_dir: str, out_dir: str, best: dict[str, int]) -> str:
  os.makedirs(out_dir, exist_ok=True)
  cells = claims.main_cells(study, best)
  results = {c: r for c in cells if (r := load_run(study, runs_dir, c)) is not None}
  by = {}  # (loss, lag) -> [RunResult over seeds]
  for c in cells:
    by.setdefault((c.loss, c.lag), [])
    if c in results:
      by[(c.loss, c.lag)].append(results[c])
  start = _read_start(runs_dir)
  target = _target(by, start)
  lines = [f"# Claims in miniature: {study.task}{' (smoke)' if study.smoke else ''}", "",
           *_setup_lines(study, runs_dir, results, start, target), ""]
  lines += ["## Tuning (validation pass@1, final; the chosen point is then run at every lag and seed)", "",
            *_tuning_table(study, runs_dir, best), ""]
  ks = [k for k in (1, 5, 10, 64) if k in study.ks]
  lines += [f"## Final test pass@k (mean ± sd over seeds, {study.final_samples} samples per prompt)", "",
            "| loss | lag | " + " | ".join(f"pass@{k}" for k in ks) + " |", "|---|---|" + "---|" * len(ks)]
  for (loss, lag), runs in by.items():
    lines.append(f"| {loss} | {lag} | " + " | ".join(fmt([r.final["test"][f"pass@{k}"] for r in runs]) for k in ks)
                 + " |")
  lines += ["", f"## Training: generations to validation pass@1 >= {target:.3f}, entropy, log-ratio, collapses", "",
            "| loss | lag | generations to target | final train entropy (per token) | test NLL per token (eval "
            "sampling) | mean abs seq log-ratio | collapses |", "|---|---|---|---|---|---|---|"]
  for (loss, lag), runs in by.items():
    lines.append(f"| {loss} | {lag} | {fmt([r.generations_to(target) for r in runs], 0)} | "
                 f"{fmt([r.final_entropy() for r in runs])} | "
                 f"{fmt([r.test_nll_per_token() for r in runs])} | {fmt([r.mean_log_ratio() for r in runs])} | "
                 f"{sum(r.collapsed for r in runs)}/{len(runs)} |")
  lines += ["", "## The paper's five claims at this scale", "", *claim_lines(study, by, target), ""]
  lines += ["## Plots", "", *(f"![{name}]({name})" for name in _plot(study, by, start, out_dir)), ""]
  path = os.path.join(out_dir, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def _read_start(runs_dir: str) -> dict:
  path = os.path.join(runs_dir, "warmstart", "eval.json")
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _target(by: dict, start: dict) -> float:
  """Halfway from the warm start's validation pass@1 to the best cell's mean final in-loop pass@1."""
  first = [r.curve[0][1] for runs in by.values() for r in runs if r.curve]
  finals = [np.mean([r.curve[-1][1] for r in runs]) for runs in by.values() if runs and all(r.curve for r in runs)]
  if not first or not finals:
    return float("nan")
  begin = float(np.mean(first))
  return begin + 0.5 * (max(max(finals), begin) - begin)


def _setup_lines(study, runs_dir, results, start, target) -> list[str]:
  any_run = next(iter(results.values()), None)
  lines = [f"Command: `python -m experiments.study --task {study.task} --out <dir>"
           f"{' --smoke' if study.smoke else ''}`; runs in `{runs_dir}`; config `{os.path.relpath(study.config_spec)}`.", "",
           f"Losses {', '.join(study.losses)}; lags {', '.join(map(str, study.lags))} (grpo_onpolicy: 1); "
           f"seeds {', '.join(map(str, study.seeds))}; {len(results)} runs finished."]
  if any_run is not None:
    lines.append(f"Equal generation budget: every run sampled {any_run.final['generations']} responses "
                 f"({any_run.final['trainer_steps']} trainer steps x {any_run.generations_per_step:g} per step).")
  lines.append("The longest lag equals the run's length: those runs train on the warm start's snapshot only. "
               "The warm start is one checkpoint, so the sd over seeds is the RL seed's alone. grpo at lag 1 "
               "is on-policy GRPO (sync_every=1, steps_per_rollout=1): its rows must equal grpo_onpolicy's.")
  n_points = len(next(iter(study.tuning.values())))
  lines.append(f"Equal tuning budget: {n_points} point(s) per loss at lag {study.tune_lag} (grpo_onpolicy: 1), "
               f"seed {study.tune_seed}, chosen on validation; every table below is the test split.")
  if start:
    lines.append(f"Warm start (one checkpoint for every run): test pass@1 {start['test']['pass@1']:.3f}, "
                 f"pass@{study.ks[-1]} {start['test'][f'pass@{study.ks[-1]}']:.3f}; "
                 f"validation pass@1 {start['val']['pass@1']:.3f}.")
  eval_every = min((r.curve[1][0] - r.curve[0][0] for r in results.values() if len(r.curve) > 1), default=0)
  lines.append(f"Target pass@1 for 'generations to target': {target:.3f} (halfway from the start to the best "
               f"cell's final in-loop validation pass@1; in-loop evals every {eval_every} steps where the lag allows: "
               f"the loop evaluates at window starts only).")
  return lines


def _tuning_table(study, runs_dir, best) -> list[str]:
  lines = ["| loss | point | lag | val pass@1 | chosen |", "|---|---|---|---|---|"]
  for cell in claims.tuning_cells(study):
    workdir = os.path.join(runs_dir, claims.run_dir_name(study, cell))
    value = f"{claims.read_final(workdir)['val']['pass@1']:.3f}" if claims.is_done(workdir) else "missing"
    point = ", ".join(f"{k.rpartition('.')[2]}={v}" for k, v in study.tuning[cell.loss][cell.point].items())
    lines.append(f"| {cell.loss} | {point} | {cell.lag} | {value} | {'yes' if best[cell.loss] == cell.point else ''} |")
  return lines


def _pairs(by, loss_a, loss_b, metric):
  """Per lag where both have seeds: (lag, metric values of a, of b)."""
  lags = sorted({lag for (loss, lag) in by if loss == loss_a})
  return [(lag, [metric(r) for r in by[(loss_a, lag)]], [metric(r) for r in by[(loss_b, lag)]])
          for lag in lags if by.get((loss_a, lag)) and by.get((loss_b, lag))]


def _per_lag(pairs, digits=3) -> str:
  return "; ".join(f"L={lag}: {np.mean(a):.{digits}g} vs {np.mean(b):.{digits}g} ({compare(a, b)})"
                   for lag, a, b in pairs)


def claim_lines(study, by, target) -> list[str]:
  """One line per claim: verdict and the numbers it rests on (OAPL against GRPO with IS, same lag)."""
  if "oapl" not in study.losses or "grpo" not in study.losses:
    return ["(the claims compare oapl with grpo; this study lacks one of them)"]
  test = lambda key: (lambda r: r.final["test"][key])  # noqa: E731
  lines = []
  p1 = _pairs(by, "oapl", "grpo", test("pass@1"))
  lines.append(f"1. OAPL beats GRPO+IS on pass@1 at the same lag: **{_verdict([compare(a, b) for _, a, b in p1])}** "
               f"(test pass@1, oapl vs grpo: {_per_lag(p1)}).")
  ent = _pairs(by, "oapl", "grpo", RunResult.final_entropy)
  lines.append(f"2. OAPL keeps entropy higher: **{_verdict([compare(a, b) for _, a, b in ent])}** "
               f"(final trainer entropy per token, oapl vs grpo: {_per_lag(ent)}).")
  lines.append(_stability_line(study, by))
  kmax = study.ks[-1]
  pk = _pairs(by, "oapl", "grpo", test(f"pass@{kmax}"))
  lines.append(f"4. OAPL scales better under pass@k (k up to {kmax}; the paper's 256 is beyond this eval): "
               f"**{_verdict([compare(a, b) for _, a, b in pk])}** (test pass@{kmax}, oapl vs grpo: {_per_lag(pk)}).")
  gens = _pairs(by, "oapl", "grpo", lambda r: r.generations_to(target))
  ratios = [(lag, generation_ratio(np.median(a), np.median(b))) for lag, a, b in gens]  # median: a 'never' counts
  outcomes = ["one seed" if min(len(a), len(b)) < 2 else "better" if r >= 2 else "worse" if r <= 1 else "tie"
              for (_, r), (_, a, b) in zip(ratios, gens)]
  lines.append(f"5. OAPL needs ~3x fewer generations: **{_verdict(outcomes)}** (generations to val pass@1 >= "
               f"{target:.3f}, median over seeds, grpo / oapl: " + "; ".join(f"L={lag}: {r:.2g}x" for lag, r in ratios)
               + "; 'supported' needs >= 2x at most lags, and the eval spacing bounds the resolution).")
  return lines


def generation_ratio(oapl: float, grpo: float) -> float:
  """grpo's generations to target over oapl's (inf: only oapl reached it; 0: only grpo; 1: equal, or
  neither reached it)."""
  if oapl == grpo or not (np.isfinite(oapl) or np.isfinite(grpo)):
    return 1.0
  if not np.isfinite(oapl):
    return 0.0
  return float("inf") if oapl == 0 or not np.isfinite(grpo) else grpo / oapl


def _stability_line(study, by) -> str:
  """Claim 3: from the shortest to the longest lag, OAPL holds pass@1 (no collapse) while a baseline drops."""
  lo, hi = min(study.lags), max(study.lags)
  p1 = lambda loss, lag: [r.final["test"]["pass@1"] for r in by.get((loss, lag), [])]  # noqa: E731
  parts, degraded, one_seed = [], {}, False
  for loss in (l for l in study.losses if l != "grpo_onpolicy"):
    a, b = p1(loss, hi), p1(loss, lo)
    if not a or not b:
      continue
    one_seed |= min(len(a), len(b)) < 2
    collapses = sum(r.collapsed for r in by[(loss, hi)])
    degraded[loss] = compare(a, b) == "worse" or collapses > 0
    parts.append(f"{loss} L={lo}->{hi}: {np.mean(b):.3f}->{np.mean(a):.3f}, {collapses} collapse(s)")
  if "oapl" not in degraded or one_seed:
    verdict = "inconclusive"
  elif degraded["oapl"]:
    verdict = "not supported"
  else:
    verdict = "supported" if any(v for k, v in degraded.items() if k != "oapl") else "inconclusive"
  return (f"3. OAPL stays stable at long lags where baselines degrade: **{verdict}** ({'; '.join(parts)}; "
          f"'degrade' = test pass@1 below the short lag's by more than the seed sd, or a collapse; with no "
          f"baseline degrading the contrast is absent and the verdict inconclusive).")


# ------------------------------------------------------------------------------ plots
def _plot(study, by, start, out_dir) -> list[str]:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  lags = list(study.lags)
  colors = {loss: f"C{i}" for i, loss in enumerate(study.losses)}
  names = []

  def panels(title):
    fig, axes = plt.subplots(1, len(lags), figsize=(4.2 * len(lags), 3.6), squeeze=False, sharey=True)
    fig.suptitle(title)
    return fig, axes[0]

  def save(fig, name):
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=90)
    plt.close(fig)
    names.append(name)

  def band(ax, runs, series_of, x_scale, label, color):
    series = [series_of(r) for r in runs if series_of(r)]
    if not series:
      return
    n = min(len(s) for s in series)
    x = np.asarray([p[0] for p in series[0][:n]]) * x_scale
    y = np.asarray([[p[1] for p in s[:n]] for s in series])
    ax.plot(x, y.mean(0), color=color, label=label, marker="o" if n < 12 else None, ms=3)
    ax.fill_between(x, y.min(0), y.max(0), color=color, alpha=0.15)

  fig, axes = panels("validation pass@1 (in-loop, eval sampling) vs sampled responses; band: min-max over seeds")
  for ax, lag in zip(axes, lags):
    for loss in study.losses:
      runs = by.get((loss, lag)) or (by.get((loss, 1)) if loss == "grpo_onpolicy" else None) or []
      band(ax, runs, lambda r: r.curve, runs[0].generations_per_step if runs else 1,
           loss + (" (L=1)" if loss == "grpo_onpolicy" else ""), colors[loss])
    ax.set(title=f"lag L={lag}", xlabel="sampled responses", ylabel="pass@1")
    ax.legend(fontsize=7)
  save(fig, "pass1_vs_generations.png")

  fig, axes = panels("test pass@k vs k (final policy); dashed: the warm start")
  for ax, lag in zip(axes, lags):
    for loss in study.losses:
      runs = by.get((loss, lag)) or (by.get((loss, 1)) if loss == "grpo_onpolicy" else None) or []
      band(ax, runs, lambda r: [(k, r.final["test"][f"pass@{k}"]) for k in study.ks], 1, loss, colors[loss])
    if start:
      ax.plot(study.ks, [start["test"][f"pass@{k}"] for k in study.ks], "k--", label="warm start")
    ax.set(title=f"lag L={lag}", xlabel="k", ylabel="pass@k", xscale="log")
    ax.legend(fontsize=7)
  save(fig, "passk_vs_k.png")

  for key, title, name in (("entropy", "trainer per-token entropy of the sampled responses", "entropy.png"),
                           ("log_ratio", "mean |log pi - log pi_sampler| per sequence", "log_ratio.png")):
    fig, axes = panels(f"{title} over training (mean over seeds)")
    for ax, lag in zip(axes, lags):
      for loss in study.losses:
        runs = by.get((loss, lag)) or (by.get((loss, 1)) if loss == "grpo_onpolicy" else None) or []
        band(ax, runs, lambda r: getattr(r, key), 1, loss, colors[loss])
      ax.set(title=f"lag L={lag}", xlabel="trainer step")
      ax.legend(fontsize=7)
    save(fig, name)
  return names
