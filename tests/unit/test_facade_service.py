import asyncio

import grpc
import pytest

from tritonnx.client.facade import errors, receiving
from tritonnx.client.facade.admission import Admission
from tritonnx.client.facade.metrics import FacadeMetrics


def test_admission_refuses_beyond_the_limit_with_a_retry_hint():
    admission = Admission(limit=2, retry_after_ms=150, metrics=FacadeMetrics())
    tickets = [admission.admit(10, priority=1), admission.admit(10, priority=1)]
    with pytest.raises(errors.Overloaded) as caught:
        admission.admit(10, priority=1)
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.trailing_metadata == (("grpc-retry-pushback-ms", "150"),)
    assert admission.in_flight == 2 and admission.in_flight_bytes == 20
    for ticket in tickets:
        admission.release(ticket)
    assert admission.in_flight == 0 and admission.in_flight_bytes == 0
    admission.release(admission.admit(10, priority=0))  # freed slots are usable again


def test_the_last_quarter_of_the_slots_is_for_priority_1():
    admission = Admission(limit=8, retry_after_ms=100, metrics=FacadeMetrics())
    held = [admission.admit(1, priority=0) for _ in range(6)]
    with pytest.raises(errors.PriorityReserved, match="last 2 slots are for priority 1"):
        admission.admit(1, priority=0)
    held += [admission.admit(1, priority=1), admission.admit(1, priority=1)]
    with pytest.raises(errors.Overloaded, match="its limit of 8"):
        admission.admit(1, priority=1)
    assert len(held) == 8


def test_the_byte_budget_refuses_a_body_that_would_exceed_it_but_takes_one_alone():
    admission = Admission(limit=64, retry_after_ms=100, metrics=FacadeMetrics(), max_bytes=100)
    alone = admission.admit(500, priority=0)  # larger than the budget, but nothing else is in flight
    with pytest.raises(errors.Overloaded, match="--max-in-flight-bytes"):
        admission.admit(1, priority=1)
    admission.release(alone)
    first = admission.admit(60, priority=0)
    with pytest.raises(errors.Overloaded, match="this one's 41 would exceed its limit of 100"):
        admission.admit(41, priority=0)
    second = admission.admit(40, priority=0)
    assert admission.in_flight_bytes == 100
    admission.release(first)
    admission.release(second)
    assert admission.in_flight == 0 and admission.in_flight_bytes == 0


async def _hold(admission: Admission, connection: str, release: asyncio.Event) -> object:
    """A call waiting for its body in a place until `release` is set (or it is cut)."""

    async def body() -> object:
        await release.wait()
        return "body"

    return await admission.receive(body, connection, 30.0)


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_receive_places_are_counted_apart_from_the_slots():
    async def test() -> None:
        metrics = FacadeMetrics()
        admission = Admission(limit=2, retry_after_ms=100, metrics=metrics, max_receiving=3)
        release = asyncio.Event()
        connections = ["ipv4:10.0.0.1:5000", "ipv4:10.0.0.1:5000", "ipv4:10.0.0.2:5000"]
        held = [asyncio.ensure_future(_hold(admission, connection, release)) for connection in connections]
        await _settle()
        assert metrics.registry.get_sample_value("tritonnx_facade_receiving_calls") == 3
        with pytest.raises(errors.Overloaded, match="bodies of its limit of 3 calls"):
            await _hold(admission, "ipv4:10.0.0.1:5000", release)  # its own connection holds the most: refused
        admission.release(admission.admit(1, priority=0))  # bodies that arrived are not held up by the others
        release.set()
        assert await asyncio.gather(*held) == ["body"] * 3
        assert admission.receiving == 0

    asyncio.run(test())


def test_one_connection_holds_at_most_its_share_of_the_receive_places():
    async def test() -> None:
        admission = Admission(limit=8, retry_after_ms=100, metrics=FacadeMetrics(), max_receiving=8,
                              max_receiving_per_connection=2)  # fmt: skip
        release = asyncio.Event()
        held = [asyncio.ensure_future(_hold(admission, "ipv4:10.0.0.1:5000", release)) for _ in range(2)]
        await _settle()
        with pytest.raises(errors.Overloaded, match="this connection has 2 calls waiting for their body"):
            await _hold(admission, "ipv4:10.0.0.1:5000", release)
        other = asyncio.ensure_future(_hold(admission, "ipv4:10.0.0.1:5001", release))  # another connection
        await _settle()
        assert admission.receiving == 3
        release.set()
        await asyncio.gather(*held, other)
        assert admission.receiving == 0 and len(admission.places) == 0

    asyncio.run(test())


def test_a_full_pool_gives_the_place_of_the_busiest_connections_oldest_call_to_a_newcomer():
    async def test() -> None:
        admission = Admission(limit=8, retry_after_ms=100, metrics=FacadeMetrics(), max_receiving=4)
        stalled, release = asyncio.Event(), asyncio.Event()
        attacker = [asyncio.ensure_future(_hold(admission, "ipv4:10.0.0.9:1", stalled)) for _ in range(3)]
        await _settle()
        lone = asyncio.ensure_future(_hold(admission, "ipv4:10.0.0.9:2", stalled))
        await _settle()
        newcomer = asyncio.ensure_future(_hold(admission, "ipv4:10.0.0.1:7", release))
        await _settle()
        assert attacker[0].done() and not any(call.done() for call in (*attacker[1:], lone, newcomer))
        with pytest.raises(errors.Overloaded, match="needed this call's place for another caller"):
            attacker[0].result()
        release.set()
        assert await newcomer == "body"
        stalled.set()
        await asyncio.gather(*attacker[1:], lone)
        assert admission.places.evicted == 1 and admission.receiving == 0

    asyncio.run(test())


