"""pass@k of a run's checkpoint, or of a Hugging Face directory, on named evaluation sets.

  oapl-eval runs/demo                                   # the run's config and eval sets, newest checkpoint
  oapl-eval runs/demo --step 40 --samples 16 --ks 1,4,16 --num_prompts 100
  oapl-eval /tmp/demo_hf --config configs/arithmetic.py # an export (or any HF Qwen or Llama directory)
  oapl-eval /ckpt/Qwen3-4B --config configs/math.py --sets aime25=data/aime25.jsonl hmmt=data/hmmt25.parquet
  oapl-eval runs/demo --show 3                          # and print 3 generations of each set

The config says the task (prompts, tokenizer, reward) and the eval sampling (cfg.eval); flags override
the latter. --sets replaces the task's eval sets by NAME=PATH pairs (task.eval_paths: JSONL, Parquet or
tfds:NAME/SPLIT). Writes eval.json and eval.md into --out (default RUN_DIR/eval/step_N, HF_DIR/eval), and the
generations of each set's first eval.save_prompts prompts as <set>.jsonl beside them (oapl_jax/generations.py).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import time
from typing import Sequence

from oapl_jax.apps import cli

cli.prepare_host()

from oapl_jax import checkpoint_files, evaluation, generations  # noqa: E402
from oapl_jax.run import assemble, policy, schema  # noqa: E402


def _source_kind(path: str) -> str:
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return "run"
  if glob.glob(os.path.join(path, "*.safetensors")) and os.path.exists(os.path.join(path, "config.json")):
    return "hf"
  raise FileNotFoundError(f"{path} is neither a run directory (no checkpoints/) nor a Hugging Face directory "
                          f"(config.json + *.safetensors)")


def _parse_sets(pairs: Sequence[str]) -> dict[str, str]:
  sets = {}
  for pair in pairs:
    name, sep, path = pair.partition("=")
    if not sep or not name or not path:
      raise ValueError(f"--sets {pair!r}: expected NAME=PATH")
    if name in sets:
      raise ValueError(f"--sets: the name {name!r} is given twice")
    sets[name] = path
  return sets


def with_sets(rc: schema.RunConfig, sets: dict[str, str]) -> schema.RunConfig:
  """`rc` with its task's eval sets replaced by NAME=PATH pairs (task.eval_paths)."""
  values = schema.to_mapping(rc)
  if "eval_paths" not in values["task"]:
    raise ValueError(f"--sets: task {values['task'].get('name')!r} takes no eval_paths (its eval sets are built in); "
                     f"drop --sets to use them")
  values["task"]["eval_paths"] = dict(sets)
  return schema.from_config(values)


def evaluate_source(source: str, *, cfg=None, step: int | None = None,
                    sets: dict[str, str] | None = None, samples: int | None = None, ks: Sequence[int] | None = None,
                    num_prompts: int | None = None, seed: int | None = None, save_prompts: int | None = None,
                    **sampling) -> dict:
  """pass@k (and the other evaluation.evaluate metrics) on every eval set; returns the report dict.
  cfg: the --config (a ConfigDict or RunConfig; a run directory's own when None; an HF directory needs it).
  `sampling`: overrides of the eval SamplingSettings (temperature, top_p, top_k, max_new_tokens)."""
  source = str(checkpoint_files.absolute(source))
  kind = _source_kind(source)
  if sets and (cfg is not None or kind == "run"):  # checked before any checkpoint is read
    cfg = with_sets(schema.from_run_dir(source) if cfg is None else schema.from_config(cfg), sets)
  weights = policy.policy(source, config=cfg, step=step)  # the run's params, or the HF directory's model
  rc = weights.config
  samples = samples or rc.eval.samples
  ks = tuple(k for k in (ks or rc.eval.ks) if k <= samples)  # those that `samples` allows
  rc = dataclasses.replace(rc, eval=dataclasses.replace(
      rc.eval, samples=samples, ks=ks, num_prompts=num_prompts or rc.eval.num_prompts,
      save_prompts=rc.eval.save_prompts if save_prompts is None else save_prompts))
  task = assemble.build_task(rc)
  try:
    _, settings = assemble.sampling(rc, task)
    settings = settings.replace(**{k: v for k, v in sampling.items() if v is not None})
    seed = assemble.eval_seed(rc) if seed is None else seed  # the loop's eval seed by default
    layouts = assemble.placement(rc)
    longest = max(len(p.prompt_tokens) for problems in task.eval_sets.values() for p in problems[:rc.eval.num_prompts])
    sampler = assemble.build_sampler(rc, weights.model, layouts.sampler, max_prefill_length=max(
        rc.sampler.max_prefill_length, longest), max_new_tokens=settings.max_new_tokens)
    report = {"source": os.path.abspath(source), "kind": kind, "task": task.name, "samples": rc.eval.samples,
              "ks": list(rc.eval.ks), "seed": seed, "settings": {k: v for k, v in vars(settings).items()}}
    weights.load_into(sampler)
    if kind == "run":
      report.update(step=weights.step, syncs_done=weights.meta.syncs_done)
    report["sets"], report["generations"] = {}, {}
    for name, problems in task.eval_sets.items():
      start = time.perf_counter()
      per_set, saved = evaluation.evaluate_sets(sampler, sampler.params, task, {name: problems}, rc.eval, settings,
                                                seed)
      report["sets"][name] = {"prompts": len(problems[:rc.eval.num_prompts]), **per_set[name],
                              "seconds": round(time.perf_counter() - start, 2)}
      report["generations"][name] = saved[name]
    return report
  finally:
    task.close()


