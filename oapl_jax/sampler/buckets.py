"""The shapes the sampler compiles for: prompt lengths, batch sizes and cache lengths rounded up to a few buckets,
so a run compiles each program a handful of times, not once per request."""

MIN_PREFILL_BUCKET = 8
MIN_CACHE_BUCKET = 16


def prefill_bucket(length: int, max_prefill_length: int) -> int:
  """Powers of two (at least MIN_PREFILL_BUCKET), capped at max_prefill_length."""
  bucket = max(MIN_PREFILL_BUCKET, 1 << max(0, int(length) - 1).bit_length())
  return min(bucket, max_prefill_length)


def prefill_chunks(items: list, max_batch: int) -> list[list]:
  """`items` (prompts of one length bucket) in prefill calls of at most `max_batch` (0: one call)."""
  step = max_batch or len(items) or 1
  return [items[i:i + step] for i in range(0, len(items), step)]


def pow2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def cache_bucket(length: int, max_len: int) -> int:
  """Cache lengths a decode state grows through: 16, 24, 32, 48, 64, 96, ... (powers of two and
  1.5x them), capped at max_len. Attention costs what the cache holds, so a young batch runs on a
  short cache; two lengths per doubling bound the padding to a third, and the compiles to two."""
  p = pow2(max(length, MIN_CACHE_BUCKET))
  return min(p * 3 // 4 if MIN_CACHE_BUCKET < length <= p * 3 // 4 else p, int(max_len))
