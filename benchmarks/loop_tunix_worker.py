"""Tunix's whole GRPO loop on loop_bench's task, in the Tunix venv (benchmarks/loop_bench.py runs it).

    benchmarks/.tunix_venv/bin/python -m benchmarks.loop_tunix_worker --checkpoint WS --data data.json \
        --lr 1e-4 --seed 0 --steps 120 --eval_every 10 --out curve.json

Tunix 0.1.7's RLCluster (vanilla rollout; actor, reference and rollout on one 1x1 mesh, so the rollout shares the
actor's weights and Tunix runs sampling and training one after the other) and GRPOLearner with GRPOConfig(
num_generations=G), its defaults otherwise (beta 0.04 with a reference model, epsilon 0.2, one iteration). The
model is loaded by Tunix's safetensors loader (tunix_worker.tunix_model), the tokenizer is the exported
tokenizer.json (transformers' PreTrainedTokenizerFast). AdamW and clipping as our run's trainer.optim.

The eval runs where the learner asks for its next batch (after the previous step's update): the held-out prompts,
`samples` each, through the cluster's own rollout in EVAL mode at the eval settings; pass@1 = mean correctness.
Its time is recorded apart. Reward: 1 iff the decoded completion is the answer. Tunix cuts the completion at the
eos (the text holds no eos), and every answer is shorter than the token budget, so a completion equal to the
answer stopped there: the same as our `arithmetic.score` (the answer followed by eos).
Writes JSON: the eval curve (step, loop seconds, eval seconds so far, pass@1, generations so far) and the seconds
per phase (sampling, reference log-probs, scoring, train step, eval).
"""
import argparse
import json
import time
import warnings

import numpy as np

from benchmarks import tunix_worker


class Clock:
  """Seconds per phase since `start`, and a wrapper that times a bound method under a phase."""

  def __init__(self):
    self.seconds, self.start = {}, time.perf_counter()

  def add(self, phase, seconds):
    self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

  def wrap(self, fn, phase):
    def timed(*args, **kwargs):
      t = time.perf_counter()
      try:
        return fn(*args, **kwargs)
      finally:
        self.add(phase, time.perf_counter() - t)
    return timed


def exact_match(prompts, completions, answer, **_):
  return [float(c.strip() == a) for c, a in zip(completions, answer)]


