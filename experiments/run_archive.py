"""A study's finished runs without their checkpoints, in one file beside its report (`study --archive`): each run's
config, metrics, summary and final eval, which is all a report is collected from, and the warm start (its eval, and
its weights up to WARM_START_MAX_BYTES: a tiny model's are a few MB). Run directories live on one machine; the
archive goes with the report, so the study can be collected again elsewhere (`tar -xzf OUT/runs.tar.gz -C R`, then
the same command with `--runs R --collect`), or resumed from the same warm start (the same command with `--runs R`:
the finished runs are not run again, the others run from that warm start).
"""
from __future__ import annotations

import os
import tarfile
from typing import Iterable

from experiments import claims, plan, results

FILE = "runs.tar.gz"
KEPT = ("config.json", results.FINAL_EVAL, "summary.json", "metrics.jsonl")  # a run's files a report reads
WARM_START_MAX_BYTES = 64 << 20  # a larger warm start is left out, but for its eval (the archive then only collects)


def _warm_start_files(warm_dir: str) -> list[str]:
  """The warm start's eval, and every file of it when they come to at most WARM_START_MAX_BYTES."""
  files = sorted(os.path.join(warm_dir, name) for name in os.listdir(warm_dir)) if os.path.isdir(warm_dir) else []
  files = [f for f in files if os.path.isfile(f)]
  if sum(os.path.getsize(f) for f in files) <= WARM_START_MAX_BYTES:
    return files
  return [f for f in files if os.path.basename(f) == "eval.json"]


def write(runs_dir: str, workdirs: Iterable[str], warm_dir: str, out_dir: str) -> tuple[str, int]:
  """OUT/runs.tar.gz with the kept files of every finished run among `workdirs` and the warm start
  (_warm_start_files), paths relative to `runs_dir`; (its path, the number of runs in it). Written whole, then
  moved into place."""
  path, count = os.path.join(out_dir, FILE), 0
  with tarfile.open(path + ".tmp", "w:gz") as tar:
    for workdir in workdirs:
      if not results.is_done(workdir):
        continue
      count += 1
      for name in KEPT:
        if os.path.exists(os.path.join(workdir, name)):
          tar.add(os.path.join(workdir, name), os.path.relpath(os.path.join(workdir, name), runs_dir))
    for name in _warm_start_files(warm_dir):
      tar.add(name, os.path.relpath(name, runs_dir))
  os.replace(path + ".tmp", path)
  return path, count


def finished_runs(root: str) -> list[str]:
  """Every finished run directory under `root` (a study's directory), sorted."""
  return sorted(d for d, _, files in os.walk(root) if results.FINAL_EVAL in files)


def write_study(runs_dir: str, study: plan.Study, out_dir: str) -> str:
  """The archive of every finished run of `study` under `runs_dir`, with its warm start's eval; says what it wrote."""
  path, count = write(runs_dir, finished_runs(os.path.join(runs_dir, study.name)), claims.warm_dir_of(runs_dir, study),
                      out_dir)
  return f"{count} finished runs, without checkpoints: {path} ({os.path.getsize(path) / 1e6:.1f} MB)"
