"""The supervisor's watchdog (tritonnx/server/watchdog.py), look by look, on scripted metrics, stubs and CPU times."""

from __future__ import annotations

import pytest

from tests.unit.test_supervisor import M, stub_table, triton_page
from tritonnx.server.watchdog import WATCHDOG_PARAMETER, Stall, Watchdog, watchdog_limit


def limits(seconds: float):
    asked = []

    def limit(version):
        asked.append(version)
        return seconds

    limit.asked = asked
    return limit


def test_requests_waiting_without_an_execution_finished_for_the_limit_are_a_stall():
    watchdog, limit = Watchdog(), limits(10.0)
    assert watchdog.look(0.0, triton_page(executions=5, successes=5), [], set(), limit) == []
    assert watchdog.look(1.0, triton_page(pending=2, executions=5, successes=5), [], set(), limit) == []
    assert limit.asked == []  # first seen waiting: not worth a question to Triton
    # Stopped stubs fail what Triton hands them: failures are no progress.
    assert watchdog.look(6.0, triton_page(pending=3, executions=5, successes=5, failures=4), [], set(), limit) == []
    assert watchdog.look(10.9, triton_page(pending=1, executions=5, successes=5, failures=9), [], set(), limit) == []
    [stall] = watchdog.look(11.0, triton_page(pending=1, executions=5, successes=5, failures=9), [], set(), limit)
    assert stall == Stall((M, "1"), 10.0, 10.0, 1, False)
    # Reported once, then timed anew (its stubs are killed and it is reloaded).
    assert watchdog.look(12.0, triton_page(pending=1, executions=5, successes=5, failures=9), [], set(), limit) == []
    assert len(watchdog.look(21.0, triton_page(pending=1, executions=5, successes=5), [], set(), limit)) == 1


def test_progress_restarts_the_clock_and_a_model_at_work_is_never_a_stall():
    watchdog, limit = Watchdog(), limits(10.0)
    for second in range(60):  # a long queue, but an execution finishes every few seconds
        page = triton_page(pending=8, executions=second // 3, successes=second // 3)
        assert watchdog.look(float(second), page, [], set(), limit) == []
    # Idle without progress is not a stall either: nothing waits.
    for second in range(60, 120):
        assert watchdog.look(float(second), triton_page(executions=19, successes=19), [], set(), limit) == []


def test_a_watchdog_of_0_seconds_is_off():
    watchdog, limit = Watchdog(), limits(0.0)
    for second in range(300):
        assert watchdog.look(float(second), triton_page(pending=1), [], set(), limit) == []
    assert limit.asked  # it was asked: 0 is the model's answer


def test_a_stub_stopped_for_the_limit_is_a_stall_even_with_nothing_waiting():
    """Triton fails each request it hands a stopped stub after a second, so nothing need wait in the queue."""
    watchdog, limit = Watchdog(), limits(10.0)
    stubs = list(stub_table("1", "1").values())
    victim = stubs[0].pid
    assert watchdog.look(0.0, triton_page(), stubs, set(), limit) == []
    assert watchdog.look(1.0, triton_page(failures=1), stubs, {victim}, limit) == []
    assert watchdog.look(10.9, triton_page(failures=9), stubs, {victim}, limit) == []
    [stall] = watchdog.look(11.0, None, stubs, {victim}, limit)  # metrics unreadable: the process state suffices
    assert stall.version == (M, "1") and stall.stopped and stall.pending == 0 and stall.seconds == 10.0
    # A stub continued before the limit is not one.
    watchdog = Watchdog()
    watchdog.look(0.0, None, stubs, {victim}, limit)
    watchdog.look(5.0, None, stubs, set(), limit)
    assert watchdog.look(12.0, None, stubs, {victim}, limit) == []


@pytest.mark.parametrize(
    ("parameters", "seconds"),
    [
        ({}, 60.0),
        ({WATCHDOG_PARAMETER: {"string_value": "300"}}, 300.0),
        ({WATCHDOG_PARAMETER: {"string_value": "0"}}, 0.0),
        ({WATCHDOG_PARAMETER: {"string_value": "soon"}}, 60.0),
        ({WATCHDOG_PARAMETER: {"string_value": "-5"}}, 60.0),
    ],
)
def test_a_models_config_sets_its_watchdog(parameters, seconds):
    assert watchdog_limit({"parameters": parameters}, 60.0) == seconds


def test_one_stub_computing_nothing_while_its_versions_requests_wait_is_killed_alone():
    """One instance of two hangs while the other serves: executions go on, so only the stubs' CPU tells."""
    watchdog, limit = Watchdog(), limits(10.0)
    hung, busy = stub_table("1", "1").values()
    for second in range(11):  # from the first look on, it computes nothing while requests wait
        page = triton_page(pending=6, executions=second * 40, successes=second * 40)  # the busy one's executions
        cpu = {hung.pid: 3.0 + second * 0.001, busy.pid: 3.0 + second * 0.9}
        stalls = watchdog.look(float(second), page, [hung, busy], set(), limit, cpu)
        if second < 10:
            assert stalls == [], second
    assert stalls == [Stall((M, "1"), 10.0, 10.0, 6, False, (hung.pid,))]


def test_an_idle_stub_is_no_stall_while_nothing_waits_or_once_it_computes():
    watchdog, limit = Watchdog(), limits(10.0)
    idle, busy = stub_table("1", "1").values()
    for second in range(40):
        # Requests wait only now and then (the busy instance keeps up): the idle one is not needed.
        page = triton_page(pending=2 if second % 3 == 0 else 0, executions=second * 40, successes=second * 40)
        cpu = {idle.pid: 1.0, busy.pid: second * 0.9}
        assert watchdog.look(float(second), page, [idle, busy], set(), limit, cpu) == []
    for second in range(40, 80):  # waiting all along, and the idle stub computes every few seconds
        page = triton_page(pending=5, executions=second * 40, successes=second * 40)
        cpu = {idle.pid: 1.0 + (second // 5) * 0.5, busy.pid: second * 0.9}
        assert watchdog.look(float(second), page, [idle, busy], set(), limit, cpu) == []
