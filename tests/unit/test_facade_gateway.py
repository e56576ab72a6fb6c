"""TritonGateway's own state and failure path, over the fake replicas of test_facade_replicas (no tritonserver)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from types import FrameType, TracebackType

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tests.unit.test_facade_replicas import FakeReplica, gateway_over, rpc_error
from tritonnx.client.facade import gateway as gateway_module
from tritonnx.client.facade.errors import NotFound, Unavailable
from tritonnx.client.facade.translate import InferCall


class FailingReplica(FakeReplica):
    """A replica whose every call fails with a new error of `code`, as a real channel's do (a shared error object
    would keep each traceback it was raised through, and the frames in it)."""

    def __init__(self, code: grpc.StatusCode, live: bool) -> None:
        super().__init__("127.0.0.1:1", code, live)

    @property  # type: ignore[override]
    def outcome(self) -> grpc.aio.AioRpcError:
        return rpc_error(self._code, "gone")

    @outcome.setter
    def outcome(self, code: grpc.StatusCode) -> None:
        self._code = code


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """Only reference counting frees objects: what stays alive is held by a reference cycle (or leaked)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_failed_inference_frees_its_request_without_the_cycle_collector(no_cycle_collector):
    async def scenario() -> weakref.ref:
        gateway, _ = gateway_over(FailingReplica(grpc.StatusCode.UNAVAILABLE, live=False))
        payload = np.ones(1 << 20, np.float32)  # a 4 MiB input, as a client's tensor
        freed = weakref.ref(payload)
        call = InferCall(service_pb2.ModelInferRequest(model_name="m"), [memoryview(payload).cast("B")])
        del payload
        with pytest.raises(Unavailable):
            await gateway.infer(call, 5.0)
        del call
        return freed

    assert asyncio.run(scenario())() is None


def test_a_failed_metadata_lookup_leaves_no_cycle(no_cycle_collector):
    async def scenario() -> None:
        gateway, _ = gateway_over(FailingReplica(grpc.StatusCode.UNAVAILABLE, live=True))
        with pytest.raises(Unavailable):
            await gateway.model_info("m", "", 5.0)

    asyncio.run(scenario())
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds stays in gc.garbage to be looked at
    try:
        gc.collect()
        # The fake replica and its stub refer to each other; a failure's error, traceback or frame must not be there.
        cyclic = [type(o).__name__ for o in gc.garbage if isinstance(o, (BaseException, TracebackType, FrameType))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cyclic == []


def test_the_metadata_cache_holds_at_most_its_bound_whatever_is_asked():
    async def scenario() -> list[int]:
        replica = FakeReplica("127.0.0.1:1", "answer", live=True)
        gateway, _ = gateway_over(replica)
        gateway._max_models = 3
        sizes = []
        for version in range(1, 11):
            await gateway.model_info("m", str(version), 5.0)
            sizes.append(gateway.metadata_entries())
        assert gateway.knows("m", "10") and not gateway.knows("m", "1")  # the least recently used went first
        return sizes

    assert asyncio.run(scenario()) == [1, 2, 3, 3, 3, 3, 3, 3, 3, 3]


def test_names_triton_does_not_serve_are_answered_from_its_list_for_a_moment(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(gateway_module.time, "monotonic", lambda: clock[0])

    async def scenario() -> None:
        replica = FakeReplica("127.0.0.1:1", rpc_error(grpc.StatusCode.NOT_FOUND), live=True)
        gateway, _ = gateway_over(replica)
        with pytest.raises(NotFound, match="ready models: m"):
            await gateway.model_info("nonexistent", "", 5.0)
        assert replica.calls == 1
        for name in (f"junk-{i}" for i in range(100)):
            with pytest.raises(NotFound, match=f"model '{name}' is not served; ready models: m"):
                await gateway.model_info(name, "", 5.0)
        assert replica.calls == 1  # Triton was not asked again
        clock[0] += gateway_module.SERVED_NAMES_TTL_S
        with pytest.raises(NotFound):
            await gateway.model_info("nonexistent", "", 5.0)
        assert replica.calls == 2  # the list is read again once it is a moment old

    asyncio.run(scenario())
