import asyncio
import socket

import grpc
import pytest
from tritonclient.grpc import model_config_pb2, service_pb2

from tritonnx.client.facade import replicas as replicas_module
from tritonnx.client.facade.errors import NotFound, Unavailable
from tritonnx.client.facade.gateway import TritonGateway
from tritonnx.client.facade.replicas import Replicas, channel_options


def rpc_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class FakeStub:
    """A replica's model-metadata calls: `outcome` if it is an error, else a model named `m`."""

    def __init__(self, replica: "FakeReplica") -> None:
        self._replica = replica

    async def ModelMetadata(self, request, timeout=None):  # noqa: N802 (gRPC's name)
        self._replica.calls += 1
        if isinstance(self._replica.outcome, Exception):
            raise self._replica.outcome
        return service_pb2.ModelMetadataResponse(name=request.name, versions=["1"])

    async def ModelConfig(self, request, timeout=None, metadata=None):  # noqa: N802
        if isinstance(self._replica.outcome, Exception):
            raise self._replica.outcome
        return service_pb2.ModelConfigResponse(config=model_config_pb2.ModelConfig(name=request.name, max_batch_size=8))

    async def RepositoryIndex(self, request, timeout=None, metadata=None):  # noqa: N802
        model = service_pb2.RepositoryIndexResponse.ModelIndex(name="m", version="1", state="READY")
        return service_pb2.RepositoryIndexResponse(models=[model])


class FakeReplica:
    """A replica that answers with `outcome` (a response or an error) and says whether it is live."""

    def __init__(self, address: str, outcome, live: bool) -> None:
        self.address, self.outcome, self._live, self.calls = address, outcome, live, 0
        self.rested = 0
        self.metadata = []
        self.stub = FakeStub(self)

    @property
    def down(self) -> bool:
        return self.rested > 0

    def rest(self) -> None:
        self.rested += 1

    async def model_infer(self, body, timeout=None, metadata=None):
        self.calls += 1
        self.metadata.append(metadata)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    async def live(self) -> bool:
        return self._live


def gateway_over(*fakes: FakeReplica) -> tuple[TritonGateway, list]:
    retried = []
    gateway = TritonGateway(",".join(f.address for f in fakes), 1 << 20, 30.0, on_retry=lambda: retried.append(1))
    gateway._replicas._replicas = {f.address: f for f in fakes}
    return gateway, retried


def test_a_call_whose_replica_went_away_goes_once_to_another():
    async def scenario():
        gone = FakeReplica("127.0.0.1:1", rpc_error(grpc.StatusCode.UNAVAILABLE, "Socket closed"), live=False)
        healthy = FakeReplica("127.0.0.1:2", "answer", live=True)
        gateway, retried = gateway_over(gone, healthy)
        traceparent = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)
        answers = [await gateway._infer_on_replicas(b"", 5.0, traceparent) for _ in range(4)]
        # The call sent again carries the caller's trace context too.
        assert gone.metadata == [traceparent] and healthy.metadata == [traceparent] * 4
        return answers, retried, gone.calls, healthy.calls

    answers, retried, gone_calls, healthy_calls = asyncio.run(scenario())
    assert answers == ["answer"] * 4
    # The first call finds it gone and is retried; the others skip it while it rests.
    assert len(retried) == gone_calls == 1 and healthy_calls == 4


def test_a_replica_that_answers_has_the_last_word():
    # A full queue is UNAVAILABLE too, but the replica still answers live: never sent elsewhere.
    async def scenario():
        full = FakeReplica("127.0.0.1:1", rpc_error(grpc.StatusCode.UNAVAILABLE, "Exceeds maximum queue size"), True)
        other = FakeReplica("127.0.0.1:2", "answer", live=True)
        gateway, retried = gateway_over(full, other)
        with pytest.raises(grpc.aio.AioRpcError):
            await gateway._infer_on_replicas(b"", 5.0)
        return retried, other.calls

    retried, other_calls = asyncio.run(scenario())
    assert retried == [] and other_calls == 0


