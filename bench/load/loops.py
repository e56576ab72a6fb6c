"""The load loops: a closed loop that measures what a target sustains, an open loop that offers a fixed rate.

Both are bounded in calls and in time and stop by themselves: every call carries its target's deadline, and calls still
in flight at the end are awaited within that deadline (plus a margin against a hang), then cancelled. The generator
shares the cores with the servers it loads, so a call costs it two `perf_counter()` calls and an append.

Closed loop (`run_load`): `concurrency` workers, each looping send -> await -> record, for a warm-up (not recorded),
then for the measured window, which ends at `duration_s` or after `max_requests` calls. A call belongs to the window if
it was SENT after the warm-up ended, and calls in flight when it ends are awaited and recorded: `requests +
sum(errors)` is exactly the number sent in it, `warmup_requests` (the verification call included) those before it.
`client_cpu` is the generator's CPU seconds (all threads) per wall second over the window (1.0 = one core).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from array import array
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field

import numpy as np

from bench.load.stats import OK, Tally, percentiles
from bench.load.targets import Target

# In-flight calls finish within their own deadline; this margin only guards against a hang.
HANG_MARGIN_S = 10.0


@dataclass
class LoadResult:
    target: str  # "triton-grpc", "facade", "fastapi"
    model: str
    batch: int
    concurrency: int
    requests: int  # successful calls in the measured window
    errors: dict[str, int] = field(default_factory=dict)  # status (gRPC code name / HTTP status) -> count
    seconds: float = 0.0  # the measured window
    throughput_rps: float = 0.0
    images_per_s: float = 0.0  # throughput_rps * batch
    p50_ms: float = math.nan
    p95_ms: float = math.nan
    p99_ms: float = math.nan
    client_cpu: float = 0.0  # the generator's CPU seconds / wall seconds over the window; 1.0 = one core
    warmup_requests: int = 0  # calls sent before the window (verification call included), not recorded

    def as_dict(self) -> dict:
        return asdict(self)


async def run_load(
    target: Target,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 1.0,
    max_requests: int = 100_000,
    *,
    verify: bool = True,
) -> LoadResult:
    """Closed-loop load; opens the target unless open. `verify`: check the first answer (VerificationError)."""
    if concurrency < 1 or max_requests < 1 or not duration_s > 0 or warmup_s < 0:
        raise ValueError(
            f"concurrency, max_requests and duration_s must be positive, warmup_s not negative: "
            f"{concurrency}, {max_requests}, {duration_s}, {warmup_s}"
        )
    opened_here = not target.is_open
    if opened_here:
        await target.open(concurrency)
    try:
        if verify:
            await target.verify()
        return await _drive(target, concurrency, duration_s, warmup_s, max_requests, warm=int(verify))
    finally:
        if opened_here:
            await target.close()


def run(
    target: Target, concurrency: int, duration_s: float, warmup_s: float = 1.0, max_requests: int = 100_000
) -> LoadResult:
    """`run_load` in a fresh event loop; the channel / session is created in it and closed."""
    return asyncio.run(run_load(target, concurrency, duration_s, warmup_s, max_requests))


async def _drive(
    target: Target, concurrency: int, duration_s: float, warmup_s: float, max_requests: int, warm: int
) -> LoadResult:
    call = target.call
    perf = time.perf_counter
    tally = Tally()
    record = tally.add
    measuring = stopping = False
    sent = 0  # calls sent in the window; `warm` counts those before it, the verification call included
    stop = asyncio.Event()

    async def worker() -> None:
        nonlocal sent, warm, stopping
        try:
            while not stopping:
                if not measuring:
                    warm += 1
                    await call()
                    continue
                sent += 1
                if sent >= max_requests:
                    stopping = True
                    stop.set()
                started = perf()
                error = await call()
                record(error or OK, perf() - started)
        except BaseException:
            stopping = True
            stop.set()
            raise

    workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    try:
        if warmup_s > 0:
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), warmup_s)  # only a crashed worker sets it this early
        cpu_start, window_start = time.process_time(), perf()
        measuring = True
        by_duration = False
        if not stopping:
            try:
                await asyncio.wait_for(stop.wait(), duration_s)
            except asyncio.TimeoutError:
                by_duration = True
        stopping = True
        window_end = perf()
        await asyncio.wait_for(asyncio.gather(*workers), target.timeout_s + HANG_MARGIN_S)
        done, cpu_end = perf(), time.process_time()
    finally:
        for task in workers:
            task.cancel()

    # A duration-bounded window is its nominal span: the calls counted are those SENT in it, which
    # in a closed loop is unbiased. A window cut by max_requests lasts until its last response.
    seconds = (window_end if by_duration else done) - window_start
    latencies = tally.ms()
    result = LoadResult(target.name, target.model, target.batch, concurrency, len(latencies), tally.errors, seconds)
    result.client_cpu = (cpu_end - cpu_start) / (done - window_start) if done > window_start else 0.0
    result.warmup_requests = warm
    if seconds > 0:
        result.throughput_rps = result.requests / seconds
        result.images_per_s = result.throughput_rps * target.batch
    if len(latencies):
        result.p50_ms, result.p95_ms, result.p99_ms = percentiles(latencies, [50, 95, 99])
    return result


def arrival_offsets(rate: float, poisson: bool = False, seed: int = 0) -> Iterator[float]:
    """Send times (s from the start) at `rate` a second: every 1/rate, or Poisson, seeded so a run can be replayed."""
    if not poisson:
        yield from (scheduled / rate for scheduled in itertools.count())
    rng, offset = np.random.default_rng(seed), 0.0
    while True:
        for gap in rng.exponential(1.0 / rate, 4096):
            yield offset
            offset += float(gap)


class OpenLoop:
    """Calls `target.call()` on a schedule, `rate` a second, until `duration`, `max_calls` or `stop()`.

    A call due while `max_outstanding` are pending is skipped and counted, so the offered load never queues up (the
    soak); with `wait_when_full` it waits for one to end, so exactly the scheduled calls are sent (the overload).
    With `from_schedule` latency is timed from when a call was due, charging a slow server or a generator that fell
    behind for the wait (no coordinated omission). `lags`: how late each send was.
    """

    def __init__(
        self,
        target: Target,
        rate: float,
        max_outstanding: int,
        max_calls: int,
        *,
        wait_when_full: bool = False,
        poisson: bool = False,
        seed: int = 0,
        from_schedule: bool = False,
    ) -> None:
        if rate <= 0 or max_outstanding < 1 or max_calls < 1:
            raise ValueError(f"rate, max_outstanding, max_calls must be > 0: {rate}, {max_outstanding}, {max_calls}")
        self.target, self.rate, self.max_outstanding, self.max_calls = target, rate, max_outstanding, max_calls
        self.wait_when_full, self.from_schedule = wait_when_full, from_schedule
        self.offsets = arrival_offsets(rate, poisson, seed)
        self.total = Tally()  # the whole run
        self.interval = Tally()  # since the last `take()`
        self.lags = array("d")  # per scheduled call: actual send (or skip) - due, seconds
        self.sent = 0
        self.stopping = False
        self._pending: set[asyncio.Task] = set()

    def take(self) -> Tally:
        """What the calls since the last take saw; a new interval starts."""
        taken, self.interval = self.interval, Tally()
        return taken

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def stop(self) -> None:
        self.stopping = True

    def lag_ms(self, quantiles: Sequence[float]) -> list[float]:
        """Quantiles (0-100) of the generator's lag behind its schedule, in ms (0 for no call)."""
        return percentiles(np.frombuffer(self.lags, dtype=np.float64) * 1000.0, quantiles, empty=0.0)

    async def _one(self, due: float) -> None:
        started = due if self.from_schedule else time.perf_counter()
        status = await self.target.call() or OK
        for tally in (self.total, self.interval):
            tally.add(status, time.perf_counter() - started)

    async def run(self, duration: float) -> None:
        perf = time.perf_counter
        begin, scheduled, offset = perf(), 0, next(self.offsets)
        while not self.stopping and scheduled < self.max_calls and offset < duration:
            due, now = begin + offset, perf()
            if due > now:
                await asyncio.sleep(due - now)
                continue
            self.lags.append(now - due)
            scheduled, offset = scheduled + 1, next(self.offsets)
            for tally in (self.total, self.interval):
                tally.max_lag = max(tally.max_lag, now - due)
            if len(self._pending) >= self.max_outstanding and not self.wait_when_full:
                for tally in (self.total, self.interval):
                    tally.skipped += 1
                continue
            while len(self._pending) >= self.max_outstanding:
                await asyncio.wait(self._pending, return_when=asyncio.FIRST_COMPLETED)
            self.sent += 1
            task = asyncio.ensure_future(self._one(due))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=self.target.timeout_s + HANG_MARGIN_S)
        for task in list(self._pending):
            task.cancel()
