"""A burst: many calls started at once on one target's channel, every one's latency kept by how it ended.

What the facade's in-flight limit does with a crowd: the accepted calls must come back right, the
refused ones (RESOURCE_EXHAUSTED) should learn it quickly.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from bench.load.stats import OK, Tally, percentiles
from bench.load.targets import GrpcTarget

REFUSED = "RESOURCE_EXHAUSTED"


@dataclass
class BurstResult:
    calls: int
    statuses: dict[str, int]
    wrong_outputs: int
    accepted_p50_ms: float
    accepted_p99_ms: float
    rejection_p50_ms: float
    rejection_p99_ms: float
    rejection_max_ms: float

    def summary(self) -> str:
        return (
            f"{self.calls} calls at once: {self.statuses}, wrong outputs {self.wrong_outputs}; refused in "
            f"p50 {self.rejection_p50_ms:.1f} ms, p99 {self.rejection_p99_ms:.1f} ms, max {self.rejection_max_ms:.1f} ms;"
            f" accepted p50 {self.accepted_p50_ms:.0f} ms, p99 {self.accepted_p99_ms:.0f} ms"
        )


async def burst(target: GrpcTarget, calls: int) -> BurstResult:
    """Start `calls` calls of `target` at once (on its one channel), each with its deadline; their latency by status."""
    tally = Tally()
    if not target.is_open:
        await target.open()

    async def one() -> None:
        started = time.perf_counter()
        status = await target.call() or OK
        tally.add(status, time.perf_counter() - started)

    await asyncio.gather(*(one() for _ in range(calls)))
    accepted = percentiles(tally.ms(OK), [50, 99])
    refused = percentiles(tally.ms(REFUSED), [50, 99, 100])
    return BurstResult(calls, tally.statuses, target.wrong, *accepted, *refused)