def write_report(report: dict, out_dir: str) -> dict[str, str]:
  """eval.json, eval.md and each set's generations (<set>.jsonl; eval.json names the files)."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {"json": os.path.join(out_dir, "eval.json"), "markdown": os.path.join(out_dir, "eval.md")}
  saved = {name: rows for name, rows in report.get("generations", {}).items() if rows}
  for name, rows in saved.items():
    generations.write(os.path.join(out_dir, f"{name}.jsonl"), rows)
  with open(paths["json"], "w") as f:
    json.dump({**report, "generations": {name: f"{name}.jsonl" for name in saved}}, f, indent=2, default=str)
  metrics = list(dict.fromkeys(k for values in report["sets"].values() for k in values))
  where = f"step {report['step']} of run" if report["kind"] == "run" else "Hugging Face directory"
  s = report["settings"]
  lines = [f"# Evaluation: {where} {report['source']}", "",
           f"task {report['task']}; {report['samples']} samples per prompt at temperature {s['temperature']}, "
           f"top_p {s['top_p']}, top_k {s['top_k']}, max_new_tokens {s['max_new_tokens']}; seed {report['seed']}", "",
           "| set | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
  for name, values in report["sets"].items():
    lines.append(f"| {name} | " + " | ".join(_cell(values.get(m)) for m in metrics) + " |")
  for name, rows in saved.items():
    lines += ["", f"## Generations: {name} ({min(generations.TABLE_ROWS, len(rows))} of the {len(rows)} in "
              f"[{name}.jsonl]({name}.jsonl))", "", generations.table(rows)]
  with open(paths["markdown"], "w") as f:
    f.write("\n".join(lines) + "\n")
  return paths


def _cell(value) -> str:
  return f"{value:.4g}" if isinstance(value, float) else str(value)


def _show(saved: dict[str, list[dict]], n: int) -> None:
  """--show N: N generations of each set, as text."""
  if n <= 0:
    return
  for name, rows in saved.items():
    print(f"\n--- {name}: {min(n, len(rows))} of {len(rows)} kept generations ---")
    print(generations.show(rows, n) if rows else "none kept (eval.save_prompts=0; pass --save_prompts N)")


def main(argv: Sequence[str] | None = None) -> int:
  p = cli.parser("oapl-eval", __doc__)
  p.add_argument("source", help="a run directory or a Hugging Face directory")
  cli.add_config(p)  # required for an HF directory; default: RUN_DIR/config.json
  p.add_argument("--step", type=int, help="a run's checkpoint step (default: the newest)")
  p.add_argument("--sets", nargs="+", default=[], metavar="NAME=PATH", help="named eval sets (task.eval_paths)")
  p.add_argument("--samples", type=int, help="samples per prompt (default cfg.eval.samples)")
  p.add_argument("--ks", help="comma-separated k of pass@k (default cfg.eval.ks)")
  p.add_argument("--num_prompts", type=int, help="first N prompts of each set (default cfg.eval.num_prompts)")
  p.add_argument("--seed", type=int)
  p.add_argument("--temperature", type=float)
  p.add_argument("--top_p", type=float)
  p.add_argument("--top_k", type=int)
  p.add_argument("--max_new_tokens", type=int)
  p.add_argument("--out", help="report directory (default RUN_DIR/eval/step_N or HF_DIR/eval)")
  p.add_argument("--show", type=int, default=0, metavar="N", help="print N generations of each set")
  p.add_argument("--save_prompts", type=int,
                 help="generations kept: the first N prompts of each set, all their samples (default "
                      "cfg.eval.save_prompts; 0: none)")
  args, cfg = cli.parse(p, argv)
  ks = tuple(int(k) for k in args.ks.split(",")) if args.ks else None
  report = evaluate_source(args.source, cfg=cfg, step=args.step, sets=_parse_sets(args.sets),
                           samples=args.samples, ks=ks, num_prompts=args.num_prompts, seed=args.seed,
                           save_prompts=args.save_prompts,
                           temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                           max_new_tokens=args.max_new_tokens)
  where = [f"step_{report['step']}"] if report["kind"] == "run" else []
  out = os.path.expanduser(args.out) if args.out else os.path.join(report["source"], "eval", *where)
  paths = write_report(report, out)
  for name, values in report["sets"].items():
    passes = ", ".join(f"{k}={v:.4f}" for k, v in values.items() if k.startswith("pass@"))
    print(f"{name} ({values['prompts']} prompts x {report['samples']} samples): {passes}")
  print(f"report: {paths['json']}  {paths['markdown']}")
  _show(report["generations"], args.show)
  return 0


def run() -> None:
  """Console script entry point (oapl-eval)."""
  cli.run(main)


if __name__ == "__main__":
  run()
