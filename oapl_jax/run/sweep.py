"""A config's `get_hyper` sweep as a library: the planned runs, their commands, running them locally, the results
table and the curves. The command line is apps/sweep.py (its docstring is the user's manual); experiments/ read
runs with `read_history`.
"""
from __future__ import annotations

import copy
import csv
import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Any, Sequence

from oapl_jax.run import files, shared_warmstart

RUN_RECORD = "sweep_run.json"  # per run directory: status, return code, wall seconds summed over starts


class Hyper:
  """The big_vision-style helper handed to `get_hyper`: each method returns a list of override dicts."""

  @staticmethod
  def sweep(key: str, values: Sequence[Any]) -> list[dict]:
    _check_key(key)
    if isinstance(values, (str, bytes)) or not len(values):
      raise ValueError(f"h.sweep({key!r}, ...): values must be a non-empty list, got {values!r}")
    return [{key: v} for v in values]

  @staticmethod
  def fixed(key: str, value: Any) -> list[dict]:
    _check_key(key)
    return [{key: value}]

  @staticmethod
  def product(parts: Sequence[list[dict]]) -> list[dict]:
    return [_merge(combo, "h.product") for combo in itertools.product(*parts)]

  @staticmethod
  def zip(parts: Sequence[list[dict]]) -> list[dict]:
    lengths = [len(p) for p in parts]
    if len(set(lengths)) > 1:
      raise ValueError(f"h.zip: the lists have different lengths {lengths}")
    return [_merge(combo, "h.zip") for combo in zip(*parts)]


def _check_key(key: str) -> None:
  if not isinstance(key, str) or not key.startswith("config.") or len(key) == len("config."):
    raise ValueError(f"sweep key {key!r} must name a config field, like 'config.loop.sync_every'")


def _merge(dicts, where: str) -> dict:
  out = {}
  for d in dicts:
    if clash := set(out) & set(d):
      raise ValueError(f"{where}: key {sorted(clash)[0]!r} is set twice in one point")
    out.update(d)
  return out


# ------------------------------------------------------------------------------ the runs of a sweep
@dataclasses.dataclass(frozen=True)
class PlannedRun:
  name: str
  workdir: str
  overrides: dict  # "config.a.b" -> value
  warmstart: str = ""  # the shared warm start it loads ('' = its own)

  def flags(self) -> list[str]:
    loads = {"config.model.checkpoint": self.warmstart, "config.warmstart.steps": 0} if self.warmstart else {}
    return [f"--{key}={flag_value(value)}" for key, value in {**self.overrides, **loads}.items()]


def _check_fields(config, overrides: dict, config_spec: str) -> None:
  """Each key names a leaf of the config, and its value fits that field's type (ml_collections' check)."""
  config = copy.deepcopy(config)
  for key, value in overrides.items():
    try:
      files.override(config, key, value)
    except ValueError as e:
      raise ValueError(f"get_hyper of {config_spec}: {e}") from None


def plan(config_spec: str, workdir: str, extra: Sequence[str] = (), share_warmstart: bool = True) -> list[PlannedRun]:
  """Expands the config file's get_hyper into runs (fields checked against get_config(arg)); with
  share_warmstart, every run loads WORKDIR/warmstart where `unshared_reason` finds nothing against it."""
  module, arg = files.load_module(config_spec)
  if not hasattr(module, "get_hyper"):
    raise ValueError(f"{config_spec}: the config file defines no get_hyper(h); nothing to sweep")
  points = module.get_hyper(Hyper())
  if not isinstance(points, list) or not points or not all(isinstance(p, dict) for p in points):
    raise ValueError(f"{config_spec}: get_hyper must return a non-empty list of override dicts, got {points!r}")
  config = module.get_config(arg) if arg else module.get_config()
  for point in points:
    _check_fields(config, point, config_spec)
  shared = share_warmstart and not shared_warmstart.unshared_reason(files.load(config_spec, list(extra)), points)
  warm_dir = os.path.abspath(shared_warmstart.directory(workdir)) if shared else ""
  return [PlannedRun(name, os.path.join(workdir, name), point, warm_dir)
          for name, point in zip(run_names(points), points)]


def main_command(config_spec: str, run: PlannedRun, extra: Sequence[str]) -> list[str]:
  return [sys.executable, "-m", "oapl_jax.main", f"--config={config_spec}", f"--workdir={run.workdir}",
          *run.flags(), *extra]


def launcher_command(launcher: str, launcher_args: Sequence[str], config_spec: str, run: PlannedRun,
                     index: int, extra: Sequence[str]) -> list[str]:
  """launch/*.sh share `--config C --workdir W [their flags] -- OVERRIDES`; {run} and {index} in a
  launcher argument become the run's name and its position (e.g. --workload=oapl-{index})."""
  args = [a.replace("{run}", run.name).replace("{index}", str(index)) for a in launcher_args]
  return [launcher, *args, "--config", config_spec, "--workdir", run.workdir, "--", *run.flags(), *extra]


