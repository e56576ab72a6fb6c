"""What tests of every tier share: waiting for a condition, and reading a server's /metrics page."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from backend.server.prometheus import MetricsPage, scrape

T = TypeVar("T")

__all__ = ["MetricsPage", "metrics", "time_of", "wait_until"]


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `condition` until it returns something truthy and return that; fail the test naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(interval)


def time_of(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> float:
    """`wait_until`, returning the time.monotonic() at which `condition` was seen to hold."""
    wait_until(condition, timeout, what, interval)
    return time.monotonic()


def metrics(http_url: str) -> MetricsPage:
    """The /metrics page of a server at `http_url` (http://host:port): the facade, Triton's metrics port, the supervisor."""
    return scrape(f"{http_url.rstrip('/')}/metrics")
