"""How a program's output is compared with the expected output, in the grader (outside every sandbox limit),
so its work is bounded by the expected output's size, however much the program printed (tasks/code_reward.py).

  stdout_matches(got, expected)                      stdin/stdout tests: LiveCodeBench's line and Decimal rule
  returned_matches(payload, expected, unwrap_single) function-call tests: the JSON return value
  stdout_budget, returned_budget                     the most of an output each reads (the sandbox hands back no more)
"""
from __future__ import annotations

import decimal
import json
from typing import Any


def _decimals(line: str) -> list[decimal.Decimal] | None:
  """The line's tokens as finite Decimals, or None (NaN would not compare, sNaN would raise)."""
  try:
    numbers = [decimal.Decimal(token) for token in line.split()]
  except decimal.InvalidOperation:
    return None
  return numbers if all(n.is_finite() for n in numbers) else None


# The grader's work on an output is bounded by the expected output's size, not by what a program prints:
# a stripped line may hold twice its expected line's bytes, 24 more per expected token (a number printed
# with more digits) and 32 more; the whole output that, a byte per line and 4096 more (blank lines, spaces).
_TOKEN_SLACK, _LINE_SLACK, _OUTPUT_SLACK = 24, 32, 4096


def _line_budget(line: str) -> int:
  return 2 * len(line.encode()) + _TOKEN_SLACK * len(line.split()) + _LINE_SLACK


def _expected_lines(expected: str) -> list[str]:
  return [line.strip() for line in expected.strip().split("\n")]


def stdout_budget(expected: str) -> int:
  """The most bytes of a program's output stdout_matches reads: a longer one fails unread."""
  budgets = [_line_budget(w) for w in _expected_lines(expected)]
  return sum(budgets) + len(budgets) + _OUTPUT_SLACK


def returned_budget(expected: Any) -> int:
  """The most bytes of a JSON return value returned_matches reads: a longer one fails unparsed."""
  return 3 * len(json.dumps(expected)) + 64


def stdout_matches(got: bytes | memoryview | str, expected: str) -> bool:
  """LiveCodeBench's rule: same number of stripped lines, each equal or equal as Decimal tokens. An output
  over its budget (above) fails unread, line counts are compared before any line is split, a line over its
  budget fails unparsed, and each line is parsed once."""
  if len(got) > stdout_budget(expected):
    return False
  want_lines = _expected_lines(expected)
  budgets = [_line_budget(w) for w in want_lines]
  text = (got if isinstance(got, str) else bytes(got).decode("utf-8", errors="replace")).strip()
  if text.count("\n") + 1 != len(want_lines):
    return False
  for g, w, budget in zip(text.split("\n"), want_lines, budgets):
    g = g.strip()
    if g == w:
      continue
    if len(g) > budget or len(g.split()) != len(w.split()):
      return False
    numbers = _decimals(g)
    if numbers is None or numbers != _decimals(w):
      return False
  return True


def returned_matches(payload: bytes | memoryview, expected: Any, unwrap_single: bool) -> bool:
  """Whether the JSON return value `payload` matches `expected` (return_matches); a payload over three times
  the expected value's JSON and 64 bytes fails unparsed, as does one that is not JSON."""
  if len(payload) > returned_budget(expected):
    return False
  try:
    return return_matches(json.loads(bytes(payload)), expected, unwrap_single)
  except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
    return False


def return_matches(got: Any, expected: Any, unwrap_single: bool) -> bool:
  return got == expected or (unwrap_single and isinstance(expected, list) and len(expected) == 1
                             and got == expected[0])
