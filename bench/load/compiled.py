"""The compiled open loop for HTTP servers: poisson-http (bench/load/poisson_http.c), built on first use.

It offers a rate to an `HttpTarget` as `offered.offer` does (Poisson arrivals, every call timed from its scheduled
send, a deadline on every call, at most MAX_OUTSTANDING in flight) with the same prepared requests, and every answer
is checked: the generator keeps each request's distinct answer bodies, which are decoded and compared here with the
target's expected outputs. What came of it is an `OfferedResult`, like the Python loop's, with the generator's own CPU.
"""

from __future__ import annotations

import resource
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from bench.load.http import IDLE_REUSE_S, HttpTarget
from bench.load.offered import MAX_OUTSTANDING, REFUSED, OfferedResult
from bench.load.stats import percentiles

SOURCE = Path(__file__).with_name("poisson_http.c")
BINARY = Path(__file__).resolve().parents[2] / "build" / "poisson-http"
COMPILE = ("gcc", "-O2", "-Wall", "-Wextra", "-Werror")
# poisson-http's own outcomes (its --help), as the Python loop names them (aiohttp's errors) where it has a name.
OUTCOMES = {-2: "TimeoutError", -3: "ClientConnectionError", -4: "not an HTTP answer"}
NOT_SENT = -1


class GeneratorError(RuntimeError):
    """poisson-http could not be built or failed."""


def build() -> Path:
    """The generator's binary, compiled when missing or older than its source."""
    if BINARY.exists() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BINARY
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([*COMPILE, "-o", str(BINARY), str(SOURCE), "-lm"], capture_output=True, text=True)
    if done.returncode:
        raise GeneratorError(f"gcc failed on {SOURCE}: {done.stderr.strip()}")
    return BINARY


def request_bytes(host: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """One whole HTTP/1.1 POST, as the generator sends it."""
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items())]
    head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass(frozen=True)
class Calls:
    """poisson-http's lines: per call its request, times (us from the schedule's start; -1: never), status, variant."""

    request: np.ndarray
    scheduled: np.ndarray
    sent: np.ndarray
    done: np.ndarray
    status: np.ndarray
    variant: np.ndarray

    @classmethod
    def read(cls, path: Path) -> Calls:
        table = np.loadtxt(path, dtype=np.int64, ndmin=2).reshape(-1, 6)
        return cls(*table.T)


def tally(calls: Calls, right: dict[tuple[int, int], bool], result: OfferedResult) -> None:
    """Sort the calls into `result` (counts, latency and lag), a 200 counted only when its body variant was `right`."""
    result.scheduled = len(calls.status)
    answered = np.zeros(len(calls.status), dtype=bool)
    for index, (status, request, variant) in enumerate(zip(calls.status, calls.request, calls.variant, strict=True)):
        if status == NOT_SENT:
            result.generator_refused += 1
        elif status == 200 and right.get((int(request), int(variant)), False):
            answered[index] = True
        elif status == 200:
            result.wrong += 1
        elif str(status) in REFUSED:
            result.refused += 1
        elif OUTCOMES.get(int(status)) == "TimeoutError":
            result.timed_out += 1
        else:
            label = OUTCOMES.get(int(status), str(status))
            result.other_errors[label] = result.other_errors.get(label, 0) + 1
    result.answered = int(answered.sum())
    latency_ms = (calls.done[answered] - calls.scheduled[answered]) / 1000.0
    result.p50_ms, result.p99_ms = percentiles(latency_ms, [50, 99])
    sent = calls.sent >= 0
    result.lag_p99_ms, result.lag_max_ms = percentiles((calls.sent[sent] - calls.scheduled[sent]) / 1000.0, [99, 100],
                                                       empty=0.0)  # fmt: skip


def offer_http(
    target: HttpTarget, rate: float, seconds: float, *, seed: int = 0, max_outstanding: int = MAX_OUTSTANDING
) -> tuple[OfferedResult, float]:
    """Offer `rate` calls a second to `target` for `seconds` with poisson-http; the result and the generator's CPU.

    CPU: its CPU seconds per second of the run (1.0 = one core). Every answer is checked when the target has
    expected outputs; without them every 200 counts as answered.
    """
    binary = build()
    where = urlsplit(target.endpoint)
    if where.hostname is None or where.port is None:
        raise GeneratorError(f"no host and port in {target.endpoint}")
    with tempfile.TemporaryDirectory(prefix="poisson-http-") as folder:
        work = Path(folder)
        (work / "bodies").mkdir()
        files = []
        for index, (body, headers) in enumerate(target.requests):
            file = work / f"request-{index}.http"
            file.write_bytes(request_bytes(where.netloc, where.path, body, headers))
            files.append(str(file))
        command = [str(binary), "--host", where.hostname, "--port", str(where.port), "--rate", f"{rate:.6f}",
                   "--seconds", str(seconds), "--seed", str(seed), "--max-connections", str(max_outstanding),
                   "--deadline-ms", str(target.timeout_s * 1000), "--idle-reuse-ms", str(IDLE_REUSE_S * 1000),
                   "--out", str(work / "calls.tsv"), "--bodies", str(work / "bodies"), *files]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        # Bounded: the schedule spans `seconds`, every call ends by its deadline; the margin is against a hang.
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + target.timeout_s + 30)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode:
            raise GeneratorError(f"poisson-http exited {done.returncode}: {done.stderr.strip()}")
        calls = Calls.read(work / "calls.tsv")
        right = {key: _right(target, path, key[0]) for path in (work / "bodies").iterdir() if (key := _key(path))}
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    result = OfferedResult(target.name, target.model, rate, seconds)
    tally(calls, right, result)
    return result, cpu / seconds


def _key(path: Path) -> tuple[int, int] | None:
    """(request, variant) of a body file r<request>-v<variant>.body."""
    stem = path.name.removesuffix(".body")
    request, _, variant = stem.partition("-v")
    return (int(request[1:]), int(variant)) if request.startswith("r") and variant.isdigit() else None


def _right(target: HttpTarget, path: Path, request: int) -> bool:
    if target.expected is None:
        return True
    return target.matches(path.read_bytes(), target.expected[request])
