"""What a stranger's attack does to everyone else: a probe of the facade and its memory, tagged by phase.

The probe's Predict has a connection of its own, so it never queues behind the attack's bytes in this process; the
kernel's high-water mark (VmHWM, reset when a phase starts) catches a peak between two samples. The memory guard
stops an attack before the kernel's OOM killer picks a process.
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psutil
from google.protobuf.message import DecodeError

from bench.attacks.calls import Metadata, channel
from bench.attacks.payloads import MODEL, PREDICT, valid_predict
from bench.usage import MIB, gone
from tritonnx.client.proto import inference_pb2

PROBE_INTERVAL_S = 0.5
PROBE_LIMIT_S = 2.0
RSS_INTERVAL_S = 0.05
KINDS = ("Predict", "/metrics")


@dataclass(frozen=True)
class Target:
    """A facade under watch: its addresses, its process and what its calls carry (a bearer token)."""

    grpc_url: str
    http_url: str
    pid: int
    metadata: Metadata = ()

    def alive(self) -> bool:
        return not gone(self.pid)


@dataclass(frozen=True)
class ProbeCall:
    phase: str
    kind: str  # one of KINDS
    seconds: float
    status: str  # OK, a gRPC status, an HTTP status, or the exception that ended the call


@dataclass(frozen=True)
class Sample:
    phase: str
    pid: int
    rss_mib: float


@dataclass
class ProbeSummary:
    calls: int = 0
    failed: int = 0
    slowest_ms: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / MIB


def _reset_high_water_mark(pid: int) -> None:
    with suppress(OSError):  # not allowed here: the samples alone give the peak
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # "5": reset the peak RSS to the current RSS


class Watch:
    """The probe and the memory sampler, running while the watch is entered; `enter` names the phase and facade."""

    def __init__(self, target: Target, rss_cap_mib: float, available_floor_mib: float) -> None:
        self.target, self.phase = target, "warm-up"
        self.rss_cap_mib, self.available_floor_mib = rss_cap_mib, available_floor_mib
        self.probes: list[ProbeCall] = []
        self.samples: list[Sample] = []
        self.guard = threading.Event()  # set by the memory guard: the attack running stops
        self.guarded: list[str] = []  # why the guard was set, per phase
        self._stop = threading.Event()
        # Priority 1, the documented way through a full facade: calls an attack holds can fill the slots of default
        # priority, and the probe asks whether others still get in.
        self._body = valid_predict(priority=1)
        self._channels: dict[str, grpc.Channel] = {}
        self._threads = [
            threading.Thread(target=self._every, args=(PROBE_INTERVAL_S, self._predict), daemon=True),
            threading.Thread(target=self._every, args=(PROBE_INTERVAL_S, self._metrics), daemon=True),
            threading.Thread(target=self._every, args=(RSS_INTERVAL_S, self._sample), daemon=True),
        ]

    def __enter__(self) -> Watch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(PROBE_LIMIT_S + 5)
        for chan in self._channels.values():
            chan.close()

    def enter(self, phase: str, target: Target | None = None) -> None:
        """From now on, what is seen belongs to `phase` (and `target`'s facade is the one watched)."""
        self.target = target or self.target
        _reset_high_water_mark(self.target.pid)
        self.guard.clear()
        self.phase = phase

    def rss_now(self) -> float:
        return rss_mib(self.target.pid)

    def peak_mib(self, phase: str) -> float:
        """The watched facade's highest RSS in `phase`: its samples' and, read now, its high-water mark's."""
        pid = self.target.pid
        sampled = [s.rss_mib for s in self.samples if s.phase == phase and s.pid == pid]
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            status = []
        high_water = [float(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:")]
        return max([*sampled, *high_water], default=0.0)

    def probed(self, phase: str) -> dict[str, ProbeSummary]:
        """Per kind of probe call, what the calls of `phase` saw."""
        summaries = {kind: ProbeSummary() for kind in KINDS}
        for probe in (p for p in self.probes if p.phase == phase):
            summary = summaries[probe.kind]
            summary.calls += 1
            summary.slowest_ms = max(summary.slowest_ms, probe.seconds * 1000)
            if probe.status != "OK":
                summary.failed += 1
                summary.failures[probe.status] = summary.failures.get(probe.status, 0) + 1
        return summaries

    def answered(self, kind: str) -> int:
        return sum(p.kind == kind and p.status == "OK" for p in self.probes)

    def _every(self, interval: float, act: Callable[[], None]) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            act()
            due = max(due + interval, time.monotonic())  # a slow call delays the next, it never doubles up
            self._stop.wait(due - time.monotonic())

    def _predict(self) -> None:
        target, phase = self.target, self.phase
        if target.grpc_url not in self._channels:
            self._channels[target.grpc_url] = channel(target.grpc_url)
        method = self._channels[target.grpc_url].unary_unary(
            PREDICT, request_serializer=None, response_deserializer=None
        )
        started = time.monotonic()
        try:
            body = method(self._body, timeout=PROBE_LIMIT_S, metadata=target.metadata)
            status = "OK" if inference_pb2.PredictResponse.FromString(body).model_name == MODEL else "WRONG ANSWER"
        except DecodeError:
            status = "WRONG ANSWER"
        except grpc.RpcError as error:
            status = error.code().name
        self.probes.append(ProbeCall(phase, "Predict", time.monotonic() - started, status))

    def _metrics(self) -> None:
        target, phase = self.target, self.phase
        started = time.monotonic()
        try:
            with urllib.request.urlopen(f"{target.http_url}/metrics", timeout=PROBE_LIMIT_S) as response:
                response.read()
                status = "OK" if response.status == 200 else f"HTTP {response.status}"
        except (OSError, http.client.HTTPException) as error:  # URLError, HTTPError and timeouts are OSErrors
            status = type(error).__name__
        self.probes.append(ProbeCall(phase, "/metrics", time.monotonic() - started, status))

    def _sample(self) -> None:
        target, phase = self.target, self.phase
        try:
            mib = rss_mib(target.pid)
        except psutil.Error:
            return  # the facade is gone (an attack killed it, or its facade was stopped)
        self.samples.append(Sample(phase, target.pid, mib))
        available = psutil.virtual_memory().available / MIB
        if not self.guard.is_set() and (mib > self.rss_cap_mib or available < self.available_floor_mib):
            self.guarded.append(f"{phase}: facade RSS {mib:.0f} MiB, {available:.0f} MiB available")
            self.guard.set()
