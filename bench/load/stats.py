"""What a load loop saw: every call's latency under how it ended, and percentiles of them."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

OK = "OK"  # the status of a call that succeeded; the others are the targets' error labels


@dataclass
class Tally:
    """The calls of one span: their latencies (seconds) by status, the skipped ones and the schedule's worst lag."""

    latencies: dict[str, array] = field(default_factory=dict)
    skipped: int = 0
    max_lag: float = 0.0  # seconds

    def add(self, status: str, seconds: float) -> None:
        series = self.latencies.get(status)
        if series is None:
            series = self.latencies[status] = array("d")
        series.append(seconds)

    def count(self, status: str = OK) -> int:
        return len(self.latencies.get(status, ()))

    @property
    def statuses(self) -> dict[str, int]:
        return {status: len(series) for status, series in sorted(self.latencies.items())}

    @property
    def errors(self) -> dict[str, int]:
        return {status: count for status, count in self.statuses.items() if status != OK}

    def ms(self, status: str = OK) -> np.ndarray:
        """The latencies of the calls that ended with `status`, in milliseconds."""
        return np.frombuffer(self.latencies.get(status, array("d")), dtype=np.float64) * 1000.0


def percentiles(values: np.ndarray, quantiles: Sequence[float], empty: float = math.nan) -> list[float]:
    """The quantiles (0-100) of `values`; `empty` for each when there are none."""
    if not len(values):
        return [empty] * len(quantiles)
    return [float(v) for v in np.percentile(values, quantiles)]
