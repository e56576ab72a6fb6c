"""The supervisor's watchdog: which model versions, or which of their stubs, hang (supervisor.py kills them).

Three signs, each timed against the version's limit (`watchdog_limit`):

* the version has requests waiting and finished no execution since the clock started (every instance hangs);
* one of its stubs is stopped (SIGSTOP);
* one of its stubs computed nothing while the version had requests waiting and a sibling computed, look after look:
  the instance hangs while the others serve. Triton hands waiting requests to any free instance within its batching delay, so under load every
  working instance computes; one that holds its request forever (a deadlock, a call that never returns) does not,
  and the executions of the others would hide it from the first sign. Only that stub is killed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

from tritonnx.server.prometheus import MetricsPage
from tritonnx.server.stubs import Stub, Version

log = logging.getLogger("tritonnx.supervisor")
# The watchdog: its default, the config.pbtxt parameter that overrides it per model, how often it reads Triton's metrics.
DEFAULT_WATCHDOG_SECONDS = 60.0
WATCHDOG_PARAMETER = "tritonnx.watchdog_seconds"
WATCHDOG_EVERY_SECONDS = 1.0
# A stub did no work between two looks when it used less CPU than this and less than a tenth of its busiest sibling:
# one hung without computing uses next to none (its threads answering Triton's health checks, a few milliseconds a
# second), one running a model far more, and siblings given the same queue work alike.
IDLE_CPU_SECONDS = 0.05
BUSY_SIBLING_FACTOR = 10


@dataclass(frozen=True)
class Stall:
    """A model version the watchdog found hung: requests waiting without progress, or a stub stopped, for `seconds`.

    `pids`: the one stub that hangs while the others serve; empty when the version as a whole does.
    """

    version: Version
    seconds: float
    limit: float
    pending: int  # requests waiting at the look that found it
    stopped: bool
    pids: tuple[int, ...] = ()


def cpu_seconds(stubs: Iterable[Stub]) -> dict[int, float]:
    """The CPU time (user and system, every thread) each stub has used."""
    found = {}
    for stub in stubs:
        try:
            times = psutil.Process(stub.pid).cpu_times()
        except psutil.Error:
            continue
        found[stub.pid] = times.user + times.system
    return found


class Watchdog:
    """Which model versions hang, look after look at Triton's metrics and the stubs' process states and CPU times.

    Per version, the clock starts at the first look with requests pending since its last progress (an execution
    finished) and stops at the next progress; a version is hung when a look finds requests pending and the clock
    past its limit. A stopped stub is timed from the first look that found it stopped; an idle one from the first of
    the looks, each with its version's requests waiting, between which it used no CPU. A version reported is timed
    anew from its report: its stubs are killed and it is reloaded.
    """

    def __init__(self) -> None:
        self._progress: dict[Version, float] = {}  # executions and successes, as of the last look
        self._waiting_since: dict[Version, float] = {}
        self._stopped_since: dict[int, float] = {}  # pid -> first look that found it stopped
        self._cpu: dict[int, float] = {}  # pid -> its CPU seconds at the last look
        self._idle_since: dict[int, float] = {}  # pid -> the look from which it used no CPU with requests waiting
        self._waiting_before: set[Version] = set()  # versions with requests waiting at the last look
        self._last_look = 0.0

    def look(
        self,
        now: float,
        page: MetricsPage | None,
        stubs: Iterable[Stub],
        stopped_pids: set[int],
        limit: Callable[[Version], float],
        cpu: dict[int, float] | None = None,
    ) -> list[Stall]:
        """The versions hung at `now`; `page` is Triton's metrics (None: unreadable), `limit` a version's seconds.

        `cpu`: each stub's CPU seconds now (`cpu_seconds`); without it the idle-stub sign is not read.
        """
        stubs = list(stubs)
        waiting = self._waiting(now, page)
        stalls = self._whole_versions(now, waiting, stubs, stopped_pids, limit)
        hung = {stall.version for stall in stalls}
        if cpu is not None:
            stalls += self._idle_stubs(now, waiting, [s for s in stubs if s.key not in hung], cpu, limit)
        self._waiting_before, self._last_look = set(waiting), now
        for stall in stalls:
            self.restart(stall.version[0], now)
        return stalls

    def _waiting(self, now: float, page: MetricsPage | None) -> dict[Version, int]:
        """The versions with requests waiting, and how many; each version's progress clock brought up to `now`."""
        waiting: dict[Version, int] = {}
        if page is None:
            return waiting
        for version in _versions_in(page):
            labels = {"model": version[0], "version": version[1]}
            progress = page.value("nv_inference_exec_count_total", **labels) + page.value(
                "nv_inference_request_success_total", **labels
            )
            pending = int(page.value("nv_inference_pending_request_count", **labels))
            if self._progress.get(version) != progress:
                self._progress[version] = progress
                self._waiting_since.pop(version, None)
            if pending > 0:
                waiting[version] = pending
                self._waiting_since.setdefault(version, now)
        return waiting

    def _whole_versions(
        self,
        now: float,
        waiting: dict[Version, int],
        stubs: list[Stub],
        stopped_pids: set[int],
        limit: Callable[[Version], float],
    ) -> list[Stall]:
        stalls = []
        self._stopped_since = {pid: self._stopped_since.get(pid, now) for pid in stopped_pids}
        stopped_since: dict[Version, float] = {}
        for stub in stubs:
            if stub.pid in stopped_pids:
                stopped_since[stub.key] = min(stopped_since.get(stub.key, now), self._stopped_since[stub.pid])
        for version in sorted(set(waiting) | set(stopped_since)):
            since = min(self._waiting_since[version] if version in waiting else now, stopped_since.get(version, now))
            if since == now:
                continue  # first seen on this look: not worth asking for its limit
            seconds = limit(version)
            if 0 < seconds <= now - since:
                stalls.append(Stall(version, now - since, seconds, waiting.get(version, 0), version in stopped_since))
        return stalls

    def _idle_stubs(
        self,
        now: float,
        waiting: dict[Version, int],
        stubs: list[Stub],
        cpu: dict[int, float],
        limit: Callable[[Version], float],
    ) -> list[Stall]:
        """The stubs idle on every look since their clock started, requests waiting while a sibling computed."""
        used = {s.pid: cpu[s.pid] - self._cpu[s.pid] for s in stubs if s.pid in cpu and s.pid in self._cpu}
        busiest: dict[Version, float] = {}
        for stub in stubs:
            busiest[stub.key] = max(busiest.get(stub.key, 0.0), used.get(stub.pid, 0.0))
        idle = {}
        for stub in stubs:
            waited = stub.key in waiting and stub.key in self._waiting_before
            own = used.get(stub.pid)
            if waited and own is not None and own < IDLE_CPU_SECONDS and own * BUSY_SIBLING_FACTOR < busiest[stub.key]:
                idle[stub.pid] = self._idle_since.get(stub.pid, self._last_look)
        self._idle_since = idle
        self._cpu = {pid: seconds for pid, seconds in cpu.items()}
        stalls = []
        for stub in stubs:
            if stub.pid not in idle or idle[stub.pid] == now:
                continue
            seconds = limit(stub.key)
            if 0 < seconds <= now - idle[stub.pid]:
                stalls.append(Stall(stub.key, now - idle[stub.pid], seconds, waiting[stub.key], False, (stub.pid,)))
                del self._idle_since[stub.pid]
        return stalls

    def restart(self, model: str, now: float) -> None:
        """Time `model`'s waiting requests anew from `now`: its stubs were killed, or it was reloaded."""
        for version in self._waiting_since:
            if version[0] == model:
                self._waiting_since[version] = now

    def clear(self) -> None:
        self._progress.clear()
        self._waiting_since.clear()
        self._stopped_since.clear()
        self._cpu.clear()
        self._idle_since.clear()
        self._waiting_before.clear()


def _versions_in(page: MetricsPage) -> set[Version]:
    return {
        (labels["model"], labels["version"])
        for name, labels, _ in page.samples
        if name == "nv_inference_pending_request_count" and "model" in labels and "version" in labels
    }


def watchdog_limit(config: dict | None, default: float) -> float:
    """A model's watchdog seconds: its config's `tritonnx.watchdog_seconds` parameter, else `default`; 0 is off."""
    value = ((config or {}).get("parameters") or {}).get(WATCHDOG_PARAMETER, {}).get("string_value")
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        log.warning(
            "supervisor: %s is %r, not a number of seconds (0: off); using %gs", WATCHDOG_PARAMETER, value, default
        )
        return default
    return seconds
