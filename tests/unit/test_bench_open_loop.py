"""The open loop (bench.load.loops.OpenLoop): its pacing, its outstanding cap and its accounting."""

import asyncio

from bench.load.loops import OpenLoop


class _Target:
    """Answers after a fixed delay; every third call fails with the given status."""

    timeout_s = 1.0

    def __init__(self, delay: float, status: str | None = None) -> None:
        self.delay, self.status, self.calls = delay, status, 0

    async def call(self):
        self.calls += 1
        number = self.calls  # this call's own: others may start while it sleeps
        await asyncio.sleep(self.delay)
        return self.status if self.status and number % 3 == 0 else None


def test_open_loop_keeps_its_rate_and_counts_statuses():
    target = _Target(0.001, "UNAVAILABLE")
    loop = OpenLoop(target, rate=200, max_outstanding=16, max_calls=10_000)
    asyncio.run(loop.run(0.5))
    total = loop.total
    assert 90 <= loop.sent <= 101 and total.skipped == 0
    assert total.count() + total.errors.get("UNAVAILABLE", 0) == loop.sent
    assert total.errors["UNAVAILABLE"] == loop.sent // 3
    taken = loop.take()
    assert taken.statuses == total.statuses and loop.take().statuses == {}


def test_open_loop_skips_calls_beyond_the_outstanding_cap_and_stops_at_max_calls():
    slow = OpenLoop(_Target(0.3), rate=100, max_outstanding=2, max_calls=20)
    asyncio.run(slow.run(5.0))
    assert slow.sent + slow.total.skipped == 20  # max_calls ends it long before the 5 s
    assert slow.sent <= 4 and slow.total.skipped >= 16 and slow.total.count() == slow.sent


def test_waiting_when_full_sends_every_scheduled_call_and_never_more_at_once():
    target = _Target(0.05)
    in_flight = []
    call = target.call

    async def counted():
        in_flight.append(loop.outstanding)
        return await call()

    target.call = counted
    loop = OpenLoop(target, rate=200, max_outstanding=2, max_calls=20, wait_when_full=True)
    asyncio.run(loop.run(5.0))
    assert loop.sent == 20 and loop.total.skipped == 0 and loop.total.count() == 20
    assert max(in_flight) <= 2  # the call itself included
    assert loop.total.max_lag > 0.1  # its schedule slipped behind the cap instead of skipping
