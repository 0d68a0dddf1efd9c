"""serve_hostile_bench's pure pieces: nearest-rank percentiles, the rows and their ratio to the quiet p99, and the
HTTP/2 bytes the slow sender writes. No server is started and nothing is timed here."""
from benchmarks import serve_hostile_bench as bench


def test_nearest_rank_percentiles():
  values = [5, 1, 4, 2, 3, 10, 9, 8, 7, 6]
  assert bench.percentile(values, 50) == 5  # ceil(0.5 * 10) = 5th smallest
  assert bench.percentile(values, 90) == 9
  assert bench.percentile(values, 99) == 10  # ceil(9.9) = 10th
  assert bench.percentile([7.0], 99) == 7.0
  assert bench.percentile([], 50) is None


def test_valid_rows_are_in_ms_and_their_p99_against_the_quiet_one():
  quiet = bench.valid_row("quiet", [0.010, 0.020, 0.040], [], 0)
  assert (quiet["p50_ms"], quiet["p99_ms"], quiet["p99_vs_quiet"]) == (20.0, 40.0, 1.0)
  loud = bench.valid_row("garbage", [0.030, 0.100], ["UNAVAILABLE", "UNAVAILABLE"], 3, quiet_p99_ms=40.0)
  assert (loud["requests"], loud["errors"], loud["error_codes"], loud["tracebacks"]) == (2, 2, {"UNAVAILABLE": 2}, 3)
  assert loud["p99_vs_quiet"] == 2.5
  assert bench.valid_row("all", [], ["DEADLINE_EXCEEDED"], 0, quiet_p99_ms=40.0)["p99_vs_quiet"] is None


def test_hostile_rows_count_what_came_back():
  row = bench.hostile_row("all", "garbage", [("INVALID_ARGUMENT", 0.002), ("UNKNOWN", 0.004), ("UNKNOWN", 0.5)])
  assert row["answers"] == {"INVALID_ARGUMENT": 1, "UNKNOWN": 2}
  assert (row["requests"], row["p50_ms"], row["max_ms"]) == (3, 4.0, 500.0)


def test_http2_frames_and_headers():
  # 3-byte length, type, flags, 4-byte stream id, payload (RFC 9113 section 4.1)
  assert bench._frame(bench.SETTINGS, bench.ACK, 0) == b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
  assert bench._frame(bench.DATA, 0, 1, b"ab") == b"\x00\x00\x02\x00\x00\x00\x00\x00\x01ab"
  block = bench._decode_headers("h:1")
  assert block.startswith(b"\x00\x07:method\x04POST\x00\x07:scheme\x04http\x00\x05:path\x24" + bench.DECODE_PATH.encode())
  assert block.endswith(b"\x00\x0a:authority\x03h:1\x00\x0ccontent-type\x10application/grpc\x00\x02te\x08trailers")