def is_finished(workdir: str) -> bool:
  """summary.json says the run completed every sync window."""
  summary = read_summary(workdir)
  if summary is None:
    return False
  if "finished" in summary:
    return bool(summary["finished"])
  return any(k.endswith("(end)") for k in summary)  # written only by a run that finished


def read_record(workdir: str) -> dict:
  path = os.path.join(workdir, RUN_RECORD)
  if not os.path.exists(path):
    return {"wall_seconds": 0.0, "starts": 0}
  with open(path) as f:
    return json.load(f)


def _write_json(path: str, record: dict) -> None:
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=2)
  os.replace(path + ".tmp", path)


def run_locally(config_spec: str, runs: Sequence[PlannedRun], parallel: int, extra: Sequence[str]) -> dict:
  """Starts every unfinished run (N at a time), logs to <run>/sweep.log; returns name -> 'skipped' |
  'finished' | 'failed (rc N)' | 'unfinished (rc 0)'."""
  todo, outcome = [], {}
  for run in runs:
    if is_finished(run.workdir):
      outcome[run.name] = "skipped"
      print(f"[sweep] {run.name}: finished before, skipped", flush=True)
    else:
      todo.append(run)
  active: list[tuple[PlannedRun, subprocess.Popen, float, Any]] = []
  while todo or active:
    while todo and len(active) < parallel:
      run = todo.pop(0)
      os.makedirs(run.workdir, exist_ok=True)
      command = main_command(config_spec, run, extra)
      log = open(os.path.join(run.workdir, "sweep.log"), "a")
      log.write(f"$ {shlex.join(command)}\n")
      log.flush()
      print(f"[sweep] {run.name}: started ({shlex.join(command[1:])}); log {log.name}", flush=True)
      active.append((run, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), time.time(), log))
    time.sleep(0.2)
    for item in [a for a in active if a[1].poll() is not None]:
      active.remove(item)
      run, process, start, log = item
      log.close()
      record = read_record(run.workdir)
      finished = process.returncode == 0 and is_finished(run.workdir)
      status = "finished" if finished else f"{'failed' if process.returncode else 'unfinished'} (rc {process.returncode})"
      record.update(status=status, returncode=process.returncode, starts=record["starts"] + 1,
                    wall_seconds=record["wall_seconds"] + time.time() - start)
      _write_json(os.path.join(run.workdir, RUN_RECORD), record)
      outcome[run.name] = status
      print(f"[sweep] {run.name}: {status} after {time.time() - start:.0f}s", flush=True)
  return outcome


# ------------------------------------------------------------------------------ names and flag values
def _short_keys(keys: Sequence[str]) -> dict[str, str]:
  """'config.trainer.x.beta2' -> 'beta2'; keys whose last parts clash keep more parts until they differ."""
  parts = {k: k.split(".")[1:] for k in keys}
  depth = dict.fromkeys(keys, 1)
  while True:
    short = {k: ".".join(parts[k][-depth[k]:]) for k in keys}
    clashing = [k for k in keys if list(short.values()).count(short[k]) > 1]
    if not clashing:
      return short
    for k in clashing:
      depth[k] += 1


def _value_text(value: Any) -> str:
  if isinstance(value, (list, tuple)):
    return "x".join(_value_text(v) for v in value)
  return repr(value) if isinstance(value, float) else str(value)


def run_names(points: Sequence[dict], max_len: int = 100) -> list[str]:
  """Filesystem-safe, deterministic directory names: 'beta2=0.25,sync_every=5'. Over `max_len`
  characters, or equal after cleaning, a name ends in a hash of its overrides instead."""
  short = _short_keys(list(dict.fromkeys(k for p in points for k in p)))
  digest = lambda p: hashlib.sha1(json.dumps(p, sort_keys=True, default=repr).encode()).hexdigest()[:8]  # noqa: E731
  names = []
  for point in points:
    name = ",".join(f"{short[k]}={_value_text(v)}" for k, v in point.items()) or "base"
    name = re.sub(r"[^A-Za-z0-9._+=,-]", "_", name)
    names.append(name if len(name) <= max_len else f"{name[:max_len - 9]}-{digest(point)}")
  repeated = {n for n in names if names.count(n) > 1}
  names = [f"{n[:max_len - 9]}-{digest(p)}" if n in repeated else n for n, p in zip(names, points)]
  if len(set(names)) < len(names):
    raise ValueError(f"get_hyper returned the same point twice: {[n for n in names if names.count(n) > 1][0]}")
  return names


def flag_value(value: Any) -> str:
  """A value as ml_collections parses it after --config.FIELD= (tuples as '(1, 2)')."""
  if isinstance(value, dict) or value is None:
    raise ValueError(f"sweep value {value!r}: sweep a leaf field (numbers, strings, bools, tuples), not a dict/None")
  if isinstance(value, list):
    value = tuple(value)
  return repr(value) if isinstance(value, (float, tuple)) else str(value)


