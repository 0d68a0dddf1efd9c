"""Prompt sources, templates, reward functions and verifiers.

  base           Problem, Tokenizer, RewardResult, Task (the interface the loop uses)
  arithmetic     the synthetic CPU task with its own character tokenizer
  sources        problem/answer records from JSONL, Parquet or TFDS
  templates      chat templating through a local Hugging Face tokenizer
  rewards        exact match; math_verify and import-path rewards in worker processes, timed; guards, make_reward
  math_verifier  the math_verify call that MathReward runs in its workers
"""
