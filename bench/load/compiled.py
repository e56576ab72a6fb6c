"""The compiled load generator, loadgen (bench/load/loadgen.c), built on first use: the goodput rounds' engine.

The Python loops share the cores with the servers they load and fall behind their own schedule at the small models'
rates, which puts the generator's lag into the server's latency. loadgen drives the same targets (Triton's KServe
`ModelInfer` and the facade's `Predict` over gRPC, the HTTP servers' POST) with the targets' own prepared requests,
in an open loop (`offer`: Poisson arrivals, every call timed from its scheduled send, at most MAX_OUTSTANDING in
flight) or a closed one (`keep`). Every answer is checked: the generator keeps each request's distinct answer
bodies, which are decoded and compared here with the target's expected outputs. Each result comes with the
generator's own CPU seconds (its rusage, not this process's).
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from bench.load.http import IDLE_REUSE_S, HttpTarget, _floats
from bench.load.loops import LoadResult
from bench.load.offered import MAX_OUTSTANDING, REFUSED, OfferedResult
from bench.load.stats import percentiles
from bench.load.targets import GrpcTarget, Target, close_enough

NAME = "loadgen"
SOURCE = Path(__file__).with_name("loadgen.c")
BINARY = Path(__file__).resolve().parents[2] / "build" / NAME
COMPILE = ("gcc", "-O2", "-Wall", "-Wextra", "-Werror")
LIBRARIES = ("-lnghttp2", "-lm")
NOT_SENT, WRONG = -1, -5  # WRONG: answered, unlike in-process ONNX Runtime (set here, after the check)
# loadgen's own outcomes (its --help), named as the Python loops name them where they have a name.
OUTCOMES = {-2: "TimeoutError", -3: "ConnectionError", -4: "not an answer of the protocol", WRONG: "wrong answer"}
GRPC_OK = 0
# gRPC's codes by number, for the statuses a server answers with (REFUSED, TIMED_OUT and the errors' labels).
GRPC_CODES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
    "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)  # fmt: skip
# gRPC calls spread over this many HTTP/2 connections, as a few clients' channels would be.
GRPC_CONNECTIONS = 4
HANG_MARGIN_S = 30.0  # past the schedule and the last call's deadline: the generator hangs, it is stopped


class GeneratorError(RuntimeError):
    """loadgen could not be built, or failed."""


def build() -> Path:
    """The generator's binary, compiled when missing or older than its source."""
    if BINARY.exists() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BINARY
    if not Path("/usr/include/nghttp2/nghttp2.h").exists():
        raise GeneratorError(f"{SOURCE.name} needs libnghttp2's headers: apt-get install libnghttp2-dev (make apt)")
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    # Built beside, then renamed: test workers that build at once never run a half-written binary.
    partial = BINARY.with_name(f"{NAME}.{os.getpid()}")
    done = subprocess.run([*COMPILE, "-o", str(partial), str(SOURCE), *LIBRARIES], capture_output=True, text=True)
    if done.returncode:
        raise GeneratorError(f"gcc failed on {SOURCE}: {done.stderr.strip()}")
    os.replace(partial, BINARY)
    return BINARY


def http_request(host: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """One whole HTTP/1.1 POST, as the generator sends it."""
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items())]
    head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass(frozen=True)
class Wire:
    """What loadgen sends to a target: where, over which protocol, and the request files' bytes."""

    host: str
    port: int
    grpc_path: str | None  # None: HTTP/1.1
    requests: list[bytes]

    def arguments(self) -> list[str]:
        grpc = ["--grpc", self.grpc_path, "--connections", str(GRPC_CONNECTIONS)] if self.grpc_path else []
        return ["--host", self.host, "--port", str(self.port), *grpc]


