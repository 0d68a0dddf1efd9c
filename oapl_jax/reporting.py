"""Metrics out of a run: TensorBoard events (event_writers: clu's, or tensorboard's own), progress with ETA, a
JSONL history, and at the end a PNG learning curve and a short summary. Only process 0 writes files."""
import contextlib
import errno
import json
import logging
import os
import sys
import threading
import time
from typing import Mapping, Optional

import jax
import numpy as np

from oapl_jax import event_writers, run_dir


class MetricsUnwritable(RuntimeError):
  """metrics.jsonl could not be written (a directory in its place, a full disk): the run stops, one line."""

  def __init__(self, path: str, doing: str, cause: OSError):
    super().__init__(f"{path} could not be {doing} ({cause.strerror or cause}): the run stopped, no line half-written; "
                     "make it a writable file (or move it aside), then run the same command to resume from the last "
                     "checkpoint")


def _append_whole_line(path: str, line: str) -> None:
  """Appends `line` to `path` whole or not at all: a write that fails part way (a full disk, a file-size limit)
  is cut back off, so a reader never meets half a line."""
  data = line.encode()
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    size = os.fstat(fd).st_size
    try:
      written = 0
      while written < len(data):  # a short write: the next one says why (ENOSPC, EFBIG)
        n = os.write(fd, data[written:])
        if n == 0:
          raise OSError(errno.EIO, "the write took no bytes")
        written += n
    except OSError:
      with contextlib.suppress(OSError):
        os.ftruncate(fd, size)
      raise
  finally:
    os.close(fd)


class PhaseClock:
  """Seconds per (thread, phase) of a run's loop, from `start()`: summary.md's 'Where the time went' table.

  Each thread ("trainer", "sampler") times disjoint stretches of its own time, never one inside another, so a
  thread's phases sum to at most the wall time since `start()`; what no phase covers is its "other" row.
  Between `start()` and `stop()` JAX's compile events (tracing, lowering, XLA) are summed per thread and phase too
  (the phase the thread was in, else "other"): a part of that phase's time, shown beside it.
  """
  COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                    "/jax/core/compile/backend_compile_duration")

  def __init__(self):
    self._lock = threading.Lock()
    self._seconds: dict[tuple[str, str], float] = {}
    self._compile: dict[tuple[str, str], float] = {}
    self._thread_names: dict[int, str] = {}  # thread ident -> the name its timed() calls gave
    self._current: dict[int, str] = {}  # thread ident -> the phase it is in
    self._start = time.perf_counter()

  def start(self) -> None:
    self._start = time.perf_counter()
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def stop(self) -> None:
    jax.monitoring.unregister_event_duration_listener(self._on_event)

  def _on_event(self, event: str, seconds: float, **_) -> None:
    if event in self.COMPILE_EVENTS:
      ident = threading.get_ident()
      key = self._thread_names.get(ident, "trainer"), self._current.get(ident, "other")
      with self._lock:
        self._compile[key] = self._compile.get(key, 0.0) + seconds

  def compile_seconds(self) -> dict[str, dict[str, float]]:
    """{thread: {phase: seconds compiling inside it}}."""
    with self._lock:
      out: dict[str, dict[str, float]] = {}
      for (thread, phase), s in self._compile.items():
        out.setdefault(thread, {})[phase] = s
      return out

  def elapsed(self) -> float:
    return time.perf_counter() - self._start

  def add(self, thread: str, phase: str, seconds: float) -> None:
    with self._lock:
      self._seconds[thread, phase] = self._seconds.get((thread, phase), 0.0) + seconds

  @contextlib.contextmanager
  def timed(self, thread: str, phase: str):
    ident = threading.get_ident()
    self._thread_names[ident], self._current[ident] = thread, phase
    start = time.perf_counter()
    try:
      yield
    finally:
      self._current.pop(ident, None)
      self.add(thread, phase, time.perf_counter() - start)

  def seconds(self, thread: Optional[str] = None, phase: Optional[str] = None) -> float:
    with self._lock:
      return sum(s for (t, p), s in self._seconds.items() if thread in (None, t) and phase in (None, p))

  def marks(self) -> dict[str, float]:
    """Scalars logged with an eval: the loop's wall time so far and the trainer's eval time within it (loop_bench's
    clock; the sampler's snapshot evals run beside the trainer, so only the trainer's delay the run)."""
    return {"time/loop_seconds": self.elapsed(), "time/eval_seconds": self.seconds("trainer", "eval")}

  def phases(self) -> dict[str, dict[str, float]]:
    with self._lock:
      out: dict[str, dict[str, float]] = {}
      for (thread, phase), s in self._seconds.items():
        out.setdefault(thread, {})[phase] = s
      return out

  def markdown(self, wall: float) -> str:
    """One table per thread: each phase's seconds and share of `wall`, then what no phase covered."""
    lines = [f"\n## Where the time went\n\nThe loop's wall time: {wall:.1f} s. Each thread's phases are disjoint "
             "(the sampler's thread runs beside the trainer's).\n"]
    compiled = self.compile_seconds()
    for thread, phases in sorted(self.phases().items(), key=lambda kv: kv[0] != "trainer"):
      lines += [f"| {thread} thread | seconds | share of wall | of which compiling |", "|---|---:|---:|---:|"]
      rows = sorted(phases.items(), key=lambda kv: -kv[1]) + [("other", wall - sum(phases.values()))]
      within = compiled.get(thread, {})
      lines += [f"| {phase} | {s:.2f} | {s / max(wall, 1e-9):.1%} | {within.get(phase, 0.0):.2f} |" for phase, s in rows]
      lines.append("")
    return "\n".join(lines)


