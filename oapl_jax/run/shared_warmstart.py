"""One warm start for every point of a sweep (or every arm of a study): made once into WORKDIR/warmstart by the
command apps/sweep_warmstart.py (a subprocess: `command`, `ensure`), loaded by each run. apps/sweep_warmstart.py's
docstring says when it is shared and what its record refuses.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from typing import Sequence

from oapl_jax.run import files

DIRECTORY = "warmstart"  # under the sweep's workdir
RECORD = "sweep_warmstart.json"  # in it: the fields it was made from, its wall seconds and command
SECTIONS = ("warmstart", "model", "task")  # what a warm start reads, besides the seed


def directory(workdir: str) -> str:
  return os.path.join(workdir, DIRECTORY)


def unshared_reason(config, points: Sequence[dict]) -> str:
  """Why the points cannot load one warm start made from `config` ('' when they can)."""
  if not config.warmstart.steps:
    return "the config has no warm start (warmstart.steps = 0)"
  for key in (k for p in points for k in p):
    if key.split(".")[1] in SECTIONS:
      return f"a point sets {key}, which the warm start reads"
  return ""


# fields added to those sections since warm starts were first recorded that do not change the warm start made (a
# warning's threshold, how rewards are batched, the sampler's layout of the table, which positions the vocabulary
# projection skips: rounding at most): left out of its record at any depth, so the warm starts made before them are
# still found
NOT_MADE_FROM = {"warmstart": ("memorised_nll",), "task": ("reward_batch",),
                 "model": ("decode_transposed_table", "logprob_skip_unread")}


def _without(value, names):
  if isinstance(value, dict):
    return {k: _without(v, names) for k, v in value.items() if k not in names}
  return value


def fields(config) -> dict:
  """The config fields a warm start is made from, as JSON values (what RECORD compares)."""
  made_from = {name: _without(config[name].to_dict(), NOT_MADE_FROM.get(name, ())) for name in SECTIONS}
  return json.loads(json.dumps(made_from | {"seed": config.seed}, sort_keys=True, default=repr))


def command(config_spec: str, workdir: str, extra: Sequence[str]) -> list[str]:
  return [sys.executable, "-m", "oapl_jax.apps.sweep_warmstart", f"--config={config_spec}", f"--workdir={workdir}",
          *extra]


def ensure(config_spec: str, workdir: str, extra: Sequence[str]) -> dict:
  """Makes WORKDIR/warmstart unless its record is there (a subprocess, logged to build.log); returns the record."""
  out = directory(workdir)
  made_from = fields(files.load(config_spec, list(extra)))
  path = os.path.join(out, RECORD)
  if os.path.exists(path):
    with open(path) as f:
      record = json.load(f)
    if record["fields"] != made_from:
      raise ValueError(f"{out} was made from other warmstart/model/task/seed fields than {config_spec} with "
                       f"{list(extra)} gives; use another --workdir, or delete it and the runs that loaded it")
    print(f"[sweep] warm start: made before ({record['wall_seconds']:.0f}s), reused from {out}", flush=True)
    return record
  os.makedirs(out, exist_ok=True)
  line = command(config_spec, workdir, extra)
  start = time.time()
  print(f"[sweep] warm start: making it once for every run; log {out}/build.log", flush=True)
  with open(os.path.join(out, "build.log"), "a") as log:
    log.write(f"$ {shlex.join(line)}\n")
    log.flush()
    if subprocess.run(line, stdout=log, stderr=subprocess.STDOUT).returncode:
      raise RuntimeError(f"the shared warm start failed; see {out}/build.log")
  if not os.path.exists(os.path.join(out, "config.json")):  # exit 0 without it: a SIGTERM saved it part-way
    raise RuntimeError(f"the shared warm start was stopped part-way (saved; see {out}/build.log): run the same "
                       "command again to continue it")
  record = {"fields": made_from, "wall_seconds": time.time() - start, "command": shlex.join(line)}
  with open(path + ".tmp", "w") as f:
    json.dump(record, f, indent=2)
  os.replace(path + ".tmp", path)
  print(f"[sweep] warm start: made in {record['wall_seconds']:.0f}s, {out}", flush=True)
  return record


def build(config_spec: str, workdir: str, extra: Sequence[str], stop=None) -> None:
  """The config's warm start, saved as an HF directory to WORKDIR/warmstart (its progress saved beside it, so a
  `stop` (rl/preemption.StopFlag) raises preemption.Stopped and the next call continues it). After
  apps/cli.prepare_host()."""
  from oapl_jax.models import hf  # pylint: disable=import-outside-toplevel
  from oapl_jax.run import assemble, check, policy, schema  # pylint: disable=import-outside-toplevel
  rc = schema.from_config(files.load(config_spec, list(extra)))
  check.check(rc)
  task = assemble.build_task(rc)
  try:
    warm = policy.warm_started(rc, task, workdir=directory(workdir), stop=stop)
    tok = task.tokenizer
    hf.save(directory(workdir), warm.model.config, warm.params, token_ids=hf.TokenIds(eos=tok.eos_id, pad=tok.pad_id,
                                                                                      bos=tok.bos_id))
    shutil.rmtree(os.path.join(directory(workdir), assemble.WARMSTART_CHECKPOINTS), ignore_errors=True)  # made
  finally:
    task.close()
