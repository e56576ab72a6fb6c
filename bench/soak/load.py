"""The soak's load: every model through both paths at once, each answer checked, the rate split by capacity.

A stream is one model through one path (the facade's `Predict`, or Triton's KServe `ModelInfer` direct) with a
target that checks every answer (bench/soak/checked.py), its capacity, offered rate and open loop.

How the load is split: each stream's capacity is measured alone (closed loop), and each of the N streams is offered
`load_fraction / N` of its own capacity. A stream at rate r with capacity c keeps the machine busy r / c of the time,
so the streams together keep it busy `load_fraction` of the time, and each gets the same share of it, whatever its
model costs (equal request rates would hand resnet50 nearly all of it).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.load.loops import LoadResult, OpenLoop
from bench.load.stats import Tally, percentiles
from bench.peers.common import session
from bench.soak.checked import CheckedFacade, CheckedTriton, StreamTarget

PATHS = ("facade", "triton")
DEADLINE_S = 10.0  # every call's
MAX_OUTSTANDING = 32  # calls in flight per stream at most; a call due beyond it is skipped and counted
BURST_CONCURRENCY = 8  # calls in flight per stream in the burst


@dataclass
class Stream:
    """One model through one path: its checked target, measured capacity, offered rate and open loop."""

    model: str
    path: str  # "facade" or "triton"
    target: StreamTarget
    capacity: LoadResult | None = None
    rate: float = 0.0
    loop: OpenLoop | None = None

    @property
    def label(self) -> str:
        return f"{self.path}.{self.model}"


def make_streams(
    models: Sequence[str], repository: Path, facade_url: str, triton_url: str, deadline: float
) -> list[Stream]:
    streams = []
    for model in models:
        reference = session(repository / model / "1" / "model.onnx")
        streams.append(Stream(model, "facade", CheckedFacade(facade_url, model, reference, timeout_s=deadline)))
        streams.append(Stream(model, "triton", CheckedTriton(triton_url, model, reference, timeout_s=deadline)))
    return streams


def split_rates(capacities: Sequence[float], load_fraction: float) -> list[float]:
    """Each of N streams gets load_fraction / N of its own capacity: equal shares of the machine's time."""
    if not capacities or any(c <= 0 for c in capacities):
        raise ValueError(f"every capacity must be positive: {list(capacities)}")
    return [load_fraction * c / len(capacities) for c in capacities]


def merged(tallies: Sequence[Tally]) -> Tally:
    """One tally of several streams' calls (a path's, or the whole run's)."""
    total = Tally()
    for tally in tallies:
        for status, series in tally.latencies.items():
            total.latencies.setdefault(status, array("d")).extend(series)
        total.skipped += tally.skipped
        total.max_lag = max(total.max_lag, tally.max_lag)
    return total


def interval_row(tally: Tally, seconds: float, prefix: str = "") -> dict:
    """An interval's columns: OK calls, rate, p50/p99, errors (by status), skips and lag, `prefix`ed."""
    ok, errors = tally.count(), tally.errors
    p50, p99 = percentiles(tally.ms(), [50, 99])
    row = {
        "ok": ok,
        "rps": round(ok / seconds, 2) if seconds > 0 else 0.0,
        "p50_ms": round(p50, 3),
        "p99_ms": round(p99, 3),
        "errors": sum(errors.values()),
        "errors_by_status": " ".join(f"{k}:{v}" for k, v in errors.items()),
        "skipped": tally.skipped,
        "max_lag_ms": round(tally.max_lag * 1000, 2),
    }
    return {f"{prefix}{k}": v for k, v in row.items()}


def take_intervals(streams: Sequence[Stream], seconds: float) -> dict:
    """The interval's columns per path (`facade.rps`, ...) and each stream's rate and p99; a new interval starts."""
    taken = {s.label: s.loop.take() for s in streams if s.loop is not None}
    row: dict = {}
    for path in PATHS:
        row |= interval_row(
            merged([t for label, t in taken.items() if label.startswith(f"{path}.")]), seconds, f"{path}."
        )
    for label, tally in taken.items():
        stream_row = interval_row(tally, seconds)
        row[f"rps.{label}"], row[f"p99_ms.{label}"] = stream_row["rps"], stream_row["p99_ms"]
    return row


def summary(tally: Tally, sent: int, seconds: float) -> dict:
    latencies = tally.ms()
    p50, p99 = percentiles(latencies, [50, 99])
    return {
        "scheduled": sent + tally.skipped,
        "sent": sent,
        "ok": tally.count(),
        "errors": tally.errors,
        "skipped": tally.skipped,
        "ok_rps": tally.count() / seconds if seconds > 0 else 0.0,
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": float(latencies.max()) if len(latencies) else float("nan"),
        "max_lag_ms": tally.max_lag * 1000,
    }


def totals(streams: Sequence[Stream], seconds: float) -> dict:
    """The paced load's totals, per stream and per path."""
    paced = [s for s in streams if s.loop is not None]
    found: dict = {"streams": {}, "paths": {}}
    for s in paced:
        assert s.loop is not None
        found["streams"][s.label] = {
            **summary(s.loop.total, s.loop.sent, seconds),
            "offered_rps": s.rate,
            "wrong": s.target.wrong,
            "wrong_examples": s.target.wrong_examples,
            "versions": dict(sorted(s.target.versions.items())),
        }
    for path in PATHS:
        mine = [(s, s.loop) for s in paced if s.path == path and s.loop is not None]
        found["paths"][path] = {
            **summary(merged([loop.total for _, loop in mine]), sum(loop.sent for _, loop in mine), seconds),
            "wrong": sum(s.target.wrong for s, _ in mine),
        }
    return found
