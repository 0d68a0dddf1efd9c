"""Prompt sources, templates, reward functions and verifiers; tasks come by name (factory) or import path.

  base            Problem, Tokenizer, RewardResult, Task (the interface the loop uses)
  factory         the registry: task.name -> its section's typed settings, builder and pre-compute check
  arithmetic      the synthetic CPU task ("37+58=" -> "95<eos>")
  chain_task      a synthetic task whose answer is a running sum written out step by step
  code_task       code tasks (synthetic, or records with tests) graded by running the answer's code
  records_task    your own task from a config and data files alone (run/config_base.records_task)
  char_tokenizer  the synthetic tasks' character tokenizer; synthetic_draw their distinct problems per split
  sources         problem/answer records from JSONL, Parquet or TFDS
  templates       chat templating through a local Hugging Face tokenizer
  problem_checks  checks of problem sets before compute (empty, oversized, duplicates, token ids), the
                  `validation` section
  rewards         exact match; math_verify and import-path rewards in worker processes, timed; guards, make_reward
  math_verifier   the math_verify call that MathReward runs in its workers
  reward_worker   a reward worker's containment: its process group killed, its prints bounded, its memory capped
  code_reward     the code-execution reward; sandbox, sandbox_pool, sandbox_launcher run the programs locked down;
                  output_match compares a program's output with the expected one
"""