def test_an_invalid_request_is_never_retried_and_one_server_has_no_retry():
    async def scenario():
        wrong = FakeReplica("127.0.0.1:1", rpc_error(grpc.StatusCode.INVALID_ARGUMENT), live=False)
        other = FakeReplica("127.0.0.1:2", "answer", live=True)
        gateway, retried = gateway_over(wrong, other)
        with pytest.raises(grpc.aio.AioRpcError):
            await gateway._infer_on_replicas(b"", 5.0)
        alone = FakeReplica("127.0.0.1:3", rpc_error(grpc.StatusCode.UNAVAILABLE), live=False)
        single, single_retried = gateway_over(alone)
        with pytest.raises(grpc.aio.AioRpcError):
            await single._infer_on_replicas(b"", 5.0)
        return retried, single_retried

    assert asyncio.run(scenario()) == ([], [])


def test_metadata_asked_of_a_replica_stopping_for_a_restart_comes_from_another():
    # A replica stopping (SIGTERM) unloads its models first and says NOT_FOUND, while it no longer answers live.
    async def scenario():
        stopping = FakeReplica("127.0.0.1:1", rpc_error(grpc.StatusCode.NOT_FOUND, "unknown model"), live=False)
        serving = FakeReplica("127.0.0.1:2", "answer", live=True)
        gateway, retried = gateway_over(stopping, serving)
        info = await gateway.model_info("m", "", 5.0)
        return info, retried, stopping.calls, serving.calls

    info, retried, stopping_calls, serving_calls = asyncio.run(scenario())
    assert (info.name, info.max_batch_size) == ("m", 8)
    assert retried == [1] and stopping_calls == serving_calls == 1


def test_a_model_no_replica_serves_is_not_found_after_one_retry():
    async def scenario():
        replicas = [FakeReplica(f"127.0.0.1:{p}", rpc_error(grpc.StatusCode.NOT_FOUND), live=True) for p in (1, 2)]
        gateway, retried = gateway_over(*replicas)
        with pytest.raises(NotFound) as raised:
            await gateway.model_info("nonexistent", "", 5.0)
        return raised.value.message, retried, [r.calls for r in replicas]

    message, retried, calls = asyncio.run(scenario())
    assert "'nonexistent'" in message and "ready models: m" in message
    assert retried == [] and calls == [1, 0]  # a live replica's NOT_FOUND is the answer: not sent elsewhere


def test_the_facade_maps_a_retry_that_fails_too_like_any_failure():
    async def scenario():
        first = FakeReplica("127.0.0.1:1", rpc_error(grpc.StatusCode.UNAVAILABLE), live=False)
        second = FakeReplica("127.0.0.1:2", rpc_error(grpc.StatusCode.UNAVAILABLE), live=False)
        gateway, retried = gateway_over(first, second)
        from tritonnx.client.facade.translate import InferCall

        with pytest.raises(Unavailable):
            await gateway.infer(InferCall(service_pb2.ModelInferRequest(model_name="m"), []), 5.0)
        return retried

    assert asyncio.run(scenario()) == [1]


def test_a_name_stands_for_every_address_it_resolves_to_and_picks_skip_replicas_down(monkeypatch):
    def resolve(host, port, type=0):
        assert host == "triton-headless"
        return [(socket.AF_INET, type, 6, "", (ip, port)) for ip in ("10.0.0.2", "10.0.0.1")]

    async def scenario():
        monkeypatch.setattr(replicas_module.socket, "getaddrinfo", resolve)
        replicas = Replicas("triton-headless:8001", channel_options(1 << 20))
        addresses = sorted(r.address for r in replicas._replicas.values())
        fixed = Replicas("127.0.0.1:8001", channel_options(1 << 20))
        picks = [replicas.pick().address for _ in range(4)]
        await replicas.close()
        await fixed.close()
        return addresses, replicas.fixed_single, fixed.fixed_single, picks

    addresses, named_single, fixed_single, picks = asyncio.run(scenario())
    assert addresses == ["10.0.0.1:8001", "10.0.0.2:8001"]
    assert not named_single and fixed_single  # shared memory only for one server at a fixed address
    assert sorted(picks) == ["10.0.0.1:8001", "10.0.0.1:8001", "10.0.0.2:8001", "10.0.0.2:8001"]
