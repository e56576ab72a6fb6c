"""The limit to compare with: the same .onnx file run in-process by ONNX Runtime, no server.

With the machine's whole thread budget, in the two ways a server could spend it: one session with all threads, or one
single-thread session per core side by side (ONNX Runtime releases the GIL while it runs). The better is the limit.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.peers import common


@dataclass
class LimitResult:
    model: str
    threads: int
    images_per_s: dict[str, float] = field(default_factory=dict)  # "<layout> b<batch>" -> images/s
    cpu_ms_per_image: dict[str, float] = field(default_factory=dict)  # same keys: CPU of all threads
    single_p50_ms: float = 0.0
    single_p99_ms: float = 0.0

    @property
    def best(self) -> tuple[str, float]:
        return max(self.images_per_s.items(), key=lambda item: item[1])

    def as_dict(self) -> dict:
        layout, value = self.best
        return {**asdict(self), "best_layout": layout, "best_images_per_s": value}


def _images(batch: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32)


def _throughput(sessions: list[ort.InferenceSession], batch: int, seconds: float) -> tuple[float, float]:
    """Images per second with every session looping on its own thread for `seconds`, and the CPU ms per image."""
    data = _images(batch)
    name = sessions[0].get_inputs()[0].name
    for session in sessions:  # warm up: first runs allocate
        session.run(None, {name: data})
    counts = [0] * len(sessions)
    stop_at = time.perf_counter() + seconds

    def loop(index: int) -> None:
        while time.perf_counter() < stop_at:
            sessions[index].run(None, {name: data})
            counts[index] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(sessions))]
    started, cpu_started = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    images = sum(counts) * batch
    return images / (time.perf_counter() - started), 1000 * (time.process_time() - cpu_started) / max(images, 1)


def measure_limit(
    onnx_file: Path, model: str, threads: int = 2, batches: tuple[int, ...] = (1, 4, 8, 16), seconds: float = 3.0
) -> LimitResult:
    result = LimitResult(model=model, threads=threads)
    whole = common.session(onnx_file, threads)
    per_core = [common.session(onnx_file, 1) for _ in range(threads)]
    for batch in batches:
        for layout, sessions in ((f"1x{threads}threads b{batch}", [whole]), (f"{threads}x1thread b{batch}", per_core)):
            result.images_per_s[layout], result.cpu_ms_per_image[layout] = _throughput(sessions, batch, seconds)

    result.single_p50_ms, result.single_p99_ms = _single_image(whole, per_core[0], seconds=seconds / 2)
    return result


def _single_image(
    *sessions: ort.InferenceSession, seconds: float, feeds: list[dict[str, np.ndarray]] | None = None
) -> tuple[float, float]:
    """p50 and p99 ms of one request run back to back, with the session (thread count) that serves it fastest.

    One image, or `feeds` in turn (a request's arrays by input name: the text models' mixed lengths). Small models
    lose more to thread synchronisation than they gain from a second thread.
    """
    feeds = feeds or [{sessions[0].get_inputs()[0].name: _images(1)}]
    best: list[float] | None = None
    for session in sessions:
        latencies: list[float] = []
        stop_at = time.perf_counter() + seconds
        while time.perf_counter() < stop_at or len(latencies) < 10:
            feed = feeds[len(latencies) % len(feeds)]
            started = time.perf_counter()
            session.run(None, feed)
            latencies.append((time.perf_counter() - started) * 1000)
        if best is None or np.percentile(latencies, 50) < np.percentile(best, 50):
            best = latencies
    assert best is not None  # `sessions` is never empty
    return float(np.percentile(best, 50)), float(np.percentile(best, 99))


def measure_single_image(
    onnx_file: Path, threads: int = 2, seconds: float = 2.0, feeds: list[dict[str, np.ndarray]] | None = None
) -> tuple[float, float]:
    """In-process single-image (or single-request: `feeds`) p50 and p99 ms: a served lone request's reference."""
    sessions = (common.session(onnx_file, threads), common.session(onnx_file, 1))
    for session in sessions:  # first runs allocate
        for feed in feeds or [{session.get_inputs()[0].name: _images(1)}]:
            session.run(None, feed)
    return _single_image(*sessions, seconds=seconds, feeds=feeds)
