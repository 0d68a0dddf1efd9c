"""Math answer equivalence with math_verify (sympy).

math_verify times itself out with SIGALRM: call `score` only in the main thread of a
process. `rewards.MathReward` runs it in worker processes.
"""
from math_verify import parse, verify


def score(completion: str, answer: str, timeout_s: int = 5) -> float:
  """1.0 iff the completion's final (preferably \\boxed{}) answer equals the gold answer."""
  gold = parse(answer if "\\boxed" in answer else f"\\boxed{{{answer}}}",
               parsing_timeout=timeout_s)
  if not gold:  # a data problem, not a wrong answer: let it count as a failure
    raise ValueError(f"cannot parse gold answer {answer!r}")
  pred = parse(completion, parsing_timeout=timeout_s)
  return float(verify(gold, pred, timeout_seconds=timeout_s))
