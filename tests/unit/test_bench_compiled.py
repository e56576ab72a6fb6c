"""The compiled open loop's pure parts: the requests it sends and how its lines become an OfferedResult."""

from __future__ import annotations

import math

import numpy as np

from bench.load.compiled import Calls, _key, request_bytes, tally
from bench.load.offered import OfferedResult


def test_a_request_is_a_whole_http_post_with_its_length():
    raw = request_bytes("127.0.0.1:8080", "/predict", b"\x00\x01", {"x-shape": "1,2"})
    head, body = raw.split(b"\r\n\r\n")
    assert head.split(b"\r\n") == [b"POST /predict HTTP/1.1", b"Host: 127.0.0.1:8080", b"x-shape: 1,2",
                                   b"Content-Length: 2"]  # fmt: skip
    assert body == b"\x00\x01"


def test_body_files_name_their_request_and_variant(tmp_path):
    assert _key(tmp_path / "r12-v3.body") == (12, 3)
    assert _key(tmp_path / "calls.tsv") is None


def calls(*rows: tuple[int, int, int, int, int, int]) -> Calls:
    return Calls(*np.array(rows, dtype=np.int64).T)


def test_each_outcome_is_counted_as_the_python_loop_counts_it(tmp_path):
    lines = calls(
        (0, 0, 100, 5_000, 200, 0),  # right: 5 ms from its schedule
        (1, 1_000, 1_200, 16_000, 200, 0),  # right: 15 ms, sent 0.2 ms late
        (0, 2_000, 2_000, 3_000, 200, 1),  # a body unlike in-process ONNX Runtime
        (1, 3_000, 3_000, 4_000, 503, 1),  # refused
        (0, 4_000, 4_000, 9_000, -2, -1),  # past its deadline
        (1, 5_000, 5_000, 6_000, -3, -1),  # connection reset
        (0, 6_000, -1, -1, -1, -1),  # not sent: every connection busy
        (1, 7_000, 7_000, 8_000, 500, 2),
    )
    path = tmp_path / "calls.tsv"
    np.savetxt(path, np.column_stack([lines.request, lines.scheduled, lines.sent, lines.done, lines.status,
                                      lines.variant]), fmt="%d", delimiter="\t")  # fmt: skip
    read = Calls.read(path)
    result = OfferedResult("fastapi", "m", 100.0, 1.0)
    tally(read, {(0, 0): True, (1, 0): True, (0, 1): False}, result)
    assert (result.scheduled, result.answered, result.wrong, result.refused, result.timed_out) == (8, 2, 1, 1, 1)
    assert result.generator_refused == 1 and result.other_errors == {"ClientConnectionError": 1, "500": 1}
    assert result.p50_ms == 10.0 and math.isclose(result.p99_ms, 14.9)
    assert result.lag_max_ms == 0.2


def test_one_line_is_still_a_table(tmp_path):
    path = tmp_path / "calls.tsv"
    path.write_text("0\t10\t10\t20\t200\t0\n")
    assert Calls.read(path).status.tolist() == [200]
