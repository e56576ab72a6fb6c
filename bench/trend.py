"""Does a series grow? The soak's and the fuzz campaign's check of memory samples for leaks, and of counts for a rise.

The samples after the warm-up (the second half of the run unless the caller names its end) are fitted with a
least-squares line and the Theil-Sen slope (one late step, such as an arena grown once, barely moves it; steady
growth moves it fully); a series is flagged when both slopes, projected to 10 minutes, exceed a limit. A count is
judged by `level`: where it ends against where it started after the warm-up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

GROWTH_MIB_PER_10MIN = 10.0
TEN_MINUTES = 600.0


@dataclass
class Trend:
    series: str  # a memory series, in MiB
    samples: int  # samples in the fit window (after the warm-up)
    start: float  # first sample of the whole run
    end: float  # last sample
    peak: float
    mean: float  # over the fit window
    growth_per_10min: float  # least-squares slope over the fit window x 600 s
    robust_growth_per_10min: float  # Theil-Sen slope (median of the pairwise slopes) x 600 s
    flagged: bool  # both growths above the limit
    note: str = ""

    def as_dict(self) -> dict:
        return _rounded(self)


def _rounded(series: Trend | Level) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in asdict(series).items()}


def least_squares_slope(times: Sequence[float], values: Sequence[float]) -> float:
    """Slope (value units per time unit) of the least-squares line; NaN for fewer than 2 distinct times."""
    t, v = np.asarray(times, dtype=float), np.asarray(values, dtype=float)
    if len(t) < 2 or np.ptp(t) == 0:
        return math.nan
    return float(((t - t.mean()) * (v - v.mean())).sum() / ((t - t.mean()) ** 2).sum())


def theil_sen_slope(times: Sequence[float], values: Sequence[float]) -> float:
    """Median of the pairwise slopes (NaN for < 2 times): one step moves it little, steady growth fully."""
    t, v = np.asarray(times, dtype=float), np.asarray(values, dtype=float)
    i, j = np.triu_indices(len(t), k=1)
    dt = t[j] - t[i]
    keep = dt != 0
    if not keep.any():
        return math.nan
    return float(np.median((v[j] - v[i])[keep] / dt[keep]))


def trend(
    series: str,
    times: Sequence[float],
    values: Sequence[float],
    *,
    limit: float = GROWTH_MIB_PER_10MIN,
    min_samples: int = 3,
    since: float | None = None,
) -> Trend:
    """Fit the samples from `since` (default: the second half) with least squares and Theil-Sen, NaNs left out.

    Flagged when both growths per 10 minutes exceed `limit`.
    """
    points = [(t, v) for t, v in zip(times, values, strict=False) if v is not None and math.isfinite(v)]
    nan = math.nan
    if not points:
        return Trend(series, 0, nan, nan, nan, nan, nan, nan, False, "no samples")
    start, end = points[0][1], points[-1][1]
    peak = max(v for _, v in points)
    middle = (points[0][0] + points[-1][0]) / 2 if since is None else since
    window_t = [t for t, _ in points if t >= middle]
    window_v = [v for t, v in points if t >= middle]
    mean = float(np.mean(window_v)) if window_v else nan
    if len(window_t) < min_samples:
        note = f"fewer than {min_samples} samples after the warm-up: not judged"
        return Trend(series, len(window_t), start, end, peak, mean, nan, nan, False, note)
    growth = least_squares_slope(window_t, window_v) * TEN_MINUTES
    robust = theil_sen_slope(window_t, window_v) * TEN_MINUTES
    over = [growth > limit, robust > limit]
    note = ""
    if over[0] and not over[1]:
        note = "least squares rises but the pairwise median does not: a step, not a steady trend"
    elif over[1] and not over[0]:
        note = "the pairwise median rises but least squares does not"
    return Trend(series, len(window_t), start, end, peak, mean, growth, robust, all(over), note)


@dataclass
class Level:
    """A count (open fds, threads, /dev/shm regions) after the warm-up, and whether it stays where it started."""

    series: str
    samples: int  # in the window
    first: float  # median of the window's first samples
    last: float  # median of its last samples
    peak: float
    rise: float  # last - first
    flat: bool
    note: str = ""

    def as_dict(self) -> dict:
        return _rounded(self)


def level(series: str, times: Sequence[float], values: Sequence[float], *, since: float, tolerance: float) -> Level:
    """Flat when the median of the last 3 samples after `since` is at most `tolerance` above that of the first 3.

    Medians of a few samples at each end, not the peak: a publish starts a new version's stubs beside the old ones
    for a moment (more fds, threads and regions, then as many as before), while a leak stays. A window of fewer than
    3 samples is not judged (flat, with a note); with fewer than 6, the ends share samples.
    """
    window = [v for t, v in zip(times, values, strict=False) if t >= since and v is not None and math.isfinite(v)]
    if len(window) < 3:
        nan = math.nan
        return Level(
            series, len(window), nan, nan, max(window, default=nan), nan, True, "fewer than 3 samples: not judged"
        )
    k = max(1, min(3, len(window) // 2))
    first, last = float(np.median(window[:k])), float(np.median(window[-k:]))
    return Level(series, len(window), first, last, max(window), last - first, last - first <= tolerance)
