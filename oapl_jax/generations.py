"""Generations on disk: what the policy wrote, beside its reward, bounded in size.

  evals/<STEP>/<set>.jsonl            an eval's samples: the first eval.save_prompts prompts x all their samples
  rollouts/window_<k>.jsonl           a window's first eval.save_prompts training prompts x their G rollouts,
                                      with the loss's advantage where it has a closed form (advantages())

One JSON line per sample: prompt, answer (gold), sample (its index in the group), response (decoded up to and
including eos), reward, truncated (cut at max_new_tokens), detail (what the reward read, where the task offers
Task.reward_detail: e.g. arithmetic's answer before eos) and, for rollouts, advantage. `table` renders a few as
markdown (eval.md, TensorBoard's text panel); `read` and `show` serve `oapl-eval --show N`.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import numpy as np

from oapl_jax import objectives
from oapl_jax.sampler import api

TABLE_ROWS = 4  # samples in a markdown table
CELL_CHARS = 120  # a table cell's text is cut here


def records(task, problems: Sequence, groups, rewards_PxG: np.ndarray, prompts: int,
            advantages_PxG: Optional[np.ndarray] = None) -> list[dict[str, Any]]:
  """One record per sample of the first `prompts` problems (all their samples); [] when prompts is 0."""
  out = []
  for p in range(min(prompts, len(problems))):
    for g in range(groups.lengths.shape[1]):
      response = task.completion_text(groups.response_tokens[p, g, :groups.lengths[p, g]])
      record = {"prompt": problems[p].prompt, "answer": problems[p].answer, "sample": g, "response": response,
                "reward": float(rewards_PxG[p, g]),
                "truncated": bool(groups.finish_reason[p, g] == api.FINISH_LENGTH)}
      if task.reward_detail is not None:
        record["detail"] = task.reward_detail(response, problems[p].answer)
      if advantages_PxG is not None:
        record["advantage"] = float(advantages_PxG[p, g])
      out.append(record)
  return out


def advantages(loss: str, settings, rewards_PxG: np.ndarray) -> Optional[np.ndarray]:
  """The advantage each rollout enters the loss with, where it depends on rewards alone: OAPL's r - V̂*(x)
  (Eq. 2 at its beta1), GRPO's and M2PO's group-normalized reward; None for the others."""
  if loss == "oapl":
    return rewards_PxG - np.asarray(_V_STAR(rewards_PxG, settings.beta1))[:, None]
  if loss in ("grpo", "grpo_onpolicy", "m2po"):
    return np.asarray(_GRPO_ADVANTAGES(rewards_PxG))
  return None


# One program each (not one per eager op, ~0.5 s of compiling on the demo's start-up path)
_V_STAR = jax.jit(objectives.v_star)
_GRPO_ADVANTAGES = jax.jit(objectives.grpo_advantages)


def eval_path(workdir: str, step: int, set_name: str) -> str:
  return os.path.join(workdir, "evals", str(step), f"{set_name}.jsonl")


def rollouts_path(workdir: str, window: int) -> str:
  return os.path.join(workdir, "rollouts", f"window_{window}.jsonl")


def write(path: str, rows: Sequence[dict]) -> None:
  """The records as JSON lines (replacing the file: a resumed run's rerun eval writes the same step again)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def read(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


class Sink:
  """Where a run's generations go: files under `workdir` and, for evals, a table per set to `texts(step, {tag:
  markdown})` (reporting.Reporter.texts: TensorBoard's text panel). Only process 0 writes."""

  def __init__(self, workdir: str, texts: Optional[Callable[[int, Mapping[str, str]], None]] = None):
    self.workdir, self.texts = workdir, texts
    self.is_main = jax.process_index() == 0

  def eval(self, step: int, per_set: Mapping[str, Sequence[dict]], prefix: str = "") -> None:
    """Each set's records to evals/<step>/<prefix><set>.jsonl and a table of a few to the text panel."""
    per_set = {name: rows for name, rows in per_set.items() if rows}
    if not self.is_main or not per_set:
      return
    for name, rows in per_set.items():
      write(eval_path(self.workdir, step, prefix + name), rows)
    if self.texts is not None:
      self.texts(step, {f"generations/{prefix}{name}": table(rows) for name, rows in per_set.items()})

  def rollouts(self, window: int, rows: Sequence[dict]) -> None:
    if self.is_main and rows:
      write(rollouts_path(self.workdir, window), rows)


def _cell(text: str) -> str:
  text = " ".join(str(text).split()).replace("|", "\\|")
  return text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 1] + "…"


def spread(rows: Sequence[dict], n: int) -> list[dict]:
  """n records over as many prompts as there are: every prompt's first sample, then their second, ..."""
  return sorted(rows, key=lambda r: r.get("sample", 0))[:n]  # stable: prompts stay in order


def table(rows: Sequence[dict], n: int = TABLE_ROWS) -> str:
  """n records (`spread`) as a markdown table (prompt, response, reward, detail where recorded)."""
  rows = spread(rows, n)
  with_detail = any("detail" in r for r in rows)
  head = ["prompt", "response", "reward"] + (["detail"] if with_detail else [])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [_cell(r["prompt"]), _cell(r["response"]), f"{r['reward']:.3g}"]
    lines.append("| " + " | ".join(cells + ([_cell(r.get("detail", ""))] if with_detail else [])) + " |")
  return "\n".join(lines)


def show(rows: Sequence[dict], n: int) -> str:
  """n records (`spread`) as plain text, one block each (oapl-eval --show)."""
  blocks = []
  for r in spread(rows, n):
    extra = "".join(f"; {k}: {r[k]}" for k in ("detail", "advantage") if k in r)
    blocks.append(f"prompt: {r['prompt']!r}\nresponse (sample {r['sample']}): {r['response']!r}\n"
                  f"reward {r['reward']:.3g}{' (truncated)' if r.get('truncated') else ''}{extra}")
  return "\n\n".join(blocks)
