"""The open loop (bench.load.loops.OpenLoop): its pacing (uniform or Poisson), its outstanding cap, its accounting and
the latency it charges from the schedule; the goodput steps' sorting of outcomes (bench.load.offered)."""

import asyncio
import itertools
import time
from collections.abc import Callable

import numpy as np
import pytest

from bench.load.loops import OpenLoop, arrival_offsets
from bench.load.offered import offer


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


def _in_flight_at_each_call(target: _Target, loop: Callable[[], OpenLoop]) -> list[int]:
    """The loop's calls in flight as each call starts (itself included), recorded by wrapping `target.call`."""
    seen: list[int] = []
    call = target.call

    async def counted():
        seen.append(loop().outstanding)
        return await call()

    target.call = counted
    return seen


def test_waiting_when_full_sends_every_scheduled_call_and_never_more_at_once():
    target = _Target(0.05)
    in_flight = _in_flight_at_each_call(target, lambda: loop)
    loop = OpenLoop(target, rate=200, max_outstanding=2, max_calls=20, wait_when_full=True)
    asyncio.run(loop.run(5.0))
    assert loop.sent == 20 and loop.total.skipped == 0 and loop.total.count() == 20
    assert max(in_flight) <= 2  # the call itself included
    assert loop.total.max_lag > 0.1  # its schedule slipped behind the cap instead of skipping


def test_poisson_arrivals_have_the_mean_rate_and_exponential_gaps():
    offsets = list(itertools.islice(arrival_offsets(100.0, poisson=True, seed=3), 20_000))
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and (gaps >= 0).all()
    assert 20_000 / offsets[-1] == pytest.approx(100.0, rel=0.03)  # the mean rate
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: as spread as they are long
    uniform = list(itertools.islice(arrival_offsets(100.0), 5))
    assert uniform == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04])


def test_a_seeded_poisson_schedule_is_replayed_exactly_and_another_seed_differs():
    def first(seed: int) -> list[float]:
        return list(itertools.islice(arrival_offsets(50.0, poisson=True, seed=seed), 5000))

    assert first(7) == first(7)
    assert first(7) != first(8)
    with pytest.raises(ValueError, match="must be > 0"):
        OpenLoop(_Target(0.0), rate=0, max_outstanding=1, max_calls=1, poisson=True)


def test_a_slow_server_does_not_slow_the_poisson_schedule_down():
    target = _Target(0.2)  # every answer takes 0.2 s: a closed loop of 2 would send 5 a second
    in_flight = _in_flight_at_each_call(target, lambda: loop)
    loop = OpenLoop(target, rate=200, max_outstanding=1000, max_calls=10_000, poisson=True, seed=1)
    asyncio.run(loop.run(0.5))
    scheduled = sum(1 for offset in itertools.takewhile(lambda o: o < 0.5, arrival_offsets(200, poisson=True, seed=1)))
    assert loop.sent == scheduled and loop.total.skipped == 0 and loop.total.count() == scheduled
    assert len(loop.lags) == scheduled
    assert max(in_flight) > 10  # calls overlapped: each went on its schedule, not after the previous answer


def test_latency_counts_from_the_scheduled_send_when_the_sender_stalls():
    """The first call holds the event loop 0.3 s: the calls due meanwhile go late, and are charged for it."""
    stall = 0.3

    class _Stalling(_Target):
        async def call(self):
            if self.calls == 0:
                time.sleep(stall)  # blocks the loop: a stalled sender (another process on the core, a GC pause)
            return await super().call()

    def run(from_schedule: bool) -> OpenLoop:
        loop = OpenLoop(
            _Stalling(0.0), rate=100, max_outstanding=1000, max_calls=10_000, poisson=True, seed=2,
            from_schedule=from_schedule,
        )  # fmt: skip
        asyncio.run(loop.run(0.6))
        return loop

    timed = run(from_schedule=True)
    due_in_stall = sum(
        1 for o in itertools.takewhile(lambda o: o < stall / 2, arrival_offsets(100, poisson=True, seed=2))
    )
    # Every call due in the stall's first half waited at least the other half, and its latency says so.
    assert (timed.total.ms() >= 1000 * stall / 2).sum() >= due_in_stall
    assert timed.lag_ms([100])[0] >= 1000 * stall / 2 and timed.total.max_lag >= stall / 2
    # Timed from the actual send, the wait before the send is not seen (coordinated omission).
    from_send = run(from_schedule=False)
    assert (from_send.total.ms() >= 1000 * stall / 2).sum() < (timed.total.ms() >= 1000 * stall / 2).sum()
    assert timed.sent == from_send.sent  # the same schedule: nothing skipped either way


def test_offer_sorts_every_scheduled_call_by_how_it_ended():
    """Each call's outcome is fixed by its own number, so every count is exact whatever the machine's load."""
    outcomes = [None, None, "UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "429", "TimeoutError", None]

    class _Mixed(_Target):
        name, model = "fake", "m"
        timeout_s = 60.0  # no call is cut off, however slowly it is scheduled
        wrong = 0

        async def call(self):
            number = self.calls  # before the await: calls started meanwhile do not shift it
            await super().call()
            outcome = outcomes[number % len(outcomes)]
            if outcome is None and number % 16 == 0:
                self.wrong += 1  # the target's own check found the answer wrong
            return outcome

    target = _Mixed(0.001)
    result = asyncio.run(offer(target, rate=400, seconds=0.5, seed=4))
    # The seeded schedule's calls within the 0.5 s; far fewer than the bound on calls in flight, so none is skipped.
    scheduled = sum(1 for _ in itertools.takewhile(lambda o: o < 0.5, arrival_offsets(400, poisson=True, seed=4)))
    assert result.scheduled == target.calls == scheduled > 100 and result.generator_refused == 0
    ended = [outcomes[n % len(outcomes)] for n in range(scheduled)]
    wrong = sum(1 for n in range(scheduled) if ended[n] is None and n % 16 == 0)
    assert (result.wrong, target.wrong) == (wrong, wrong) and wrong > 0
    assert result.answered == ended.count(None) - wrong
    assert result.refused == ended.count("UNAVAILABLE") + ended.count("429")
    assert result.timed_out == ended.count("DEADLINE_EXCEEDED") + ended.count("TimeoutError")
    assert result.other_errors == {"INTERNAL": ended.count("INTERNAL")}
    figures = result.as_dict()
    assert figures["refused_share"] == result.refused / scheduled
    assert figures["error_share"] == (scheduled - result.answered) / scheduled


def test_a_step_waits_until_the_server_has_worked_off_its_backlog():
    from bench.peers.goodput import SETTLE_POLL_S, settle

    busy_polls = 3
    readings = [0.0, *(SETTLE_POLL_S * (i + 1) for i in range(busy_polls)), *[SETTLE_POLL_S * busy_polls] * 9]
    read = iter(readings)
    asyncio.run(settle(lambda: next(read)))  # a core busy for 3 polls, then idle
    assert len(readings) - len(list(read)) == 1 + busy_polls + 1  # a first reading, then polls until an idle one
    idle = iter([0.0] * 9)
    asyncio.run(settle(lambda: next(idle)))
    assert len(list(idle)) == 7  # an idle server: a first reading and one poll
