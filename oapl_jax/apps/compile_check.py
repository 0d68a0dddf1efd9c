"""Compile the run's train step and sampler ahead of time for a named TPU slice (libtpu on this host, no TPU):
memory per chip against HBM, FLOPs and a step-time estimate (oapl_jax/run/compile_check.py).

  python -m oapl_jax.apps.compile_check --config configs/math.py --topology v5p-64
  python -m oapl_jax.apps.compile_check --config configs/math.py --topology 2xv5litepod-256 '--config.mesh.trainer_dcn=(2,1,1)'

--json FILE is rewritten after each program with those finished so far ("complete": false until the last). Ctrl-C
or SIGTERM stops before the next program (the one compiling finishes) with one line naming the programs in FILE;
exit 128 + the signal (130, 143): a stopped check has not shown that the run fits (a second signal stops at once).
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import tempfile
from typing import Optional, Sequence

import jax

from oapl_jax.run import compile_check as cc
from oapl_jax.apps import cli
from oapl_jax.rl import preemption

GIB = 1024 ** 3


def format_report(report: cc.Report) -> str:
  """The report as the command prints it: per-program memory, host transfers and XLA's FLOPs, then the step."""
  gib = lambda b: f"{b / GIB:8.2f}"  # noqa: E731
  hbm, lay = report.hbm_bytes, report.layout
  lines = [f"{report.topology}: {report.num_chips} x {report.chip} chips, {hbm / GIB:.2f} GiB HBM each; trainer on "
           f"{lay['trainer_mesh']}, sampler on {lay['sampler_mesh']}{' (shared)' if report.shared else ''}",
           f"train step: {lay['batch_prompts']} prompts x {lay['group_size']} samples x T={lay['seq_len']}, "
           f"micro_batches={lay['micro_batches']}; sampler: {lay['num_slots']} slots, cache {lay['cache_len']}",
           "", "per device (GiB)      argument   output  aliased     temp     code    total   % HBM  fits   host<->chip  "
           "XLA FLOPs"]
  fits = report.fits()
  for name, m in report.programs.items():
    if m.error and m.total:  # out of memory: the compiler's total, no breakdown
      lines.append(f"{name:<20} {'':>44} >={gib(m.total)[2:]} {100 * m.total / hbm:6.0f}%  NO")
    elif m.error:
      lines.append(f"{name:<20} did not compile: {m.error[:250]}")
    else:
      lines.append(f"{name:<20} {gib(m.argument)} {gib(m.output)} {gib(m.alias)} {gib(m.temp)} "
                   f"{gib(m.generated_code)} {gib(m.total)} {100 * m.total / hbm:6.1f}%  {'yes' if fits[name] else 'NO ':<3}"
                   f"  {gib(m.host_bytes)}    {m.xla_flops:9.3e}")
  if "train_step + sampler resident" in fits:
    lines.append(f"{'train + sampler resident':<20} {'':>44}   {gib(report.resident_bytes())} "
                 f"{100 * report.resident_bytes() / hbm:6.1f}%  "
                 f"{'yes' if fits['train_step + sampler resident'] else 'NO'}  (snapshot + decode state stay in HBM)")
  if "train_step" in report.programs:
    f = report.flops
    xla = report.programs["train_step"].xla_flops * report.trainer_devices
    mfu = f["model"] / (report.trainer_devices * report.peak_flops * report.step_seconds)
    lines += ["", "host<->chip: GiB per chip moved between HBM and pinned host memory per call, both ways (the train "
              "step: per optimizer step)", "XLA FLOPs: per chip, XLA's cost analysis, every loop body counted once "
              "(not per step; oapl_jax/run/compile_check.py says why)",
              f"train step FLOPs: model {f['model']:.3e} (6*N*tokens + 12*L*H*D*T^2*seqs, N={f['matmul_weights']:.3e}), "
              f"executed {f['executed']:.3e}; XLA cost analysis x {report.trainer_devices} chips {xla:.3e}",
              f"estimated step time {report.step_seconds:.2f} s = executed FLOPs at {100 * report.mfu:.0f}% of "
              f"{report.trainer_devices} x {report.peak_flops / 1e12:.0f} TFLOP/s ({report.compute_seconds:.2f} s) + "
              f"{report.programs['train_step'].host_bytes / GIB:.2f} GiB per chip to and from host memory at "
              f"{report.host_bytes_per_s / 1e9:.1f} GB/s ({report.host_seconds:.2f} s, assumed PCIe rate, in series); "
              f"{f['tokens'] / report.step_seconds / report.trainer_devices:.0f} tokens/s/chip, {100 * mfu:.0f}% MFU"]
  notes = report.notes + [f"{name} keeps {m.host_temp / GIB:.2f} GiB per chip in pinned host memory (not in total)"
                          for name, m in report.programs.items() if m.host_temp]
  return "\n".join(lines + [f"note: {n}" for n in notes])


