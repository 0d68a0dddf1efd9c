"""Every task's tuned points in one table (issue 51): per task and loss, the grid that ran, the rule's winner, its
margin over the runner-up, whether it sits at an edge of its grid and whether the rule would extend it further, and
(OAPL) the winner's beta2 as a strength: beta2 times the typical |log-ratio| over the advantage's spread, scaled from
the pilot's measured share. Beside it, one heat map per task and loss of the validation AUC over the grid.

  python -m experiments.tuned_points reports/claims_v4/tuned_points.json --out reports/claims_v4/tuned_points

The spec: {"title": TEXT, "tasks": [{"task": NAME, "tuning": PATH TO tuning.json (relative to the spec's folder,
or absolute, ~ allowed), "pilot": {"share": S, "beta2": B} (OAPL's share measured in the pilot at beta2 B; optional),
"note": TEXT (optional)}, ...]}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from experiments import tuning, tuning_record

KNOB = {"oapl": "beta2", "grpo": "clip"}


def _axis_place(values: Sequence[float], winner: float) -> str:
  side = tuning.edge(sorted(values), winner)
  return f"{side} edge" if side else "inside"


def rows(task: dict, record: tuning_record.Record) -> list[dict]:
  out = []
  for loss, r in record.losses.items():
    lrs, knobs = sorted({lr for lr, _ in r.scores}), sorted({k for _, k in r.scores})
    ranked = sorted(r.scores, key=lambda s: (-r.scores[s], s))
    winner, runner_up = ranked[0], ranked[1] if len(ranked) > 1 else None
    pilot = task.get("pilot")
    strength = (winner[1] * pilot["share"] / pilot["beta2"]) if loss == "oapl" and pilot else None
    further = tuning.extension(r.scores, decade_knob=loss == "oapl")
    out.append({"task": task["task"], "loss": loss, "lrs": lrs, "knobs": knobs, "points": len(r.scores),
                "extended": len(r.extended), "winner": winner, "auc": r.scores[winner], "strength": strength,
                "runner_up": runner_up, "runner_up_auc": r.scores[runner_up] if runner_up else None,
                "lr_place": _axis_place(lrs, winner[0]), "knob_place": _axis_place(knobs, winner[1]),
                "further": further, "scores": r.scores})
  return out


def _fmt(values: Sequence[float]) -> str:
  return "{" + ", ".join(f"{v:g}" for v in values) + "}"


def table(all_rows: list[dict]) -> list[str]:
  lines = ["| task | loss | lr grid | knob grid | points (extended) | winner: lr, knob | strength | AUC | runner-up "
           "(AUC) | winner's place: lr / knob | the rule |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in all_rows:
    knob = KNOB.get(r["loss"], "knob")
    ru = r["runner_up"]
    runner_up = "" if ru is None else f"{ru[0]:g}, {ru[1]:g} ({r['runner_up_auc']:.3f})"
    rule = "settled" if not r["further"] else f"would add {len(r['further'])} points"
    lines.append(
        f"| {r['task']} | {r['loss']} | {_fmt(r['lrs'])} | {knob} {_fmt(r['knobs'])} | {r['points']} "
        f"({r['extended']}) | **{r['winner'][0]:g}, {r['winner'][1]:g}** | "
        f"{'' if r['strength'] is None else format(r['strength'], '.2g')} | {r['auc']:.3f} | "
        f"{runner_up} | "
        f"{r['lr_place']} / {r['knob_place']} | {rule} |")
  return lines


def heatmaps(all_rows: list[dict], path: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  tasks = list(dict.fromkeys(r["task"] for r in all_rows))
  losses = list(dict.fromkeys(r["loss"] for r in all_rows))
  fig, axes = plt.subplots(len(tasks), len(losses), figsize=(4.2 * len(losses), 2.6 * len(tasks)), squeeze=False)
  for r in all_rows:
    ax = axes[tasks.index(r["task"])][losses.index(r["loss"])]
    grid = np.full((len(r["knobs"]), len(r["lrs"])), np.nan)
    for (lr, knob), auc in r["scores"].items():
      grid[r["knobs"].index(knob), r["lrs"].index(lr)] = auc
    image = ax.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
    for (i, j), auc in np.ndenumerate(grid):
      if not np.isnan(auc):
        ax.text(j, i, f"{auc:.2f}", ha="center", va="center", fontsize=7, color="w" if auc < np.nanmax(grid) - 0.15
                else "k")
    wi, wj = r["knobs"].index(r["winner"][1]), r["lrs"].index(r["winner"][0])
    ax.add_patch(plt.Rectangle((wj - 0.5, wi - 0.5), 1, 1, fill=False, ec="r", lw=2))
    ax.set_xticks(range(len(r["lrs"])), [f"{v:g}" for v in r["lrs"]], fontsize=7)
    ax.set_yticks(range(len(r["knobs"])), [f"{v:g}" for v in r["knobs"]], fontsize=7)
    ax.set_xlabel("lr", fontsize=8)
    ax.set_ylabel(KNOB.get(r["loss"], "knob"), fontsize=8)
    ax.set_title(f"{r['task']}: {r['loss']}", fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.046)
  fig.suptitle("validation AUC over each loss's tuning grid (mean over the tuning seeds); red: the rule's winner",
               fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def report(spec: dict, spec_dir: str, out: str) -> str:
  all_rows, sources = [], []
  for task in spec["tasks"]:
    path = os.path.join(spec_dir, os.path.expanduser(task["tuning"]))
    record = tuning_record.read(path)
    all_rows += rows(task, record)
    sources.append(f"- {task['task']}: `{task['tuning']}` (study {record.study}, seeds "
                   f"{', '.join(map(str, record.tune_seeds))}; {record.source})" +
                   (f". {task['note']}" if task.get("note") else ""))
  os.makedirs(out, exist_ok=True)
  heatmaps(all_rows, os.path.join(out, "tuned_points.png"))
  lines = [f"# {spec['title']}", "", __doc__.split("\n\n")[0].replace("\n", " "), "", *table(all_rows), "",
           "'settled': the winner is inside its grid on both axes, or at an edge whose inner neighbour scored as "
           "high (the axis does not matter there), so the rule adds nothing. Strength: the winner's beta2 times the "
           "pilot's measured share per unit beta2 (the grid's targets were 0.03, 0.3, 3).", "", "Sources:", "",
           *sources, "", "![tuned points](tuned_points.png)", ""]
  path = os.path.join(out, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m experiments.tuned_points", description=__doc__.split("\n")[0])
  parser.add_argument("spec", help="the JSON naming each task's tuning.json")
  parser.add_argument("--out", required=True, help="the folder for report.md and tuned_points.png")
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  spec_path = os.path.abspath(os.path.expanduser(args.spec))
  try:
    with open(spec_path) as f:
      spec = json.load(f)
    path = report(spec, os.path.dirname(spec_path), os.path.abspath(os.path.expanduser(args.out)))
  except (OSError, json.JSONDecodeError, KeyError, tuning_record.RecordError) as e:
    print(f"error: {args.spec}: {e!r}" if isinstance(e, KeyError) else f"error: {e}", file=sys.stderr)
    return 2
  print(open(path).read())
  return 0


if __name__ == "__main__":
  sys.exit(main())
