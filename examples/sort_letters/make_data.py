"""Writes the sort_letters JSONL files (already committed; re-running gives the same files).

  python examples/sort_letters/make_data.py

train.jsonl / dev.jsonl / test.jsonl: {"prompt": "sort:dcab=", "letters": "dcab"}, disjoint splits.
demos.jsonl: {"prompt", "completion"} from an imperfect teacher that swaps the last two letters of 60% of
its answers, so the warm-started model starts with a habit for RL to unlearn.
"""
import itertools
import json
import os
import random

LETTERS, LENGTH, SLIP_RATE = "abcdefgh", 4, 0.6
HERE = os.path.dirname(os.path.abspath(__file__))


def write(name: str, rows: list[dict]) -> None:
  with open(os.path.join(HERE, name), "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)


def main() -> None:
  rng = random.Random(0)
  words = ["".join(p) for p in itertools.product(LETTERS, repeat=LENGTH)]
  rng.shuffle(words)
  splits = {"train.jsonl": words[:2000], "dev.jsonl": words[2000:2200], "test.jsonl": words[2200:2400]}
  for name, split in splits.items():
    write(name, [{"prompt": f"sort:{w}=", "letters": w} for w in split])
  demos = []
  for w in splits["train.jsonl"][:1000]:
    answer = "".join(sorted(w))
    if rng.random() < SLIP_RATE:
      answer = answer[:-2] + answer[-1] + answer[-2]
    demos.append({"prompt": f"sort:{w}=", "completion": answer})
  write("demos.jsonl", demos)


if __name__ == "__main__":
  main()