def test_a_connection_whose_bodies_arrive_keeps_its_place_while_silent_ones_lose_theirs():
    async def test() -> None:
        admission = Admission(limit=8, retry_after_ms=100, metrics=FacadeMetrics(), max_receiving=3)
        prober, stalled, release = "ipv4:10.0.0.1:7", asyncio.Event(), asyncio.Event()

        async def arrived() -> str:
            return "body"

        assert await admission.receive(arrived, prober, 30.0) == "body"  # a connection whose bodies arrive
        probe = asyncio.ensure_future(_hold(admission, prober, release))  # its next call, the oldest waiting
        await _settle()
        silent = [asyncio.ensure_future(_hold(admission, f"ipv4:10.0.0.9:{i}", stalled)) for i in range(2)]
        await _settle()
        newcomer = asyncio.ensure_future(_hold(admission, "ipv4:10.0.0.9:99", stalled))
        await _settle()
        # Every connection holds one place; the oldest silent one's goes, not the older call of the prober.
        assert silent[0].done() and not probe.done() and not silent[1].done() and not newcomer.done()
        with pytest.raises(errors.Overloaded, match="needed this call's place"):
            silent[0].result()
        release.set()
        assert await probe == "body"
        stalled.set()
        await asyncio.gather(silent[1], newcomer)

    asyncio.run(test())


def test_a_caller_on_an_address_of_its_own_keeps_its_place_against_many_connections_of_another():
    async def test() -> None:
        admission = Admission(limit=8, retry_after_ms=100, metrics=FacadeMetrics(), max_receiving=3)
        stalled, release = asyncio.Event(), asyncio.Event()
        uploader = asyncio.ensure_future(_hold(admission, "ipv4:10.0.0.1:7", release))  # the oldest call waiting
        await _settle()
        attacker = [asyncio.ensure_future(_hold(admission, f"ipv4:10.0.0.9:{i}", stalled)) for i in range(2)]
        await _settle()
        newcomers = [asyncio.ensure_future(_hold(admission, f"ipv4:10.0.0.9:{i}", stalled)) for i in range(2, 5)]
        await _settle()
        # Every connection holds one place; the attacker's address holds the most, so its newcomers take the
        # places of its own oldest calls, never the uploader's.
        assert not uploader.done() and all(call.done() for call in (*attacker, newcomers[0]))
        for evicted in (*attacker, newcomers[0]):
            with pytest.raises(errors.Overloaded, match="its address or connection held more calls"):
                evicted.result()
        assert admission.places.evicted == 3
        # A newcomer from a third address takes a place of the address holding the most.
        third = asyncio.ensure_future(_hold(admission, "ipv6:[::1]:7", release))
        await _settle()
        assert newcomers[1].done() and not uploader.done() and not third.done()
        with pytest.raises(errors.Overloaded):
            newcomers[1].result()
        release.set()
        assert await uploader == "body" and await third == "body"
        stalled.set()
        await newcomers[2]
        assert admission.receiving == 0

    asyncio.run(test())


def test_a_burst_on_one_connection_is_refused_at_the_door():
    async def test() -> None:
        admission = Admission(limit=8, retry_after_ms=100, metrics=FacadeMetrics(), max_receiving=2,
                              max_receiving_per_connection=8)  # fmt: skip
        release = asyncio.Event()
        held = [asyncio.ensure_future(_hold(admission, "ipv4:10.0.0.9:1", release)) for _ in range(2)]
        await _settle()
        with pytest.raises(errors.Overloaded, match="limit of 2 calls"):
            await _hold(admission, "ipv4:10.0.0.9:1", release)  # its own connection holds the most: no victim
        release.set()
        assert await asyncio.gather(*held) == ["body", "body"]

    asyncio.run(test())


def test_bodies_on_their_way_past_the_byte_bound_cut_the_longest_waiting_calls(monkeypatch):
    async def test() -> None:
        admission = Admission(limit=8, retry_after_ms=100, metrics=FacadeMetrics(), max_receiving_bytes=100)
        resident = [1000]
        monkeypatch.setattr(receiving, "resident_bytes", lambda: resident[0])
        assert admission.places.sweep(message_bytes=50) == 0  # nothing received: the level it measures from
        release = asyncio.Event()
        calls = [asyncio.ensure_future(_hold(admission, f"ipv4:10.0.0.{i}:1", release)) for i in range(4)]
        await _settle()
        resident[0] = 1000 + 100  # at the bound: nothing cut
        assert admission.places.sweep(message_bytes=50) == 0
        resident[0] = 1000 + 160  # 60 bytes over, at most 50 a call: the two oldest
        assert admission.places.sweep(message_bytes=50) == 2
        await _settle()
        assert [call.done() for call in calls] == [True, True, False, False]
        for cut in calls[:2]:
            with pytest.raises(errors.Overloaded, match="--max-receiving-bytes"):
                cut.result()
        release.set()
        assert await asyncio.gather(*calls[2:]) == ["body", "body"]

    asyncio.run(test())


def test_a_body_that_does_not_arrive_in_time_is_a_deadline_and_a_cancel_before_it_is_a_reset():
    async def test() -> None:
        resets: list[str] = []
        admission = Admission(limit=8, retry_after_ms=100, metrics=FacadeMetrics(), on_reset=resets.append)
        with pytest.raises(errors.DeadlineExceeded, match="did not arrive within 0.01 s"):
            await admission.receive(asyncio.Event().wait, "ipv4:10.0.0.1:1", 0.01)
        waiting = asyncio.ensure_future(admission.receive(asyncio.Event().wait, "ipv4:10.0.0.1:2", 30.0))
        await _settle()
        waiting.cancel()  # as gRPC does when the caller resets the stream
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert resets == ["ipv4:10.0.0.1:2"] and admission.receiving == 0

    asyncio.run(test())