class Reporter:
  """Every metric to TensorBoard and metrics.jsonl (process 0 only); the console gets one concise
  line per sync window (`window_line`) and a progress bar within it (`tick`), also in a notebook.

  The ETA counts only steady-state steps of this process (from the end of its first window, so
  neither warm start nor compilation skews it) and is right after a resume.

  A workdir an earlier attempt logged to is continued (`resume_from`, before any write) or, when the run
  starts afresh (no checkpoint), that attempt's metrics.jsonl and TensorBoard events are moved to
  earlier-attempt-N/ at the first write, so no step is logged twice.
  """

  def __init__(self, workdir: str, total_steps: int, switches: Optional[Mapping[str, str]] = None,
               events: str = "clu"):
    self.workdir = os.path.abspath(workdir)
    self.is_main = jax.process_index() == 0
    os.makedirs(self.workdir, exist_ok=True)
    self.history_path = os.path.join(self.workdir, "metrics.jsonl")
    self._earlier_attempt = self._logs() if self.is_main else []  # before the writer adds its events file
    self.events = events
    self.writer = event_writers.open_writer(self.workdir if self.is_main else None, events)
    self._total = total_steps
    self.switches = dict(switches or {})  # summary.md's settings in use, from the typed config (run/assemble)
    self._start = time.perf_counter()
    self._steady: Optional[tuple[float, int]] = None  # (time, step) at the end of this process's first window
    self._bar = None
    self.latest: dict[str, float] = {}  # the newest value of every metric
    self.phases = PhaseClock()  # the loop's time per thread and phase (loop.train starts it)
    self._writer_lock = threading.Lock()

  def resume_from(self, step: int) -> None:
    """A resumed run re-runs steps >= `step`: drop them from metrics.jsonl (rewritten through a tmp file and a
    rename: MetricsUnwritable where it cannot be) and rebuild TensorBoard's events from what is kept, so no point
    is logged twice."""
    self._earlier_attempt = []  # continued, not set aside
    if not self.is_main:
      return
    try:
      kept = [h for h in self.history() if h["step"] < step or any(k.startswith("warmstart/") for k in h)]
      with open(self.history_path + ".tmp", "w") as f:
        f.writelines(json.dumps(h) + "\n" for h in kept)
      os.replace(self.history_path + ".tmp", self.history_path)
    except OSError as e:
      raise MetricsUnwritable(self.history_path, f"rewritten to resume at step {step}", e) from None
    self.writer.close()
    for name in os.listdir(self.workdir):
      if name.startswith("events.out.tfevents"):
        os.remove(os.path.join(self.workdir, name))
    self.writer = event_writers.open_writer(self.workdir, self.events)
    for h in kept:
      self.writer.write_scalars(h["step"], {k: v for k, v in h.items() if k != "step"})

  def _logs(self) -> list[str]:
    names = sorted(n for n in os.listdir(self.workdir) if n == "metrics.jsonl" or n.startswith("events.out.tfevents"))
    return [os.path.join(self.workdir, n) for n in names]

  def _set_aside_earlier_attempt(self) -> None:
    n = 1
    while os.path.exists(aside := os.path.join(self.workdir, f"earlier-attempt-{n}")):
      n += 1
    os.makedirs(aside)
    for path in self._earlier_attempt:
      os.replace(path, os.path.join(aside, os.path.basename(path)))
    self._earlier_attempt = []
    logging.warning("a fresh start in %s: the earlier attempt's metrics were moved to %s", self.workdir, aside)

  def scalars(self, step: int, metrics: Mapping[str, float]) -> None:
    if self._earlier_attempt:
      self._set_aside_earlier_attempt()
    metrics = {k: float(v) for k, v in metrics.items()}
    self.latest.update(metrics)
    with self._writer_lock:
      self.writer.write_scalars(step, metrics)
    if self.is_main:
      try:
        _append_whole_line(self.history_path, json.dumps({"step": step, **metrics}) + "\n")
      except OSError as e:
        raise MetricsUnwritable(self.history_path, f"written at step {step}", e) from None

  def texts(self, step: int, texts: Mapping[str, str]) -> None:
    """Markdown to TensorBoard's text panel (e.g. a table of an eval's generations: oapl_jax/generations.py)."""
    with self._writer_lock:  # the sampler's snapshot evals write from the rollout worker's thread
      self.writer.write_texts(step, dict(texts))

  def tick(self, step: int, window_end: int) -> None:
    """Progress within a window: a tqdm bar on a terminal or in a notebook; nothing in a pipe or a file (the
    loop's one line per window is the progress there)."""
    if not self.is_main or not redraws_in_place():
      return
    if self._bar is None:
      from tqdm import auto as tqdm  # pylint: disable=import-outside-toplevel
      self._bar = tqdm.tqdm(total=self._total, initial=step - 1, unit="step", leave=False, dynamic_ncols=True)
    self._bar.update(1)
    self._bar.set_postfix_str(f"window ends at {window_end}", refresh=False)

  def window_line(self, step: int, window: int, num_windows: Optional[int], values: Mapping[str, float]) -> str:
    """`window 3/12 | step 30/120 | loss 0.012 | ... | 2.10 steps/s | ETA 57s`, ETA from steady steps."""
    now = time.perf_counter()
    if self._steady is None:
      self._steady = (now, step)
      rate = float("nan")
    else:
      rate = (step - self._steady[1]) / max(now - self._steady[0], 1e-9)
    eta = (self._total - step) / rate if rate == rate and rate > 0 else float("nan")
    parts = [f"window {window}" + (f"/{num_windows}" if num_windows else ""), f"step {step}/{self._total}"]
    parts += [f"{k} {v:.4g}" for k, v in values.items()]
    parts += [f"{rate:.2f} steps/s" if rate == rate else "compiling", f"ETA {_duration(eta)}"]
    return " | ".join(parts)

  def history(self) -> list[dict]:
    if not os.path.exists(self.history_path):
      return []
    with open(self.history_path) as f:
      return [json.loads(line) for line in f if line.strip()]

  def finish(self, summary: Mapping[str, object], title: str = "OAPL run summary") -> dict[str, str]:
    """Writes learning_curve.png and summary.{json,md} (headed `title`; the md adds the wall time, the switches
    in use and the run's config.yaml); returns their paths (tensorboard: None where no events were written)."""
    self.writer.flush()
    paths = {"tensorboard": None if isinstance(self.writer, event_writers.NoEvents) else self.workdir,
             "curve": os.path.join(self.workdir, "learning_curve.png"),
             "summary": os.path.join(self.workdir, "summary.md")}
    if not self.is_main:
      return paths
    plot_learning_curve(self.history(), paths["curve"])
    wall, loop_wall = time.perf_counter() - self._start, self.phases.elapsed()
    with open(os.path.join(self.workdir, "summary.json"), "w") as f:
      json.dump({**summary, "wall_seconds": round(wall, 1), "loop_seconds": loop_wall,
                 "phase_seconds": self.phases.phases(), "compile_seconds": self.phases.compile_seconds()}, f,
                indent=2, default=float)
    with open(paths["summary"], "w") as f:
      f.write(f"# {title}\n\n")
      for key, value in summary.items():
        f.write(f"- **{key}**: {value:.4g}\n" if isinstance(value, float) else f"- **{key}**: {value}\n")
      if self.phases.phases():
        f.write(self.phases.markdown(loop_wall))
      f.write(f"\n## The run\n\n- **wall time**: {_duration(wall)} (this process, from set-up to the end)\n")
      f.write(config_section(self.workdir, self.switches))
    return paths

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
    self.writer.close()