# ------------------------------------------------------------------------------ results
def read_summary(workdir: str) -> dict | None:
  path = os.path.join(workdir, "summary.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def read_history(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _pass_keys(history: list[dict], prefix: str = "eval/") -> list[str]:
  return sorted({k for h in history for k in h if k.startswith(prefix) and "/pass@" in k})


def result_row(run: PlannedRun, short: dict, record: dict) -> dict:
  """The swept values, status, every eval pass@k at the start (step 0) and the end, their delta and the best
  of any eval of it (the snapshot's or the policy's, policy_eval/), trainer steps and wall time."""
  summary, history = read_summary(run.workdir) or {}, read_history(run.workdir)
  row = {"run": run.name, **{short[k]: v for k, v in run.overrides.items()},
         "status": "finished" if is_finished(run.workdir) else record.get("status", "not started")}
  for key in _pass_keys(history):
    values = [h[key] for h in history if key in h]
    name = key[len("eval/"):]
    start, final = summary.get(f"{key} (start)", values[0]), summary.get(f"{key} (end)", values[-1])
    policy = [h[f"policy_eval/{name}"] for h in history if f"policy_eval/{name}" in h]
    row.update({f"{name} start": start, f"{name} final": final, f"{name} delta": final - start,
                f"{name} best": max(values + policy)})
  row["trainer_steps"] = summary.get("trainer_steps", max((h["step"] for h in history), default=0))
  row["wall_seconds"] = round(record["wall_seconds"], 1) if record.get("starts") else float("nan")
  return row


def _cell(value) -> str:
  if isinstance(value, float):
    return "" if math.isnan(value) else f"{value:.4g}"
  return str(value)


def write_report(workdir: str, runs: Sequence[PlannedRun], records: dict, notes: Sequence[str] = ()) -> dict[str, str]:
  """results.csv, results.md (with `notes` under its title) and curves.png (pass@1 per eval set against trainer
  step, one line per run)."""
  os.makedirs(workdir, exist_ok=True)
  short = _short_keys(list(dict.fromkeys(k for r in runs for k in r.overrides)))
  rows = [result_row(r, short, records.get(r.name, {})) for r in runs]
  columns = list(dict.fromkeys(c for row in rows for c in row))
  paths = {"csv": os.path.join(workdir, "results.csv"), "markdown": os.path.join(workdir, "results.md"),
           "curves": os.path.join(workdir, "curves.png")}
  with open(paths["csv"], "w", newline="") as f:
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    writer.writerows(rows)
  with open(paths["markdown"], "w") as f:
    f.write(f"# Sweep results ({len(rows)} runs)\n\n" + "".join(f"{n}\n\n" for n in notes))
    f.write("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n")
    for row in rows:
      f.write("| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |\n")
  _plot_curves(paths["curves"], runs)
  return paths


def _plot_curves(path: str, runs: Sequence[PlannedRun]) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  histories = {r.name: read_history(r.workdir) for r in runs}
  everything = [h for hist in histories.values() for h in hist]
  prefix = "policy_eval/" if _pass_keys(everything, "policy_eval/") else "eval/"  # its step grid ignores the lag
  by_set = {}  # eval set -> its smallest-k pass key
  for key in _pass_keys(everything, prefix):
    name = key[len(prefix):].rpartition("/pass@")[0]
    by_set[name] = min(by_set.get(name, key), key, key=lambda s: int(s.rpartition("@")[2]))
  sets = sorted(by_set) or ["(no eval yet)"]
  fig, axes = plt.subplots(1, len(sets), figsize=(7 * len(sets), 4.5), squeeze=False)
  # runs that differ only by their seed share a colour; the seed picks the line style
  settings = [json.dumps({k: v for k, v in r.overrides.items() if k != "config.seed"}, default=repr) for r in runs]
  seeds = [r.overrides.get("config.seed") for r in runs]
  for ax, name in zip(axes[0], sets):
    for run, setting, seed in zip(runs, settings, seeds):
      rows = [(h["step"], h[by_set[name]]) for h in histories[run.name] if name in by_set and by_set[name] in h]
      if rows:
        ax.plot(*zip(*rows), marker="o", label=run.name, color=f"C{list(dict.fromkeys(settings)).index(setting) % 10}",
                linestyle=("-", "--", ":", "-.")[list(dict.fromkeys(seeds)).index(seed) % 4])
    metric = by_set.get(name, "pass@1").rpartition("/")[2]
    of = "the policy" if prefix == "policy_eval/" else "the sampler's snapshot"
    ax.set(title=f"{name}: {metric} of {of} (eval sampling)", xlabel="trainer step", ylabel=metric, ylim=(-0.02, 1.02))
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
