"""The FastAPI baseline's layouts (workers x ONNX Runtime threads) and whether a run's load spread over its workers.

A run counts only if every worker did its share: with keep-alive connections, a worker that got
none of them idles for the whole run, and the figure would measure the kernel's luck, not the
server. The check reads each worker process's CPU time over the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import TypeVar

import psutil

from bench.usage import cpu_seconds

T = TypeVar("T")
# A worker counts as doing its share when it used at least this fraction of an even split.
MIN_SHARE_OF_EVEN = 0.5


@dataclass(frozen=True)
class Setup:
    """One layout of the baseline: `workers` processes, each one session of `threads` intra-op threads."""

    workers: int
    threads: int
    why: str  # the documentation or default this layout follows

    @property
    def name(self) -> str:
        return f"{self.workers} worker(s) x {self.threads} thread(s)"


def setups(cores: int) -> list[Setup]:
    """The two documented layouts for `cores` cores, without repeats (one core leaves one)."""
    candidates = [
        Setup(1, cores, "one process, ONNX Runtime's default of one intra-op thread per core"),
        Setup(cores, 1, "FastAPI's and uvicorn's advice: one worker process per core, one thread each"),
    ]
    unique: dict[tuple[int, int], Setup] = {}
    for setup in candidates:
        unique.setdefault((setup.workers, setup.threads), setup)
    return list(unique.values())


def worker_cpu(pids: Iterable[int]) -> dict[int, float]:
    """CPU seconds used so far by each worker still running."""
    used = {}
    for pid in pids:
        with suppress(psutil.NoSuchProcess):
            used[pid] = cpu_seconds(psutil.Process(pid))
    return used


def cpu_split(before: Mapping[int, float], after: Mapping[int, float]) -> dict[int, float]:
    """CPU seconds each worker used between two readings (workers present in both)."""
    return {pid: round(after[pid] - before[pid], 3) for pid in sorted(after) if pid in before}


def shares(split: Mapping[int, float]) -> list[float]:
    """Each worker's fraction of the workers' CPU, in PID order; zeros when none was used."""
    total = sum(split.values())
    return [round(split[pid] / total, 3) if total > 0 else 0.0 for pid in sorted(split)]


def spread(split: Mapping[int, float], concurrency: int, min_share_of_even: float = MIN_SHARE_OF_EVEN) -> bool | None:
    """Whether every worker did its share; None for one worker or fewer connections than workers (by design)."""
    workers = len(split)
    if workers < 2 or concurrency < workers:
        return None
    total = sum(split.values())
    return total > 0 and min(split.values()) >= min_share_of_even * total / workers


def measured_split(run: Callable[[], T], worker_pids: Callable[[], list[int]], concurrency: int) -> tuple[T, dict]:
    """`run()`'s result and how its CPU split over the workers; run once more, with new connections, if unspread.

    Keep-alive connections are placed once per run (the kernel hashes each new one to a worker's socket), so a second
    run is a second draw. The split of the run kept is returned either way: a report shows it, and an unspread run does
    not count as the baseline's figure.
    """
    runs = 0
    while True:
        runs += 1
        pids = worker_pids()
        before = worker_cpu(pids)
        result = run()
        split = cpu_split(before, worker_cpu(pids))
        verdict = spread(split, concurrency)
        if verdict is not False or runs == 2:
            return result, {
                "cpu_seconds": list(split.values()),
                "shares": shares(split),
                "spread": verdict,
                "runs": runs,
            }
