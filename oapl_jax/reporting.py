"""Metrics out of a run: clu writers (TensorBoard + console), progress with ETA, a JSONL history,
and at the end a PNG learning curve and a short summary. Only process 0 writes files."""
import json
import os
import time
from typing import Mapping, Optional

import jax
import numpy as np
from clu import metric_writers, periodic_actions


class Reporter:

  def __init__(self, workdir: str, total_steps: int):
    self.workdir = os.path.abspath(workdir)
    self.is_main = jax.process_index() == 0
    os.makedirs(self.workdir, exist_ok=True)
    self.writer = metric_writers.create_default_writer(self.workdir, just_logging=not self.is_main)
    self.progress = periodic_actions.ReportProgress(num_train_steps=total_steps, writer=self.writer,
                                                    every_secs=None, every_steps=max(1, total_steps // 20))
    self.history_path = os.path.join(self.workdir, "metrics.jsonl")
    self._start = time.perf_counter()
    self._total = total_steps

  def scalars(self, step: int, metrics: Mapping[str, float]) -> None:
    metrics = {k: float(v) for k, v in metrics.items()}
    self.writer.write_scalars(step, metrics)
    if self.is_main:
      with open(self.history_path, "a") as f:
        f.write(json.dumps({"step": step, **metrics}) + "\n")

  def tick(self, step: int) -> None:
    """Progress: steps/s and ETA into the writer (periodically) and a one-line console status."""
    self.progress(step)

  def eta_line(self, step: int, done_steps_this_run: int) -> str:
    elapsed = time.perf_counter() - self._start
    rate = done_steps_this_run / elapsed if elapsed > 0 and done_steps_this_run else float("nan")
    eta = (self._total - step) / rate if rate == rate and rate > 0 else float("nan")
    return f"step {step}/{self._total} | {elapsed:.0f}s elapsed | ETA {eta:.0f}s"

  def history(self) -> list[dict]:
    if not os.path.exists(self.history_path):
      return []
    with open(self.history_path) as f:
      return [json.loads(line) for line in f if line.strip()]

  def finish(self, summary: Mapping[str, object]) -> dict[str, str]:
    """Writes learning_curve.png and summary.{json,md}; returns their paths."""
    self.writer.flush()
    paths = {"tensorboard": self.workdir, "curve": os.path.join(self.workdir, "learning_curve.png"),
             "summary": os.path.join(self.workdir, "summary.md")}
    if not self.is_main:
      return paths
    plot_learning_curve(self.history(), paths["curve"])
    with open(os.path.join(self.workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2, default=float)
    with open(paths["summary"], "w") as f:
      f.write("# OAPL run summary\n\n")
      for key, value in summary.items():
        f.write(f"- **{key}**: {value:.4g}\n" if isinstance(value, float) else f"- **{key}**: {value}\n")
    return paths

  def close(self) -> None:
    self.writer.close()


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
