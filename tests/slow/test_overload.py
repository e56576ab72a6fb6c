"""Three times the measured capacity, through the facade and directly to Triton (bench/overload.py,
shortened: `make chaos` runs it for 60 s per path). Every request ends as a correct answer or a
documented, quick rejection, and both servers stay up. The direct path is measured on the model with a
bounded queue (bench.overload.bounded): the demo models run a plain batcher, which bounds nothing."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bench.load.burst import BurstResult, burst
from bench.overload import REJECTIONS, bounded_repository, expected_outputs, held_requests, measure, path_target
from tests.helpers import wait_until
from tests.serving import FACADE_MAX_IN_FLIGHT, onnx_file
from tritonnx.client.facade.settings import FacadeSettings
from tritonnx.server.repository import CONFIG_FILE
from tritonnx.server.stack import ServingStack

MODEL = "resnet50"  # the slowest model: a cheap load generator still exceeds its capacity


@pytest.fixture(scope="module")
def bounded_stack(tmp_path_factory):
    """The model with a bounded queue, as a deployment exposing Triton's ports configures it (bench/overload.py)."""
    workdir = tmp_path_factory.mktemp("bounded")
    with ServingStack(bounded_repository(workdir / "repository", MODEL), workdir) as stack:
        yield stack


@pytest.mark.parametrize("route_name", ["facade", "direct"])
def test_three_times_capacity_gets_answers_or_quick_documented_rejections(request, route_name, gate):
    rng = np.random.default_rng(7)
    images = [rng.standard_normal((1, 3, 224, 224), dtype=np.float32) for _ in range(3)]
    expected = expected_outputs(onnx_file(MODEL), images)
    if route_name == "facade":
        triton, facade = request.getfixturevalue("triton"), request.getfixturevalue("facade")
    else:
        stack = request.getfixturevalue("bounded_stack")
        triton, facade = stack.triton, stack.facade
    url = facade.grpc_url if route_name == "facade" else triton.grpc_url
    target = path_target(route_name, url, MODEL, images, expected)
    pids = {"tritonserver": triton.process.pid, "facade": facade.process.pid}
    # Capacity is measured at the most the path holds: the facade's in-flight cap for default-priority requests (its
    # last quarter is kept for priority 1), the bounded model's queue and batches; above it a closed loop only spins on
    # rejections, and the idle memory measured after it counts the buffers the overload needs.
    if route_name == "facade":
        concurrency = FACADE_MAX_IN_FLIGHT - FACADE_MAX_IN_FLIGHT // 4
    else:
        concurrency = held_requests((triton.model_repository / MODEL / CONFIG_FILE).read_text())
    result = asyncio.run(
        measure(
            route_name,
            target,
            pids,
            seconds=10,
            capacity_seconds=5,
            reference_seconds=8,
            capacity_concurrency=concurrency,
        )
    )
    print(result.summary())

    assert set(result.statuses) == {"OK", REJECTIONS[route_name]}, result.statuses
    assert result.wrong_outputs == 0
    gate(result.accepted_rps > 0.5 * result.capacity_rps, "the overload did not collapse throughput")
    gate(result.rejection_p99_ms <= 50, f"rejections within 50 ms at p99: {result.rejection_p99_ms:.1f} ms")
    gate(result.accepted_p99_ms <= 2 * result.reference_p99_ms, "accepted p99 within twice the unloaded p99")
    for name, idle in result.memory_idle_mib.items():
        assert result.memory_after_mib[name] <= idle + max(0.1 * idle, 64), (name, result.summary())
    assert triton.process.poll() is None and facade.process.poll() is None
    wait_until(lambda: facade.health()[0] == 200, 15, "the facade healthy again")  # its probe may have met a full queue


def test_a_burst_of_large_calls_on_one_channel_is_refused_at_once_and_the_accepted_are_right(facade):
    """As many calls of ~600 KB at once as one connection may carry (bench/load/burst.py): the facade takes its in-flight
    limit and refuses the rest when each call starts, before its body; every accepted answer equals in-process ONNX
    Runtime's. (Past --max-streams-per-connection gRPC's core refuses the excess streams, UNAVAILABLE to the caller.)"""
    model = "mobilenet_v3_small"
    rng = np.random.default_rng(11)
    images = [rng.standard_normal((1, 3, 224, 224), dtype=np.float32) for _ in range(3)]
    target = path_target("facade", facade.grpc_url, model, images, expected_outputs(onnx_file(model), images))

    async def bursts() -> list[BurstResult]:
        try:
            return [await burst(target, FacadeSettings().max_streams_per_connection) for _ in range(2)]
        finally:
            await target.close()

    for result in asyncio.run(bursts()):
        print(result.summary())
        assert set(result.statuses) == {"OK", "RESOURCE_EXHAUSTED"}, result.statuses
        assert result.statuses["OK"] >= FACADE_MAX_IN_FLIGHT - FACADE_MAX_IN_FLIGHT // 4  # the rest: high priority
        assert result.wrong_outputs == 0
    assert facade.health()[0] == 200