def config_section(workdir: str, switches: Mapping[str, str]) -> str:
  """summary.md's lines on the run's config (run_dir.record_config's files): links, the switches, the whole
  config.yaml folded. Empty where no config was recorded."""
  if not os.path.exists(os.path.join(workdir, run_dir.CONFIG_JSON)):
    return ""
  links = ", ".join(f"[{name}]({name})" for name in (run_dir.CONFIG_JSON, run_dir.CONFIG_YAML))
  lines = [f"- **config**: {links}"]
  lines += [f"- **{key}**: {value}" for key, value in switches.items()]
  yaml_path = os.path.join(workdir, run_dir.CONFIG_YAML)
  if os.path.exists(yaml_path):
    with open(yaml_path) as f:
      lines += ["", "<details><summary>the whole config</summary>", "", "```yaml", f.read().rstrip(), "```", "",
                "</details>"]
  return "\n".join(lines) + "\n"


def redraws_in_place() -> bool:
  """Whether a progress bar redraws in place: stderr is a terminal, or this runs in a notebook's kernel."""
  if sys.stderr.isatty():
    return True
  ipython = sys.modules.get("IPython")
  shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
  return shell is not None and hasattr(shell, "kernel")


def _duration(seconds: float) -> str:
  if seconds != seconds:
    return "?"
  minutes, secs = divmod(int(round(seconds)), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _series(history: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  rows = [(h["step"], h[key]) for h in history if key in h]
  return (np.array([r[0] for r in rows]), np.array([r[1] for r in rows])) if rows else (np.array([]), np.array([]))


def plot_learning_curve(history: list[dict], path: str, eval_prefix: Optional[str] = None) -> None:
  """Held-out pass@k, training reward, loss and policy lag against trainer steps."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  keys = sorted({k for h in history for k in h})
  pass_keys = [k for k in keys if k.startswith("eval/") and "/pass@" in k]
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  for key in pass_keys:
    axes[0].plot(*_series(history, key), marker="o", label=key[len("eval/"):])
  axes[0].set(title="held-out pass@k (eval sampling)", xlabel="trainer step", ylim=(-0.02, 1.02))
  if pass_keys:
    axes[0].legend(fontsize=8)
  for key, label in (("rollout/reward_mean", "sampler reward (train prompts)"),):
    axes[1].plot(*_series(history, key), label=label)
  axes[1].set(title="training reward", xlabel="trainer step", ylim=(-0.02, 1.02))
  axes[1].legend(fontsize=8)
  steps, loss = _series(history, "train/loss")
  axes[2].plot(steps, loss, label="loss")
  axes[2].set(title="trainer loss", xlabel="trainer step", yscale="log" if (loss > 0).all() else "linear")
  twin = axes[2].twinx()
  twin.plot(*_series(history, "train/policy_lag"), color="gray", alpha=0.4, label="policy lag")
  twin.set_ylabel("policy lag (steps since refresh)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
