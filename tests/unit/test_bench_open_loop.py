"""The open loop (bench.load.loops.OpenLoop): its pacing, its outstanding cap and its accounting."""

import asyncio
import time

from bench.load.loops import OpenLoop


class _Target:
    """Answers after a fixed delay, or once `release` is set; every third call fails with the given status."""

    timeout_s = 1.0

    def __init__(self, delay: float, status: str | None = None, release: asyncio.Event | None = None) -> None:
        self.delay, self.status, self.release, self.calls = delay, status, release, 0
        self.started: list[float] = []  # when each call started, by the loop's clock

    async def call(self):
        self.calls += 1
        number = self.calls  # this call's own: others may start while it sleeps
        self.started.append(time.perf_counter())
        if self.release is not None:
            await self.release.wait()
        else:
            await asyncio.sleep(self.delay)
        return self.status if self.status and number % 3 == 0 else None


def test_open_loop_sends_on_its_schedule_never_ahead_and_counts_statuses():
    target = _Target(0.001, "UNAVAILABLE")
    loop = OpenLoop(target, rate=200, max_outstanding=16, max_calls=10_000)
    before = time.perf_counter()
    asyncio.run(loop.run(0.5))
    total = loop.total
    assert loop.sent + total.skipped == 100  # 0.5 s of a 5 ms schedule: late calls are sent or skipped, never lost
    # No call goes before its turn, k periods after the schedule began (a late one goes at once, so no upper bound).
    assert all(at - before >= k * 0.005 - 1e-6 for k, at in enumerate(target.started))
    assert total.count() + total.errors.get("UNAVAILABLE", 0) == loop.sent
    assert total.errors.get("UNAVAILABLE", 0) == loop.sent // 3
    taken = loop.take()
    assert taken.statuses == total.statuses and loop.take().statuses == {}


def test_open_loop_skips_calls_beyond_the_outstanding_cap_and_stops_at_max_calls():
    async def scenario() -> OpenLoop:
        # No call ends before the whole schedule has been sent or skipped: only 2 can be in flight.
        release = asyncio.Event()
        slow = OpenLoop(_Target(0.0, release=release), rate=100, max_outstanding=2, max_calls=20)

        async def release_once_scheduled() -> None:
            while slow.sent + slow.total.skipped < 20:
                await asyncio.sleep(0.01)
            release.set()

        releasing = asyncio.ensure_future(release_once_scheduled())
        await slow.run(600.0)
        await releasing
        return slow

    slow = asyncio.run(scenario())
    assert slow.sent + slow.total.skipped == 20  # max_calls ends it, not the 600 s
    assert slow.sent == 2 and slow.total.skipped == 18 and slow.total.count() == 2


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