def wire(target: Target) -> Wire:
    """The target's prepared requests as loadgen sends them; a gRPC target must be open (its requests are built)."""
    if isinstance(target, GrpcTarget):
        if not target.payloads:
            raise GeneratorError(f"{target.name}: open the target first, its requests are built then")
        where = urlsplit(f"//{target.url}")
        if where.hostname is None or where.port is None:
            raise GeneratorError(f"no host and port in {target.url}")
        return Wire(where.hostname, where.port, target.method_path, list(target.payloads))
    if isinstance(target, HttpTarget):
        where = urlsplit(target.endpoint)
        if where.hostname is None or where.port is None:
            raise GeneratorError(f"no host and port in {target.endpoint}")
        requests = [http_request(where.netloc, where.path, body, headers) for body, headers in target.requests]
        return Wire(where.hostname, where.port, None, requests)
    raise GeneratorError(f"{type(target).__name__}: loadgen drives gRPC and HTTP targets only")


def right(target: Target, request: int, body: bytes) -> bool:
    """Whether an answer body to `request` is like in-process ONNX Runtime's (always, when nothing is expected)."""
    expected = getattr(target, "expected", None)
    if expected is None:
        return True
    try:
        values = target.output(body) if isinstance(target, GrpcTarget) else _floats(body)
    except Exception:  # noqa: BLE001 - a body that does not decode is a wrong answer
        return False
    return close_enough(values, expected[request])


@dataclass
class Calls:
    """loadgen's lines: per call its request, times (us from the start; -1: never), status and answer variant."""

    request: np.ndarray
    scheduled: np.ndarray
    sent: np.ndarray
    done: np.ndarray
    status: np.ndarray
    variant: np.ndarray
    cpu_s: float  # the generator's own CPU seconds, user and system
    grpc: bool

    def label(self, status: int) -> str:
        """A status as the Python loops name it: a gRPC code's name, an HTTP status, or the generator's outcome."""
        if status < 0:
            return OUTCOMES.get(status, str(status))
        if self.grpc:
            return GRPC_CODES[status] if status < len(GRPC_CODES) else str(status)
        return str(status)

    def ok(self) -> np.ndarray:
        return self.status == (GRPC_OK if self.grpc else 200)


def run(target: Target, seconds: float, *, rate: float = 0.0, concurrency: int = 0, seed: int = 0) -> Calls:
    """Run loadgen against an open `target` for `seconds`: Poisson arrivals at `rate`, or `concurrency` calls in flight.

    Every answer's distinct bodies are checked (`right`); a call answered unlike in-process ONNX Runtime gets the
    status WRONG.
    """
    binary = build()
    where = wire(target)
    mode = ["--rate", f"{rate:.6f}"] if rate > 0 else ["--concurrency", str(concurrency)]
    with tempfile.TemporaryDirectory(prefix="loadgen-") as folder:
        work = Path(folder)
        (work / "bodies").mkdir()
        files = []
        for index, data in enumerate(where.requests):
            (file := work / f"request-{index}").write_bytes(data)
            files.append(str(file))
        command = [str(binary), *where.arguments(), *mode, "--seconds", str(seconds), "--seed", str(seed),
                   "--max-outstanding", str(MAX_OUTSTANDING), "--deadline-ms", str(target.timeout_s * 1000),
                   "--idle-reuse-ms", str(IDLE_REUSE_S * 1000), "--out", str(work / "calls.tsv"),
                   "--bodies", str(work / "bodies"), *files]  # fmt: skip
        cpu_s, code, errors = _wait(command, work, seconds + target.timeout_s + HANG_MARGIN_S)
        if code:
            raise GeneratorError(f"{NAME} exited {code}: {errors}")
        lines = (work / "calls.tsv").read_text()  # empty when the schedule held no call (a low rate, briefly)
        table = (
            np.loadtxt(lines.splitlines(), dtype=np.int64, ndmin=2).reshape(-1, 6) if lines else np.empty((0, 6), int)
        )
        good = {
            key: right(target, key[0], path.read_bytes()) for path in (work / "bodies").iterdir() if (key := _key(path))
        }
    request, scheduled, sent, finished, status, variant = table.T
    calls = Calls(request, scheduled, sent, finished, status, variant, cpu_s, where.grpc_path is not None)
    ok = calls.ok()
    for index in np.flatnonzero(ok):
        if not good.get((int(calls.request[index]), int(calls.variant[index])), False):
            calls.status[index] = WRONG
    return calls


