"""The soak's load: every model through both paths at once, each answer checked, the rate split by capacity.

Each of the N streams is offered `load_fraction / N` of its own capacity: a stream at rate r with capacity c keeps the
machine busy r / c of the time, so each gets the same share of it whatever its model costs (equal request rates would
hand resnet50 nearly all of it). Answers are counted by the model version that gave them (a publish swaps versions).
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import service_pb2

from bench.load.loops import LoadResult, OpenLoop
from bench.load.stats import Tally, percentiles
from bench.load.targets import (
    TEXT_SEQUENCE,
    FacadeTarget,
    GrpcTarget,
    KServeTarget,
    Request,
    close_enough,
    random_tensor,
)
from bench.peers import common
from tritonnx.backend.tensors import RAW_DTYPES
from tritonnx.client.proto import inference_pb2

SEEDS = range(4)  # four different images (or token sequences) per stream, in turn
PATHS = ("facade", "triton")
DEADLINE_S = 10.0  # every call's
MAX_OUTSTANDING = 32  # calls in flight per stream at most; a call due beyond it is skipped and counted


def requests_of(session: ort.InferenceSession) -> list[Request]:
    """One request per seed: an image, or (a model with INT64 inputs) a token sequence of TEXT_SEQUENCE ids."""
    inputs = session.get_inputs()
    if all(i.type != "tensor(int64)" for i in inputs):
        return [np.random.default_rng(seed).standard_normal((1, 3, 224, 224), dtype=np.float32) for seed in SEEDS]
    rngs = [np.random.default_rng(seed) for seed in SEEDS]
    return [{i.name: random_tensor(i.name, "INT64", [1, TEXT_SEQUENCE], rng) for i in inputs} for rng in rngs]


class Checked(GrpcTarget):
    """A target whose every answer is decoded, compared with ONNX Runtime's outputs by name, counted by version."""

    def __init__(self, url: str, model: str, session: ort.InferenceSession, **options: Any) -> None:
        requests = requests_of(session)
        super().__init__(url, model, 1, images=requests, **options)
        names, first = [o.name for o in session.get_outputs()], session.get_inputs()[0].name
        self.reference = [
            dict(zip(names, session.run(None, r if isinstance(r, dict) else {first: r}), strict=True)) for r in requests
        ]
        self.versions: Counter[str] = Counter()  # model version -> answers
        self.wrong_examples: list[str] = []

    def answer(self, body: bytes) -> tuple[str, dict[str, np.ndarray]]:
        raise NotImplementedError

    def check(self, index: int, body: bytes) -> None:
        version, outputs = self.answer(body)
        self.versions[version] += 1
        expected = self.reference[index]
        bad = [n for n in expected if n not in outputs or not close_enough(outputs[n].ravel(), expected[n].ravel())]
        if bad:
            self.wrong += 1
            if len(self.wrong_examples) < 10:
                self.wrong_examples.append(f"request {index}, version {version}: {', '.join(bad)} differ")


class CheckedFacade(Checked, FacadeTarget):
    """The facade's Predict with raw tensors (named outputs come back for every output)."""

    def answer(self, body: bytes) -> tuple[str, dict[str, np.ndarray]]:
        response = inference_pb2.PredictResponse.FromString(body)
        kind = inference_pb2.ElementType.Name
        return response.model_version, {t.name: _array(t.raw_data, kind(t.dtype), t.shape) for t in response.outputs}


class CheckedTriton(Checked, KServeTarget):
    """Triton's KServe ModelInfer, every output of the answer compared by name."""

    name = "triton"

    def answer(self, body: bytes) -> tuple[str, dict[str, np.ndarray]]:
        response = service_pb2.ModelInferResponse.FromString(body)
        raw = zip(response.outputs, response.raw_output_contents, strict=False)
        return response.model_version, {o.name: _array(data, o.datatype, o.shape) for o, data in raw}


def _array(raw: bytes, datatype: str, shape: Sequence[int]) -> np.ndarray:
    return np.frombuffer(raw, dtype=RAW_DTYPES[datatype]).reshape(list(shape))


StreamTarget = CheckedFacade | CheckedTriton


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


def make_streams(models: Sequence[str], repository: Path, facade_url: str, triton_url: str) -> list[Stream]:
    streams = []
    for model in models:
        reference = common.session(repository / model / "1" / "model.onnx")
        streams.append(Stream(model, "facade", CheckedFacade(facade_url, model, reference, timeout_s=DEADLINE_S)))
        streams.append(Stream(model, "triton", CheckedTriton(triton_url, model, reference, timeout_s=DEADLINE_S)))
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
    """The interval's columns per path (`facade.rps`, ...); a new interval starts."""
    taken = {s.label: s.loop.take() for s in streams if s.loop is not None}
    row: dict = {}
    for path in PATHS:
        row |= interval_row(merged([t for label, t in taken.items() if label.startswith(path)]), seconds, f"{path}.")
    return row


def totals(streams: Sequence[Stream], seconds: float) -> dict:
    """The paced load's totals, per stream and per path: an interval row of the whole load, with the calls sent."""

    def summary(tally: Tally, sent: int) -> dict:
        return {**interval_row(tally, seconds), "sent": sent, "errors": tally.errors}

    paced = [s for s in streams if s.loop is not None]
    found: dict = {"streams": {}, "paths": {}}
    for s in paced:
        assert s.loop is not None
        found["streams"][s.label] = {
            **summary(s.loop.total, s.loop.sent),
            "offered_rps": s.rate,
            "wrong": s.target.wrong,
            "wrong_examples": s.target.wrong_examples,
            "versions": dict(sorted(s.target.versions.items())),
        }
    for path in PATHS:
        mine = [(s, s.loop) for s in paced if s.path == path and s.loop is not None]
        found["paths"][path] = {
            **summary(merged([loop.total for _, loop in mine]), sum(loop.sent for _, loop in mine)),
            "wrong": sum(s.target.wrong for s, _ in mine),
        }
    return found