def build(args, data):
  import optax
  import transformers
  from tunix.rl import rl_cluster as rl_cluster_lib
  from tunix.rl.grpo import grpo_learner
  from tunix.rl.rollout import base_rollout
  model, _, mesh = tunix_worker.tunix_model(args.checkpoint)
  reference, _, _ = tunix_worker.tunix_model(args.checkpoint)
  tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(args.checkpoint)
  o, s, e = data["optim"], data["sampling"], data["eval"]
  optimizer = optax.chain(optax.clip_by_global_norm(o["max_grad_norm"]),
                          optax.adamw(args.lr, b1=o["b1"], b2=o["b2"], weight_decay=o["weight_decay"]))
  cache = s["max_prompt_length"] + max(s["max_new_tokens"], e["max_new_tokens"])
  rollout = lambda temperature, top_p, new: base_rollout.RolloutConfig(  # noqa: E731
      max_tokens_to_generate=new, temperature=temperature, top_p=top_p, max_prompt_length=s["max_prompt_length"],
      kv_cache_size=cache, seed=args.seed)
  Mode, Role = rl_cluster_lib.Mode, rl_cluster_lib.Role
  config = rl_cluster_lib.ClusterConfig(
      role_to_mesh={Role.ACTOR: mesh, Role.REFERENCE: mesh, Role.ROLLOUT: mesh}, rollout_engine="vanilla",
      training_config=rl_cluster_lib.RLTrainingConfig(actor_optimizer=optimizer, eval_every_n_steps=10**9,
                                                      max_steps=args.steps),
      rollout_config={Mode.TRAIN: rollout(s["temperature"], s["top_p"], s["max_new_tokens"]),
                      Mode.EVAL: rollout(e["temperature"], e["top_p"], e["max_new_tokens"])})
  with mesh:
    cluster = rl_cluster_lib.RLCluster(actor=model, reference=reference, tokenizer=tokenizer, cluster_config=config)
    learner = grpo_learner.GRPOLearner(cluster, grpo_learner.GRPOConfig(num_generations=args.group_size),
                                       reward_fns=[exact_match])
  return learner, mesh, Mode


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--checkpoint", required=True, help="the warm start, an HF directory with tokenizer.json")
  ap.add_argument("--data", required=True, help="loop_bench's data.json: prompts, answers, settings")
  ap.add_argument("--lr", type=float, required=True)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--steps", type=int, default=120)
  ap.add_argument("--eval_every", type=int, default=10)
  ap.add_argument("--batch_prompts", type=int, default=16)
  ap.add_argument("--group_size", type=int, default=8)
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  warnings.filterwarnings("ignore", category=DeprecationWarning)
  with open(args.data) as f:
    data = json.load(f)
  learner, mesh, Mode = build(args, data)
  cluster, clock, curve = learner.rl_cluster, Clock(), []
  import jax  # pylint: disable=import-outside-toplevel
  jax.monitoring.register_event_duration_secs_listener(  # as our PhaseClock counts it: part of the phases
      lambda event, seconds, **_: clock.add("compiling (part of the phases)", seconds)
      if event.startswith("/jax/core/compile/") and event.endswith("_duration") else None)
  counts = {"generations": 0, "generated": 0, "trained": 0}
  generate = cluster.generate
  held = data["held_out"]
  samples = data["eval"]["samples"]

  def evaluate(step):
    t = time.perf_counter()
    with mesh:
      out = generate([p["prompt"] for p in held for _ in range(samples)], mode=Mode.EVAL)
    answers = [p["answer"] for p in held for _ in range(samples)]
    pass1 = float(np.mean(exact_match(None, out.text, answers)))
    clock.add("eval", time.perf_counter() - t)
    curve.append({"step": step, "loop_seconds": time.perf_counter() - clock.start,
                  "eval_seconds": clock.seconds["eval"], "pass@1": pass1, "generations": counts["generations"]})
    print(json.dumps(curve[-1]), flush=True)

  budget = data["sampling"]["max_new_tokens"]

  def count_tokens(fn):
    """Generations and tokens: the eos a finished completion sampled counts as generated (ours counts it too), not
    as trained (Tunix's completion mask stops before it)."""
    def counted(*a, **k):
      out = fn(*a, **k)
      counts["generations"] += len(out.tokens)
      counts["trained"] += sum(len(t) for t in out.tokens)
      counts["generated"] += sum(len(t) + (len(t) < budget) for t in out.tokens)
      return out
    return counted

  cluster.generate = clock.wrap(count_tokens(generate), "sampling")
  cluster.get_ref_per_token_logps = clock.wrap(cluster.get_ref_per_token_logps, "reference log-probs")
  learner._compute_rewards = clock.wrap(learner._compute_rewards, "scoring")  # pylint: disable=protected-access
  cluster.update_actor = clock.wrap(cluster.update_actor, "train step")
  train = data["train"]
  order = np.random.default_rng(args.seed).permutation(len(train))

  def batches():
    for k in range(args.steps):
      if k % args.eval_every == 0:
        evaluate(k)
      picks = [train[i] for i in np.take(order, range(k * args.batch_prompts, (k + 1) * args.batch_prompts),
                                          mode="wrap")]
      yield {k: np.array([p[f] for p in picks]) for k, f in (("prompts", "prompt"), ("answer", "answer"))}  # arrays:
      # Tunix repeats each field G times with jax.tree.map, which would reach inside a list

  clock.start = time.perf_counter()
  with mesh:
    learner.train(batches())
  evaluate(args.steps)
  with open(args.out, "w") as f:
    json.dump({"curve": curve, "phases": clock.seconds, "loop_seconds": time.perf_counter() - clock.start,
               "tokens": counts,
               "peak_rss_gb": tunix_worker.peak_rss_gb()}, f, indent=2)


if __name__ == "__main__":
  main()
