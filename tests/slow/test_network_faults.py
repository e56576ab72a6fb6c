"""Network faults between the facade and Triton: delay, loss, resets, a partition.

Triton runs in a network namespace of this module's, the facades outside it (tests/netfaults: the kernel drops and
resets packets on the link, a user-space proxy adds the delay this kernel's tc cannot). Each fault lasts a few
seconds under a bounded load of calls with a 2 s deadline. Asserted: every answer that came back is right, every
failure has a status the fault explains (never INTERNAL or UNKNOWN), no call outlived its deadline by a hang (the
load loop's own bound), traffic comes back once the fault is gone, and nothing is left behind: no call in flight,
no shared-memory slot held, no region in Triton but the facades'. How fast calls end and traffic recovers are
gates (`make chaos`). Needs root, iproute2 and nftables (`make apt`); skipped without them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.load.loops import run_load
from bench.load.stats import OK
from tests.helpers import metrics, wait_until
from tests.netfaults.link import unavailable
from tests.netfaults.stack import DEADLINE_S, FAULTS, NetStack, facade_regions, left_in_dev_shm

pytestmark = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")

FAULT_SECONDS = 3.0
CALLERS = 4
MAX_CALLS = 3000  # per fault (a reset fails calls fast): the load stops at this count or at FAULT_SECONDS
RECOVERY_GOAL_S = 2.0  # traffic back within this of the fault's end: a gate
DEADLINE_SLACK_S = 0.5  # a call ends within its deadline and this: a gate


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetStack]:
    with NetStack(Path(tmp_path_factory.mktemp("netfaults"))) as stack:
        pids = [facade.pid for facade in stack.facades.values()]
        yield stack
    assert not left_in_dev_shm(pids), "a stopped facade left its region in /dev/shm"


def test_inputs_cross_into_tritons_namespace_through_shared_memory(stack: NetStack) -> None:
    for facade in stack.facades:
        assert stack.answer(facade), f"the {facade} facade did not answer right"
    # Each facade's region is registered with Triton: the namespace separates the network, not /dev/shm.
    assert stack.regions() == {name for facade in stack.facades.values() for name in facade_regions(facade.pid)}
    assert stack.leaks() == []
    for facade in stack.facades.values():  # the gauge the leak check reads is there (a missing one reads 0)
        assert "tritonnx_facade_shm_slots_in_use" in {name for name, _, _ in metrics(facade.http_url).samples}


@pytest.mark.parametrize("name", list(FAULTS))
def test_a_fault_fails_calls_cleanly_and_traffic_comes_back(
    stack: NetStack, name: str, gate: Callable[[bool, str], None]
) -> None:
    fault = FAULTS[name]
    target = stack.target(fault.facade)
    stack.inject(fault)
    try:
        # Bounded in calls and time; a call that hung past its deadline would fail the load loop's own bound.
        result = asyncio.run(run_load(target, CALLERS, FAULT_SECONDS, warmup_s=0, max_requests=MAX_CALLS, verify=False))
        acted = stack.acted(fault)
    finally:
        stack.heal()
    statuses = target.tally.statuses
    print(f"{name} ({fault.how}): {statuses}, slowest call {target.slowest_s:.2f} s, acted on {acted}")
    assert acted > 0, f"the {name} fault never acted: its calls did not cross the broken link"
    assert target.wrong == 0, f"{target.wrong} answers differ from in-process ONNX Runtime's"
    assert sum(statuses.values()) == result.requests + sum(result.errors.values()) > 0
    assert set(statuses) - {OK} <= fault.allowed, f"{name}: statuses {statuses}, allowed {sorted(fault.allowed)}"
    gate(target.slowest_s <= DEADLINE_S + DEADLINE_SLACK_S, f"{name}: slowest call {target.slowest_s:.2f} s")

    recovered = stack.recovery(fault.facade, timeout=60.0)
    assert recovered is not None, f"no right answer within 60 s of the {name} fault's end"
    gate(recovered <= RECOVERY_GOAL_S, f"{name}: first right answer {recovered:.2f} s after the fault ended")
    wait_until(lambda: not stack.leaks(), 10.0, f"nothing left behind by the {name} fault: {stack.leaks()}")
    if name in ("loss", "delay"):
        assert statuses.get(OK), f"{name}: no call went through"
