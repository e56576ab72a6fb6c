"""Request priorities reach Triton's dynamic batcher, through tritonclient and through the facade.

A one-instance test model (tests/models/slow) with two priority levels and a bounded queue: a request
holds its instance until the test releases it, low-priority requests queue behind it, then a
high-priority one arrives; it must run next, before every low one queued ahead of it. Each step is
awaited on Triton's own state (the held request, the queue's length), never on time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.helpers import wait_until
from tests.kserve import make_inputs
from tests.serving import CHECKOUT, start_facade
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc
from tritonnx.server.prometheus import scrape
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack

SLOW = CHECKOUT / "tests" / "models" / "slow"
HIGH, LOW = 1, 2
HOLD_MS = -1.0  # the test model holds such a request until its `hold` file is gone
# Two levels, 1 high and 2 the default, as docs/facade.md configures a model whose priorities Triton keeps.
PRIORITY_BLOCK = "  priority_levels: 2\n  default_priority_level: 2\n"
QUEUE_SIZE = 8  # the test model's max_queue_size (its config.pbtxt)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("priority")
    config = (
        (SLOW / "config.pbtxt")
        .read_text()
        .replace("dynamic_batching {\n", "dynamic_batching {\n" + PRIORITY_BLOCK)
        .replace("default_timeout_microseconds: 500000", "default_timeout_microseconds: 30000000")
    )
    # slow_lane: the same model under a second name with an instance of its own, priority 1's latency lane.
    repository = link_models(workdir / "repository", {"slow": SLOW, "slow_lane": SLOW}, {"slow": config})
    facade_args = ["--default-model", "slow", "--health-interval", "60"]
    with ServingStack(repository, workdir, facade_args=facade_args) as serving:
        yield serving


def queued(stack: ServingStack) -> float:
    """Requests of the test model waiting in Triton's queue (not the one its instance runs)."""
    return scrape(stack.triton.metrics_url).value("nv_inference_pending_request_count", model="slow")


async def completion_order(stack: ServingStack, send: Callable[[float, int], Awaitable[None]]) -> list[str]:
    """Hold the instance, queue four low requests, then one high, release; the order they finish in."""
    folder: Path = stack.triton.model_repository / "slow"
    order: list[str] = []

    async def one(name: str, milliseconds: float, priority: int) -> None:
        await send(milliseconds, priority)
        order.append(name)

    async def until(condition: Callable[[], object], what: str) -> None:
        await asyncio.to_thread(wait_until, condition, 30, what)

    (folder / "hold").touch()
    try:
        tasks = [asyncio.ensure_future(one("first", HOLD_MS, LOW))]
        await until((folder / "holding").exists, "the instance holds the first request")
        tasks += [asyncio.ensure_future(one(f"low{i}", 0, LOW)) for i in range(4)]
        await until(lambda: queued(stack) == 4, "four low requests queued")
        tasks.append(asyncio.ensure_future(one("high", 0, HIGH)))
        await until(lambda: queued(stack) == 5, "the high request queued")
    finally:
        (folder / "hold").unlink()
    await asyncio.gather(*tasks)
    return order


def test_a_high_priority_request_overtakes_queued_low_ones_through_tritonclient(stack):
    async def run() -> list[str]:
        async with aioclient.InferenceServerClient(stack.triton.grpc_url) as client:

            async def send(milliseconds: float, priority: int) -> None:
                inputs = make_inputs({"milliseconds": np.array([[milliseconds]], np.float32)})
                await client.infer("slow", inputs, priority=priority)

            return await completion_order(stack, send)

    order = asyncio.run(run())
    assert order[:2] == ["first", "high"], order


def test_a_high_priority_request_overtakes_queued_low_ones_through_the_facade(stack):
    async def run() -> list[str]:
        async with grpc.aio.insecure_channel(stack.facade.grpc_url) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)

            async def send(milliseconds: float, priority: int) -> None:
                request = inference_pb2.PredictRequest(
                    data=[milliseconds], shape=[1, 1], model_name="slow", priority=priority
                )
                await stub.Predict(request, timeout=30)

            return await completion_order(stack, send)

    order = asyncio.run(run())
    assert order[:2] == ["first", "high"], order


