"""poisson-http (bench/load/poisson_http.c) against real HTTP servers: a test server and the FastAPI baseline.

The test server answers each float32 body doubled, in the ways servers do: a Content-Length body, a chunked one, a
closed connection after each answer, a 503 refusal, an answer slower than the deadline, a wrong answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from bench.load.compiled import offer_http
from bench.load.http import HttpTarget

pytestmark = pytest.mark.timeout(120)
# /slow's answers: longer than any schedule here, so that a connection it holds is busy to the schedule's end.
SLOW_S = 1.0


class Doubling(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        answer = (np.frombuffer(body, "<f4") * (1 if self.path == "/wrong" else 2)).astype("<f4").tobytes()
        if self.path == "/busy":
            self.send_response(503)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"busy")
            return
        if self.path == "/slow":
            time.sleep(SLOW_S)
        self.send_response(200)
        if self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            middle = len(answer) // 2
            for chunk in (answer[:middle], answer[middle:]):
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(answer)))
        if self.path == "/close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Doubling)  # port 0: the kernel picks a free one
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def target(url: str, path: str, timeout_s: float = 2.0) -> HttpTarget:
    rng = np.random.default_rng(0)
    requests = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(3)]
    return HttpTarget(url, 1, path=path, images=requests, expected=[(r * 2).ravel() for r in requests],
                      timeout_s=timeout_s)  # fmt: skip


@pytest.mark.parametrize("path", ["/plain", "/chunked", "/close"])
def test_every_call_is_answered_and_checked_whatever_the_framing(url, path):
    result, cpu = offer_http(target(url, path), rate=200, seconds=1.0, seed=1)
    assert result.scheduled > 100 and result.answered == result.scheduled, result
    assert result.wrong == result.refused == result.timed_out == 0 and not result.other_errors
    assert 0 < result.p50_ms <= result.p99_ms and 0 <= result.lag_p99_ms <= result.lag_max_ms
    assert 0 < cpu < 2


def test_wrong_answers_are_counted_not_answered(url):
    result, _ = offer_http(target(url, "/wrong"), rate=100, seconds=0.5)
    assert result.answered == 0 and result.wrong == result.scheduled > 0


def test_refusals_and_deadlines_are_told_apart(url):
    busy, _ = offer_http(target(url, "/busy"), rate=100, seconds=0.5)
    assert busy.refused == busy.scheduled > 0 and busy.answered == 0
    slow, _ = offer_http(target(url, "/slow", timeout_s=0.1), rate=20, seconds=0.5)
    assert slow.timed_out == slow.scheduled > 0 and slow.answered == 0


def test_calls_over_the_connection_bound_are_not_sent(url):
    result, _ = offer_http(target(url, "/slow"), rate=100, seconds=0.5, max_outstanding=2)
    assert result.answered == 2 and result.generator_refused == result.scheduled - 2


def test_the_schedule_follows_the_seed(url):
    first, _ = offer_http(target(url, "/plain"), rate=300, seconds=0.5, seed=7)
    again, _ = offer_http(target(url, "/plain"), rate=300, seconds=0.5, seed=7)
    other, _ = offer_http(target(url, "/plain"), rate=300, seconds=0.5, seed=8)
    assert first.scheduled == again.scheduled != other.scheduled