def _ahead_of_the_servers(pid: int) -> None:
    """The generator's process gets the lowest real-time priority, else a raised nice, where allowed.

    It shares the cores with the server it loads. Scheduled like the server's threads, it waits for a core behind
    them when they are busy and sends late: its lag, not the server's latency. Ahead of them it sends when due, as a
    generator on a machine of its own would; it blocks in epoll between calls, and its CPU is reported. Set from
    here once it is spawned: a `preexec_fn` would fork this process, whose gRPC threads' fork handlers can abort the
    child before it runs loadgen.
    """
    try:
        os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(1))
    except OSError:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, -10)


def priority() -> str:
    """How loadgen is scheduled here, for the reports."""
    if os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_RTPRIO)[0] not in (0,):
        return "real-time (SCHED_FIFO 1), ahead of the servers"
    return "a raised nice where allowed, else the servers' priority"


def _wait(command: list[str], work: Path, limit_s: float) -> tuple[float, int, str]:
    """Run `command` to its end (killed past `limit_s`): its CPU seconds, exit code and standard error."""
    with open(work / "stderr", "wb") as errors:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
        _ahead_of_the_servers(process.pid)
        timer = threading.Timer(limit_s, process.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, process.returncode, (work / "stderr").read_text().strip()


def _key(path: Path) -> tuple[int, int] | None:
    """(request, variant) of a body file r<request>-v<variant>.body."""
    request, _, variant = path.name.removesuffix(".body").partition("-v")
    return (int(request[1:]), int(variant)) if request.startswith("r") and variant.isdigit() else None


def offer(target: Target, rate: float, seconds: float, *, seed: int = 0) -> tuple[OfferedResult, float]:
    """Offer `rate` calls a second to an open `target` for `seconds`; what came of it and the generator's CPU s."""
    calls = run(target, seconds, rate=rate, seed=seed)
    result = OfferedResult(target.name, target.model, rate, seconds, scheduled=len(calls.status))
    answered = calls.ok()
    for status, count in zip(*np.unique(calls.status[~answered], return_counts=True), strict=True):
        label, count = calls.label(int(status)), int(count)
        if status == NOT_SENT:
            result.generator_refused += count
        elif status == WRONG:
            result.wrong += count
        elif label in REFUSED:
            result.refused += count
        elif label in ("TimeoutError", "DEADLINE_EXCEEDED"):
            result.timed_out += count
        else:
            result.other_errors[label] = count
    result.answered = int(answered.sum())
    result.p50_ms, result.p99_ms = percentiles((calls.done - calls.scheduled)[answered] / 1000.0, [50, 99])
    sent = calls.sent >= 0
    result.lag_p99_ms, result.lag_max_ms = percentiles((calls.sent - calls.scheduled)[sent] / 1000.0, [99, 100], 0.0)
    return result, calls.cpu_s


def keep(target: Target, concurrency: int, seconds: float, warmup_s: float = 1.0) -> LoadResult:
    """`concurrency` calls in flight against an open `target` for a warm-up, then `seconds`, as `loops.run_load`.

    A call belongs to the measured window if it was sent after the warm-up; `client_cpu` is the generator's CPU
    seconds per wall second over the whole run.
    """
    calls = run(target, warmup_s + seconds, concurrency=concurrency)
    window = calls.sent >= warmup_s * 1e6
    ok = calls.ok() & window
    latency_ms = (calls.done - calls.sent)[ok] / 1000.0
    p50, p95, p99 = percentiles(latency_ms, [50, 95, 99])
    errors: dict[str, int] = {}
    for status in calls.status[window & ~ok]:
        errors[calls.label(int(status))] = errors.get(calls.label(int(status)), 0) + 1
    measured = max((calls.done[window].max(initial=0) / 1e6) - warmup_s, 1e-9) if window.any() else seconds
    requests = int(ok.sum())
    return LoadResult(
        target.name, target.model, target.batch, concurrency, requests, errors, measured, requests / measured,
        requests * target.batch / measured, p50, p95, p99, calls.cpu_s / (warmup_s + seconds),
        int((~window).sum()),
    )  # fmt: skip