def test_requests_beyond_the_queue_bound_are_refused_at_once_and_the_queued_ones_answered(stack):
    """A queue policy's bound, as a user configures one: the call past it is UNAVAILABLE, directly and through the
    facade, and the others run."""
    folder: Path = stack.triton.model_repository / "slow"
    with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
        inputs = lambda ms: make_inputs({"milliseconds": np.array([[ms]], np.float32)})  # noqa: E731
        done: list = []
        (folder / "hold").touch()
        try:
            client.async_infer("slow", inputs(HOLD_MS), lambda result, error: done.append(error))
            wait_until((folder / "holding").exists, 30, "the instance holds the first request")
            for _ in range(QUEUE_SIZE):
                client.async_infer("slow", inputs(0), lambda result, error: done.append(error), priority=LOW)
            wait_until(lambda: queued(stack) == QUEUE_SIZE, 30, "the queue full")
            with pytest.raises(InferenceServerException) as refused:
                client.infer("slow", inputs(0), priority=LOW)
            # Through the facade, Triton's refusal is UNAVAILABLE too, saying why.
            with grpc.insecure_channel(stack.facade.grpc_url) as channel, pytest.raises(grpc.RpcError) as through:
                predict = inference_pb2.PredictRequest(data=[0.0], shape=[1, 1], model_name="slow", priority=LOW)
                inference_pb2_grpc.InferenceServiceStub(channel).Predict(predict, timeout=30)
        finally:
            (folder / "hold").unlink()
        wait_until(lambda: len(done) == QUEUE_SIZE + 1, 30, "every queued request answered")
    assert refused.value.status() == "StatusCode.UNAVAILABLE"
    assert "Exceeds maximum queue size" in refused.value.message()
    assert through.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "cannot take the request now" in through.value.details() and "queue" in through.value.details()
    assert done == [None] * (QUEUE_SIZE + 1)


def test_without_priorities_the_queue_is_first_come_first_served(stack):
    """The check above can fail: all at the default level, the late request finishes last."""

    async def run() -> list[str]:
        async with aioclient.InferenceServerClient(stack.triton.grpc_url) as client:

            async def send(milliseconds: float, priority: int) -> None:
                inputs = make_inputs({"milliseconds": np.array([[milliseconds]], np.float32)})
                await client.infer("slow", inputs)

            return await completion_order(stack, send)

    order = asyncio.run(run())
    assert order[0] == "first" and order[-1] == "high", order


def test_with_a_lane_a_high_priority_call_is_answered_while_the_models_instance_is_held(stack, tmp_path):
    folder: Path = stack.triton.model_repository / "slow"
    facade = start_facade(stack.triton, tmp_path, "--default-model", "slow", "--priority-lane", "slow=slow_lane")

    async def run() -> inference_pb2.PredictResponse:
        async with grpc.aio.insecure_channel(facade.grpc_url) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)

            def call(milliseconds: float, priority: int) -> Awaitable[inference_pb2.PredictResponse]:
                request = inference_pb2.PredictRequest(
                    data=[milliseconds], shape=[1, 1], model_name="slow", priority=priority
                )
                return stub.Predict(request, timeout=30)

            (folder / "hold").touch()
            try:
                held = asyncio.ensure_future(call(HOLD_MS, LOW))
                await asyncio.to_thread(wait_until, (folder / "holding").exists, 30, "the instance holds a request")
                answer = await call(0, HIGH)
                # Answered while the model's only instance still holds its request: the lane's instance ran it.
                assert (folder / "holding").exists()
            finally:
                (folder / "hold").unlink()
            await held
            return answer

    try:
        answer = asyncio.run(run())
    finally:
        facade.stop()
    assert answer.model_name == "slow_lane" and list(answer.predictions) == [0.0]
