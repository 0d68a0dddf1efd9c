"""Time from SIGTERM to exit, at each phase of a run, and whether the same command then finishes it equal.

    python -m benchmarks.stop_latency                           # every phase, this tree
    python -m benchmarks.stop_latency --repo /tmp/before --phases step-0_eval periodic_eval
    python -m benchmarks.stop_latency --set eval.samples=32       # evals 8x longer

Each phase: a fresh workdir, `python -m oapl_jax.main` on configs/arithmetic.py (the real sampler, shortened: a
60-step warm start, 3 windows of 20 steps, the snapshot evaluated at steps 0 and 40 and after step 60, 256 prompts x
16 samples each), SIGTERM sent when the phase's marker line is printed (plus a delay), then the time to the
process's exit and its exit code; then the same command again, which must finish, and its metrics.jsonl against
an uninterrupted run's (every logged value, timing aside). `--repo`: the source tree to run (PYTHONPATH), e.g. a
`git worktree` of an older commit, for a before/after table. A pod's grace period before SIGKILL is 30 s by
default (GKE, SLURM). A benchmark, not a test.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

ARGS = ["--config", "configs/arithmetic.py", "--config.warmstart.steps=60", "--config.loop.num_syncs=3",
        "--config.loop.sync_every=20", "--config.loop.eval_every_syncs=2", "--config.checkpoint.every_syncs=1",
        "--config.eval.samples=16"]
# phase: (marker line regex, seconds after it that SIGTERM goes)
PHASES = {
    "setup": (r"^distributed:", 0.5),
    "warm_start": (r"^warm start: step \d+/60,", 0.0),
    "step-0_eval": (r"^warm start: step 60/60,", 2.0),  # the loop's set-up, then the eval of 4096 samples
    "save": (r"^window 1/3 ", 0.0),  # the line is printed just before the window's checkpoint
    "training": (r"^window 1/3 ", 1.5),  # inside window 2 (steps 20-39; no eval at its start)
    "periodic_eval": (r"^window 2/3 ", 0.3),  # window 3 starts with the snapshot's eval
    "final_eval": (r"^window 3/3 ", 0.5),
}
UNTIMELY = ("seconds", "tokens_per_second", "buffer/groups", "compile", "wait")


OVERRIDES: list[str] = []  # --set FIELD=VALUE: config overrides for every run


def command(workdir: str) -> list[str]:
  return [sys.executable, "-m", "oapl_jax.main", *ARGS, *(f"--config.{o}" for o in OVERRIDES), "--workdir", workdir]


def start(repo: str, workdir: str) -> subprocess.Popen:
  env = {**os.environ, "PYTHONPATH": repo, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
  return subprocess.Popen(command(workdir), cwd=repo, env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)


def values(workdir: str) -> list:
  """Every logged (step, metric, value), timing and the sampler's progress aside, in a canonical order."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return sorted((h["step"], k, v) for h in rows for k, v in h.items()
                if k != "step" and not any(u in k for u in UNTIMELY))


def stop_in(repo: str, workdir: str, phase: str) -> dict:
  """One stopped run and its resume: seconds from SIGTERM to exit, exit codes, the summary's stop fields."""
  pattern, delay = PHASES[phase]
  proc, lines, marked = start(repo, workdir), [], threading.Event()

  def read():
    for line in proc.stdout:
      lines.append(line)
      if not marked.is_set() and re.search(pattern, line):
        marked.set()
  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  if not marked.wait(900):
    proc.kill()
    raise RuntimeError(f"{phase}: no line matching {pattern!r}; the run printed:\n{''.join(lines[-20:])}")
  time.sleep(delay)
  sent = time.perf_counter()
  proc.send_signal(signal.SIGTERM)
  code = proc.wait(600)
  seconds = time.perf_counter() - sent
  reader.join(10)
  summary_path = os.path.join(workdir, "summary.json")
  summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
  out = {"phase": phase, "stop_s": round(seconds, 1), "exit": code,
         "steps_at_stop": summary.get("trainer_steps"), "cut": summary.get("cut", ""),
         "after": next((l.strip() for l in reversed(lines) if "stop" in l.lower()), "")[:100]}
  resume = start(repo, workdir)
  resume_out = resume.communicate(timeout=1800)[0]
  final = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
  out.update(resume_exit=resume.returncode, resumed_finished=bool(final.get("finished")) and
             "stopped_by" not in final, resume_tail=resume_out.strip().splitlines()[-1:] if resume.returncode else [])
  return out


def table(rows: list[dict], equal: dict) -> str:
  head = ("| phase | SIGTERM to exit (s) | exit code | steps done at the stop | cut | resume: exit, finished | "
          "resume's metrics = uninterrupted |\n|---|---:|---:|---:|---|---|---|")
  body = [f"| {r['phase']} | {r['stop_s']} | {r['exit']} | {r['steps_at_stop']} | {r['cut'] or '-'} | "
          f"{r['resume_exit']}, {r['resumed_finished']} | {equal.get(r['phase'], '?')} |" for r in rows]
  return "\n".join([head, *body])


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--repo", default=os.getcwd(), help="the source tree to run (default: this one)")
  p.add_argument("--workdir", default="runs/stop_latency")
  p.add_argument("--phases", nargs="+", default=list(PHASES), choices=list(PHASES))
  p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="config overrides for every run")
  p.add_argument("--json", help="also write the rows here")
  a = p.parse_args()
  OVERRIDES.extend(a.set)
  repo, root = os.path.abspath(os.path.expanduser(a.repo)), os.path.abspath(os.path.expanduser(a.workdir))
  reference = os.path.join(root, "uninterrupted")
  if not os.path.exists(os.path.join(reference, "summary.json")):
    shutil.rmtree(reference, ignore_errors=True)
    print("the uninterrupted run ...", flush=True)
    done = start(repo, reference).communicate(timeout=1800)
    if not os.path.exists(os.path.join(reference, "summary.json")):
      raise RuntimeError(f"the uninterrupted run failed:\n{done[0][-3000:]}")
  want, rows, equal = values(reference), [], {}
  for i, phase in enumerate(a.phases):
    workdir = os.path.join(root, phase)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"[{i + 1}/{len(a.phases)}] {phase} ...", flush=True)
    rows.append(stop_in(repo, workdir, phase))
    equal[phase] = values(workdir) == want
    print(f"  {rows[-1]} equal={equal[phase]}", flush=True)
  print(table(rows, equal))
  if a.json:
    with open(os.path.expanduser(a.json), "w") as f:
      json.dump([{**r, "equal": equal[r["phase"]]} for r in rows], f, indent=1)


if __name__ == "__main__":
  main()
