"""The open-loop goodput mode of the peers benchmark (bench/peers/goodput.py): its rule and its steps."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math

import pytest

from bench.peers import goodput
from bench.peers.goodput import objective_ms, within


def step_record(rate: float, p99: float, errors: float = 0.0, answered: int = 100, **more) -> dict:
    """One offered step as the engine records it (the report's tests build theirs with it too)."""
    return {
        "offered_rps": rate,
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        "answered": answered,
        "error_share": errors,
        "refused_share": errors,
        "timed_out_share": 0.0,
        "lag_p99_ms": 0.5,
        "lag_max_ms": 2.0,
        **more,
    }


def test_goodput_is_the_highest_rate_within_the_objective_and_the_error_budget():
    steps = [step_record(10, 5), step_record(20, 8), step_record(30, 9.9), step_record(40, 12), step_record(50, 400)]
    assert goodput.goodput(steps, objective=10.0) == 30
    # Errors over 0.1% disqualify a step however fast its answers were; 0.1% itself is allowed.
    steps[2]["error_share"] = 0.0011
    assert goodput.goodput(steps, objective=10.0) == 20
    steps[1]["error_share"] = 0.001
    assert goodput.goodput(steps, objective=10.0) == 20
    # A step with no answers (all refused, p99 nan) keeps no promise; nothing kept gives 0.
    assert not within(step_record(5, math.nan, answered=0), 10.0)
    assert goodput.goodput([step_record(10, 11), step_record(20, 30)], objective=10.0) == 0.0


def test_the_objective_is_a_multiple_of_the_in_process_latency_with_a_floor():
    assert objective_ms(40.0) == pytest.approx(goodput.OBJECTIVE_FACTOR * 40.0)
    assert objective_ms(0.2) == goodput.OBJECTIVE_FLOOR_MS
    assert objective_ms(3.0, factor=10, floor_ms=1) == 30.0


class _Fake:
    """A target whose every answer takes `delay` seconds (the loops' Target, no server)."""

    name, model, batch, timeout_s, wrong = "fake", "m", 1, 1.0, 0

    def __init__(self, delay: float) -> None:
        self.delay, self.is_open = delay, False

    async def open(self, concurrency: int = 1) -> None:
        self.is_open = True

    async def close(self) -> None:
        self.is_open = False

    async def verify(self) -> None: ...

    async def call(self) -> str | None:
        await asyncio.sleep(self.delay)
        return None


def _args() -> argparse.Namespace:
    return argparse.Namespace(step_seconds=0.05, capacity_seconds=0.1, generator="python")


@pytest.fixture(autouse=True)
def _quick_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """One settle poll before each step, shortened: these fake servers are idle or nearly."""
    monkeypatch.setattr(goodput, "SETTLE_POLL_S", 0.01)


def _idle() -> float:
    """A server that used no CPU: every step starts after one settle poll."""
    return 0.0


def test_every_step_then_the_overloads_are_offered_once_a_goodput_is_found(monkeypatch: pytest.MonkeyPatch):
    # Every step with answers keeps the objective: whether this machine kept the generator's schedule (its lag) is
    # the judge's concern, tested on records above, not this loop's.
    monkeypatch.setattr(goodput, "within", lambda step, objective: step["answered"] > 0)
    record = asyncio.run(goodput._capacity_and_steps(_Fake(0.001), _args(), 1000.0, _idle))
    assert [step["factor"] for step in record["steps"]] == list(goodput.STEPS)
    assert record["goodput_rps"] == record["steps"][-1]["offered_rps"] > 0  # the highest step
    assert list(record["overloads"]) == ["1.5", "2.0"]
    assert record["overloads"]["2.0"]["offered_rps"] == pytest.approx(2 * record["goodput_rps"])


def test_lower_steps_are_tried_while_none_keeps_the_objective_and_no_goodput_means_no_overload():
    record = asyncio.run(goodput._capacity_and_steps(_Fake(0.02), _args(), 1.0, _idle))  # 20 ms answers, 1 ms
    assert [step["factor"] for step in record["steps"]] == [*goodput.STEPS, *goodput.LOW_STEPS]
    assert record["goodput_rps"] == 0.0 and record["overloads"] == {}


def test_refinement_bisects_between_the_goodput_and_the_next_rate_above_it(monkeypatch):
    offered = []

    async def step(target, rate, args, seed, server_cpu):  # p99 within a 10 ms objective below 70 req/s
        offered.append(rate)
        return step_record(rate, 5.0 if rate < 70 else 50.0)

    monkeypatch.setattr(goodput, "_step", step)
    steps = [step_record(50, 5.0), step_record(80, 50.0), step_record(100, 50.0)]
    asyncio.run(goodput._refine(_Fake(0.0), steps, 100.0, 10.0, _args(), _idle))
    assert offered == [65.0, 72.5]  # halfway to 80 kept it, halfway to 80 from 65 did not
    assert goodput.goodput(steps, 10.0) == 65.0 and steps[-1]["factor"] == 0.725


def test_each_step_records_the_cpu_the_server_and_the_generator_used():
    readings = itertools.count()  # the server's CPU: 1 ms more at every reading, idle by settle's measure

    def used() -> float:
        return next(readings) / 1000

    record = asyncio.run(goodput._capacity_and_steps(_Fake(0.001), _args(), 1000.0, used))
    step = record["steps"][0]
    assert step["server_cpu_s"] == pytest.approx(0.001) and step["client_cpu_s"] > 0 and step["settled_s"] > 0
