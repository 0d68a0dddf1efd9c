"""The sort_letters reward: a user's own, reached by import path from configs/own_task.py.

It reads the prompt's source record (any fields the JSONL line has), not a gold answer string."""


def score(record: dict, response: str) -> float:
  """1.0 iff the response is the record's letters in alphabetical order."""
  return float(response == "".join(sorted(record["letters"])))
