"""What tests of every tier share: waiting for a condition, reading a server's /metrics page, a study's verdict."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

from tritonnx.server.prometheus import MetricsPage, scrape

T = TypeVar("T")

__all__ = ["MetricsPage", "judged", "metrics", "process_gone", "time_of", "wait_until"]


def wait_until(condition: Callable[[], T], timeout: float, what: str | Callable[[], str], interval: float = 0.05) -> T:
    """Poll `condition` until it returns something truthy and return that; fail the test naming `what` after `timeout`.

    The one wait of the tests: no wait ends silently. `what` may be a function, called at the timeout, so the failure
    says what was seen last (the targets down, the alerts firing).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what() if callable(what) else what}: not within {timeout:g}s")
        time.sleep(interval)


def time_of(
    condition: Callable[[], object], timeout: float, what: str | Callable[[], str], interval: float = 0.05
) -> float:
    """`wait_until`, returning the time.monotonic() at which `condition` was seen to hold."""
    wait_until(condition, timeout, what, interval)
    return time.monotonic()


def process_gone(pid: int) -> bool:
    """Whether process `pid` has exited: gone, or a zombie its parent has not reaped yet (a signal's kill is not instant)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def metrics(http_url: str) -> MetricsPage:
    """The /metrics page of a server at `http_url` (http://host:port): the facade, Triton's metrics port, the supervisor."""
    return scrape(f"{http_url.rstrip('/')}/metrics")


def judged(out: Path, code: int, sections: list[str]) -> dict[str, bool]:
    """A study's gates by name, once its exit code says it was judged and its report has every section.

    What a study measures is its own business: its gates judge the figures (exit 1 when one fails). A test checks
    that the run was judged and reported, and asserts only the gates a short run on a busy machine cannot miss.
    """
    assert code in (0, 1), f"exit code {code}: the run was not judged"
    report = (out / "report.md").read_text()
    for section in [*sections, "## Gates"]:
        assert section in report, f"no {section!r} in the report:\n{report}"
    gates = {gate["name"]: gate["passed"] for gate in json.loads((out / "results.json").read_text())["gates"]}
    assert (code == 0) == all(gates.values()), gates
    return gates
