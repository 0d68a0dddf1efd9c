"""The tuning's outcome on disk: `tuning.json` beside report.md, written whenever a loss's grid has finished, and
read back by `experiments.study --tuned FILE` so the main seeds can run without the tuning runs (lost with a
machine, or run on another one). The record is checked on reading: same study, every point scored, and the
recorded choice is the rule's winner (tuning.choose) of the recorded scores.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

from experiments import plan, results, tuning

FILE = "tuning.json"


@dataclasses.dataclass(frozen=True)
class Recorded:
  """One loss's finished tuning."""
  scores: dict  # (lr, knob) -> mean validation AUC over the tuning seeds
  chosen: tuple  # (lr, knob): the rule's winner
  extended: list  # the points added past an edge winner, in order
  finals: dict  # (lr, knob) -> final validation pass@1 of the first tuning seed (nan if unknown)
  curves: dict  # (lr, knob) -> [(step, val pass@1)] of the first tuning seed (absent where not recorded)


@dataclasses.dataclass(frozen=True)
class Record:
  """A study's finished tuning grids, as tuning.json holds them."""
  study: str  # the study's name (its task, reshaping and losses)
  tune_seeds: tuple[int, ...]
  source: str  # where its numbers come from
  losses: dict  # loss -> Recorded
  path: str = ""  # where it was read from, as given ('' for one being written)


class RecordError(ValueError):
  """A tuning record that cannot stand for the tuning: the path and the reason."""


def write(path: str, record: Record) -> None:
  body = {"study": record.study, "tune_seeds": list(record.tune_seeds), "source": record.source, "losses": {
      loss: {"chosen": list(r.chosen), "extended": [list(p) for p in r.extended],
             "points": [{"lr": s[0], "knob": s[1], "auc": r.scores[s], "final": r.finals.get(s, float("nan")),
                         **({"curve": [list(sv) for sv in r.curves[s]]} if s in r.curves else {})}
                        for s in sorted(r.scores)]}
      for loss, r in record.losses.items()}}
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(body, f, indent=1)
  os.replace(tmp, path)


def read(path: str, study_name: Optional[str] = None, tune_seeds=None) -> Record:
  """The record at `path` (a user's path: relative or with ~). Raises RecordError naming it on anything off."""
  given, path = path, os.path.abspath(os.path.expanduser(path))
  try:
    with open(path) as f:
      body = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise RecordError(f"{path}: cannot read a tuning record ({e})") from e
  if study_name is not None and body.get("study") != study_name:
    raise RecordError(f"{path}: recorded for study {body.get('study')!r}, not this study ({study_name!r}); the "
                      "task, its --set reshaping and the losses must be the same")
  if tune_seeds is not None and list(tune_seeds) != body.get("tune_seeds"):
    raise RecordError(f"{path}: tuned on seeds {body.get('tune_seeds')}, this study's --tune_seeds are "
                      f"{list(tune_seeds)}")
  losses = {}
  for loss, entry in body.get("losses", {}).items():
    points = entry.get("points", [])
    scores = {(float(p["lr"]), float(p["knob"])): p.get("auc") for p in points}
    if not points or any(v is None for v in scores.values()):
      raise RecordError(f"{path}: {loss}'s grid is not finished in the record (a point has no AUC)")
    chosen = tuple(float(x) for x in entry["chosen"])
    if tuning.choose(scores) != chosen:
      raise RecordError(f"{path}: {loss}'s recorded choice {chosen} is not the rule's winner of its recorded scores "
                        f"({tuning.choose(scores)})")
    losses[loss] = Recorded(
        scores=scores, chosen=chosen, extended=[tuple(p) for p in entry.get("extended", [])],
        finals={(float(p["lr"]), float(p["knob"])): float(p.get("final", float("nan"))) for p in points},
        curves={(float(p["lr"]), float(p["knob"])): [tuple(sv) for sv in p["curve"]] for p in points if "curve" in p})
  if not losses:
    raise RecordError(f"{path}: the record has no loss")
  return Record(body["study"], tuple(body.get("tune_seeds", ())), body.get("source", ""), losses, given)


def point(study: plan.Study, runs_dir: str, recorded: dict, loss: str, setting) -> tuple[list, float]:
  """A tuning point's validation curve on the first tuning seed ([] if none) and its final value (nan if unknown):
  a recorded loss's from its record (a run of the same cell here, such as the pilot's, is another run), any other
  loss's from its run."""
  if loss in recorded:
    curve = list(recorded[loss].curves.get(setting, []))
    return curve, curve[-1][1] if curve else recorded[loss].finals.get(setting, float("nan"))
  r = results.load(runs_dir, plan.tuning_cells(study, loss, [setting])[0])
  curve = list(r.curve()) if r is not None else []
  return curve, curve[-1][1] if curve else float("nan")