def write_json(path: str, report: cc.Report, complete: bool) -> None:
  """The report's numbers at `path`, replaced whole (a temporary file, then os.replace): a reader never sees half."""
  record = {**dataclasses.asdict(report), "fits": report.fits(), "complete": complete}
  fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".compile_check.")
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(record, f, indent=2, default=float)
    os.replace(temporary, path)
  except BaseException:
    os.unlink(temporary)
    raise


def main(argv: Optional[Sequence[str]] = None) -> int:
  p = cli.parser("python -m oapl_jax.apps.compile_check", __doc__)
  cli.add_config(p, required=True)
  p.add_argument("--topology", required=True, help="v5p-64, v5e-256, v6e-16, 2xv5e-256, v5p:4x4x8, ...")
  p.add_argument("--seq_len", type=int, default=0, help="trainer sequence length T (0: as the run computes it)")
  p.add_argument("--mfu", type=float, default=0.4,
                 help="fraction of the chips' peak bf16 FLOP/s the executed FLOPs run at (step-time estimate)")
  p.add_argument("--host_gbps", type=float, default=0.0,
                 help="host<->chip GB/s per chip, each way, for the estimate (0: the chip's assumed 15 GB/s)")
  p.add_argument("--hbm_gib", type=float, default=0.0, help="HBM per chip to fit in (0: the chip's)")
  p.add_argument("--programs", default=",".join(cc.PROGRAMS),
                 help="comma-separated programs to compile (e.g. train_step alone: minutes less at the paper's scale)")
  p.add_argument("--num_layers", type=int, default=0, help="compile the model cut to this many layers (0: all)")
  p.add_argument("--json", default="", help="write the numbers here, after each program (\"complete\": false "
                 "until the last)")
  args, cfg = cli.parse(p, argv)
  jax.config.update("jax_platforms", "cpu")  # compile-only TPU devices come from libtpu; run nothing here
  programs = [x for x in args.programs.split(",") if x]
  stop = preemption.StopFlag(then="stopping when the compile in flight returns (send it again to stop at once)")
  save = (lambda report: write_json(args.json, report, complete=False)) if args.json else (lambda report: None)
  try:
    stop.install()
    report = cc.check(cfg, args.topology, seq_len=args.seq_len or None, mfu=args.mfu,
                      hbm_bytes=int(args.hbm_gib * GIB) if args.hbm_gib else None, programs=programs,
                      num_layers=args.num_layers, host_bytes_per_s=args.host_gbps * 1e9 or None, stop=stop,
                      on_program=save)
  except cc.LibtpuMissing as e:  # the package without its compile-check extra: one line, before any compile
    print(f"error: {e}", file=sys.stderr)
    return 2
  finally:
    stop.uninstall()
  left = [name for name in cc.PROGRAMS if name in programs and name not in report.programs]
  if stop.requested and left:
    save(report)  # the file says what finished, even when nothing had
    done = ", ".join(report.programs) or "no program"
    where = f"in {args.json} (\"complete\": false)" if args.json else "finished (no --json: not written)"
    print(f"compile check stopped by {stop.signal_name}: {done} {where}; not compiled: {', '.join(left)}",
          file=sys.stderr)
    return 128 + signal.Signals[stop.signal_name].value
  print(format_report(report))
  if args.json:
    write_json(args.json, report, complete=True)
  misfits = [name for name, ok in report.fits().items() if not ok]
  if misfits:
    print(f"\nDOES NOT FIT {report.topology}: {', '.join(misfits)} (over {report.hbm_bytes / GIB:.2f} GiB per chip, "
          "or did not compile)", file=sys.stderr)
    return 1
  print(f"\nfits {report.topology}")
  return 0


def run() -> None:
  """Console script entry point."""
  cli.run(main)


if __name__ == "__main__":
  run()
