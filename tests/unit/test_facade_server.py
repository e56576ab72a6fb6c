"""The facade in-process: a real `Facade` on free loopback ports, a real gRPC channel and HTTP
client, and a stand-in for Triton's gateway, so no tritonserver or subprocess is needed."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import replace

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2

from tests.unit.fakes import DOUBLE, FakeGateway
from tritonnx.client.facade.gateway import Gateway
from tritonnx.client.facade.health import PROBE_ID
from tritonnx.client.facade.server import Facade, StartupError
from tritonnx.client.facade.service import SERVICE_NAME, UNEXPECTED_FAILURE
from tritonnx.client.facade.settings import FacadeSettings
from tritonnx.client.facade.translate import InferCall, ModelInfo
from tritonnx.client.facade.wire import DecodedRequest, decode_predict_request
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc

# Well below the suite's per-test timeout: a test that hangs fails here, with its stack.
TEST_SECONDS = 10.0


def run(test: Callable[[], Coroutine[None, None, None]]) -> None:
    """Each test on an event loop of its own, as grpcio's own asyncio tests do."""
    asyncio.run(asyncio.wait_for(test(), TEST_SECONDS))


def settings(**overrides) -> FacadeSettings:
    # Ports 0: free ones; probes every 50 ms so health changes show within a test.
    fields = {"port": 0, "http_port": 0, "default_model": "double", "health_interval": 0.05, "health_timeout": 1.0}
    return FacadeSettings(**{**fields, **overrides})


@asynccontextmanager
async def serving(gateway: Gateway, **overrides) -> AsyncIterator[tuple[Facade, grpc.aio.Channel]]:
    facade = Facade(settings(**overrides), gateway)
    await facade.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{facade.grpc_port}") as channel:
            yield facade, channel
    finally:
        await facade.stop(0)


def request(request_id: str, values: list[float]) -> inference_pb2.PredictRequest:
    return inference_pb2.PredictRequest(request_id=request_id, data=values, shape=[1, len(values)])


def count(facade: Facade, metric: str, **labels: str) -> float:
    return facade.metrics.registry.get_sample_value(metric, labels) or 0.0


async def until(condition: Callable[[], bool]) -> None:
    """Wait for what another task does (bounded by TEST_SECONDS), instead of a fixed sleep."""
    while not condition():
        await asyncio.sleep(0.005)


def test_the_facade_binds_free_ports_and_answers_with_the_gateways_output():
    async def test() -> None:
        async with serving(FakeGateway()) as (facade, channel):
            assert facade.grpc_port > 0 and facade.http_port > 0 and facade.grpc_port != facade.http_port
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            response = await stub.Predict(request("r1", [1, 2, 3, 4.5]))
            assert list(response.predictions) == [2, 4, 6, 9] and list(response.shape) == [1, 4]
            assert response.request_id == "r1" and response.model_name == "double"
            assert not response.HasField("error")
            assert count(facade, "tritonnx_facade_requests_total", model="double", code="OK") == 1

    run(test)


def test_an_unexpected_exception_is_answered_internal_plainly_logged_and_counted(caplog):
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway) as (facade, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Predict(request("boom-1", [1, 2, 3, 4]))
            assert caught.value.code() == grpc.StatusCode.INTERNAL
            assert caught.value.details() == UNEXPECTED_FAILURE  # no class name, path or traceback
            assert count(facade, "tritonnx_facade_requests_total", model="double", code="INTERNAL") == 1
            assert count(facade, "tritonnx_facade_rejections_total", reason="internal") == 1
            assert facade.servicer.admission.in_flight == 0
            # The servicer goes on serving.
            response = await stub.Predict(request("r2", [0.5, 0, 0, 1]))
            assert list(response.predictions) == [1, 0, 0, 2]

    with caplog.at_level(logging.ERROR, logger="tritonnx.facade"):
        run(test)
    [record] = [r for r in caplog.records if r.name == "tritonnx.facade" and r.exc_info]
    assert record.exc_info[0] is RuntimeError and "secret.py" in str(record.exc_info[1])
    assert gateway.closed  # the facade owns the gateway it was given


def test_a_failing_request_in_a_stream_gets_an_error_response_and_the_stream_goes_on():
    gateway = FakeGateway()

    async def test() -> None:
        gateway.hold = asyncio.Event()
        async with serving(gateway) as (facade, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)

            async def requests() -> AsyncIterator[inference_pb2.PredictRequest]:
                for request_id, values in (("r1", [1, 1, 1, 1]), ("boom-2", [2, 2, 2, 2]), ("r3", [3, 0, 0, 3])):
                    yield request(request_id, values)

            call = stub.PredictStream(requests())
            # All three in flight at once: the failure comes while the stream waits for the others.
            await until(lambda: facade.servicer.admission.in_flight == 3)
            gateway.hold.set()
            responses = {response.request_id: response async for response in call}
            assert await call.code() == grpc.StatusCode.OK
            assert sorted(responses) == ["boom-2", "r1", "r3"]
            failed = responses["boom-2"]
            assert failed.error.code == grpc.StatusCode.INTERNAL.value[0]
            assert failed.error.message == UNEXPECTED_FAILURE and not failed.predictions
            assert list(responses["r1"].predictions) == [2, 2, 2, 2] and not responses["r1"].HasField("error")
            assert list(responses["r3"].predictions) == [6, 0, 0, 6] and not responses["r3"].HasField("error")
            assert count(facade, "tritonnx_facade_requests_total", model="double", code="OK") == 2
            assert count(facade, "tritonnx_facade_requests_total", model="double", code="INTERNAL") == 1

    run(test)


def test_health_follows_the_probe_inference_over_http_and_grpc():
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway) as (facade, channel), aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{facade.http_port}/health"
            grpc_health = health_pb2_grpc.HealthStub(channel)

            async def check() -> tuple[int, dict, int]:
                async with http.get(url) as answer:
                    body = await answer.json()
                status = (await grpc_health.Check(health_pb2.HealthCheckRequest(service=""))).status
                return answer.status, body, status

            code, body, status = await check()
            assert (code, body["status"], body["model"]) == (200, "SERVING", "double")
            assert status == health_pb2.HealthCheckResponse.SERVING

            gateway.down = True
            await until(lambda: not facade.monitor.report.serving)
            code, body, status = await check()
            assert (code, body["status"]) == (503, "NOT_SERVING") and body["detail"].startswith("UNAVAILABLE")
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING

            gateway.down = False
            await until(lambda: facade.monitor.report.serving)
            assert (await check())[0] == 200

    run(test)


def test_beyond_max_in_flight_calls_are_refused_with_resource_exhausted():
    gateway = FakeGateway()

    async def test() -> None:
        gateway.hold = asyncio.Event()
        async with serving(gateway, max_in_flight=1, retry_after_ms=150) as (facade, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            first = asyncio.ensure_future(stub.Predict(request("r1", [1, 2, 3, 4])))
            await until(lambda: facade.servicer.admission.in_flight == 1)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Predict(request("r2", [1, 2, 3, 4]))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert ("grpc-retry-pushback-ms", "150") in tuple(caught.value.trailing_metadata())
            assert count(facade, "tritonnx_facade_rejections_total", reason="overloaded") == 1
            gateway.hold.set()
            assert list((await first).predictions) == [2, 4, 6, 8]

    run(test)


def test_a_cancelled_call_is_counted_cancelled_and_frees_its_slot():
    gateway = FakeGateway()

    async def test() -> None:
        gateway.hold = asyncio.Event()
        async with serving(gateway) as (facade, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            call = stub.Predict(request("r1", [1, 2, 3, 4]))
            # Its slot is taken when the call starts, before its body is read: wait until the request reached the
            # gateway, so the cancelled call is one whose model is known.
            await until(lambda: gateway.held == 1)
            assert facade.servicer.admission.in_flight == 1
            call.cancel()
            await until(lambda: count(facade, "tritonnx_facade_requests_total", model="double", code="CANCELLED") == 1)
            assert gateway.held == 0
            await until(lambda: facade.servicer.admission.in_flight == 0)
            assert count(facade, "tritonnx_facade_requests_total", model="double", code="INTERNAL") == 0

    run(test)


def test_a_taken_port_is_a_startup_error_that_closes_the_gateway():
    async def test() -> None:
        async with serving(FakeGateway()) as (facade, _):
            for ports, protocol in (({"port": facade.grpc_port}, "gRPC"), ({"http_port": facade.http_port}, "HTTP")):
                gateway = FakeGateway()
                taken = next(iter(ports.values()))
                with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{taken} for {protocol}"):
                    await Facade(settings(**ports), gateway).start()
                assert gateway.closed

    run(test)


def test_the_ports_bound_are_reported_in_the_port_file_once_both_listen(tmp_path):
    port_file = tmp_path / "ports.json"

    async def test() -> None:
        async with serving(FakeGateway(), port_file=str(port_file)) as (facade, _):
            assert json.loads(port_file.read_text()) == {"grpc": facade.grpc_port, "http": facade.http_port}
            assert [p.name for p in tmp_path.iterdir()] == ["ports.json"]  # no partial file left beside it
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{facade.http_port}/metrics") as answer:
                    assert answer.status == 200

    run(test)


def test_a_port_file_that_cannot_be_written_is_a_startup_error(tmp_path):
    async def test() -> None:
        gateway = FakeGateway()
        with pytest.raises(StartupError, match="cannot write the port file"):
            await Facade(settings(port_file=str(tmp_path / "missing" / "ports.json")), gateway).start()
        assert gateway.closed

    run(test)


def test_calls_waiting_for_their_body_hold_receive_places_not_slots():
    """A call beyond the receive places is told RESOURCE_EXHAUSTED without sending its body; calls that sent their
    body are served meanwhile (the places of callers that send nothing are not their slots)."""
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway, max_in_flight=2, max_receiving=2) as (facade, channel):
            # Predict as a request stream on the client's side: the call starts, its body waits.
            predict = channel.stream_unary(
                f"/{SERVICE_NAME}/Predict",
                request_serializer=inference_pb2.PredictRequest.SerializeToString,
                response_deserializer=inference_pb2.PredictResponse.FromString,
            )
            bodies = [asyncio.Event() for _ in range(3)]
            sent = [False] * 3

            async def body(index: int) -> AsyncIterator[inference_pb2.PredictRequest]:
                await bodies[index].wait()
                sent[index] = True
                yield request(f"r{index}", [index, 1, 1, 1])

            first, second = (asyncio.ensure_future(predict(body(i))) for i in range(2))
            await until(lambda: facade.servicer.admission.receiving == 2)  # no body has been sent
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await predict(body(2))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not sent[2]
            assert "waiting for the bodies" in caught.value.details()
            assert facade.servicer.admission.in_flight == 0
            bodies[0].set()
            bodies[1].set()
            assert list((await first).predictions) == [0, 2, 2, 2]
            assert list((await second).predictions) == [2, 2, 2, 2]
            assert facade.servicer.admission.in_flight == 0 and facade.servicer.admission.receiving == 0

    run(test)


def test_callers_that_send_no_body_do_not_lock_out_a_priority_1_call():
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway, max_in_flight=4) as (facade, channel):
            predict = channel.stream_unary(f"/{SERVICE_NAME}/Predict")
            never = asyncio.Event()

            async def stalled() -> AsyncIterator[bytes]:
                await never.wait()
                yield b""

            stalled_calls = [asyncio.ensure_future(predict(stalled())) for _ in range(16)]
            await until(lambda: facade.servicer.admission.receiving == 16)
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            urgent = request("urgent", [1, 2, 3, 4])
            urgent.priority = 1
            assert list((await stub.Predict(urgent)).predictions) == [2, 4, 6, 8]
            assert list((await stub.Predict(request("plain", [1, 0, 0, 0]))).predictions) == [2, 0, 0, 0]
            for call in stalled_calls:
                call.cancel()
            await until(lambda: facade.servicer.admission.receiving == 0)

    run(test)


def test_a_body_that_never_arrives_gives_its_receive_place_back():
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway, body_timeout=0.2) as (facade, channel):
            predict = channel.stream_unary(f"/{SERVICE_NAME}/Predict")
            never = asyncio.Event()

            async def stalled() -> AsyncIterator[bytes]:
                await never.wait()
                yield b""

            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await predict(stalled())
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "did not arrive within 0.2 s" in caught.value.details()
            assert facade.servicer.admission.receiving == 0 and facade.servicer.admission.in_flight == 0
            assert count(facade, "tritonnx_facade_rejections_total", reason="deadline_exceeded") == 1

    run(test)


def test_the_last_quarter_of_the_slots_is_kept_for_high_priority_requests():
    gateway = FakeGateway()

    async def test() -> None:
        gateway.hold = asyncio.Event()
        async with serving(gateway, max_in_flight=4) as (facade, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            low = [asyncio.ensure_future(stub.Predict(request(f"low{i}", [i, 0, 0, 0]))) for i in range(3)]
            await until(lambda: facade.servicer.admission.in_flight == 3)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Predict(request("low3", [3, 0, 0, 0]))  # priority 0: the model's default level
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "are for priority 1" in caught.value.details()
            assert count(facade, "tritonnx_facade_rejections_total", reason="priority_reserve") == 1
            assert count(facade, "tritonnx_facade_rejection_duration_seconds_count", reason="priority_reserve") == 1
            high_request = request("high", [5, 0, 0, 0])
            high_request.priority = 1
            high = asyncio.ensure_future(stub.Predict(high_request))
            await until(lambda: facade.servicer.admission.in_flight == 4)
            gateway.hold.set()
            assert list((await high).predictions) == [10, 0, 0, 0]
            assert [list((await call).predictions)[0] for call in low] == [0, 2, 4]

    run(test)


def test_list_models_names_every_version_its_state_and_the_ready_ones_tensors():
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway) as (_, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            listed = await stub.ListModels(inference_pb2.ListModelsRequest())
            assert [(m.name, m.version, m.state) for m in listed.models] == [
                ("broken", "1", "UNAVAILABLE"),
                ("double", "1", "READY"),
            ]
            broken, double = listed.models
            assert broken.reason == "load failed: no model.onnx" and not broken.inputs
            assert [(t.name, t.datatype, list(t.shape)) for t in double.inputs] == [("x", "FP32", [-1, 4])]
            assert [(t.name, t.datatype, list(t.shape)) for t in double.outputs] == [("y", "FP32", [-1, 4])]
            assert double.max_batch_size == 8
            ready = await stub.ListModels(inference_pb2.ListModelsRequest(ready_only=True))
            assert [m.name for m in ready.models] == ["double"]

    run(test)


def test_a_malformed_list_models_request_is_invalid_argument_and_names_no_internals():
    """Found by the fuzz campaign: its deserializer raised, and gRPC answered UNKNOWN with DecodeError's class."""
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway) as (_, channel):
            list_models = channel.unary_unary(f"/{SERVICE_NAME}/ListModels")  # raw bytes in and out
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await list_models(b"\t\x01")  # field 1 with wire type 1 (fixed64), cut short
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details().startswith("malformed ListModelsRequest: ")
            assert "<class" not in caught.value.details()
            listed = inference_pb2.ListModelsResponse.FromString(await list_models(b""))
            assert [m.name for m in listed.models] == ["broken", "double"]

    run(test)


def test_a_refused_request_is_freed_when_answered_not_left_to_the_cycle_collector():
    """Found by fuzzing: the error's traceback held the request in a cycle, so megabyte requests piled up (GBs)."""
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway) as (_, channel):
            predict = channel.unary_unary(f"/{SERVICE_NAME}/Predict")  # raw bytes in and out
            body = inference_pb2.PredictRequest(
                model_name="double", shape=[1, 5], raw_data=bytes(20)
            ).SerializeToString()
            gc.collect()
            gc.disable()
            try:
                for _ in range(3):
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await predict(body)
                    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                alive = [o for o in gc.get_objects() if isinstance(o, DecodedRequest)]
            finally:
                gc.enable()
            assert alive == []

    run(test)


def test_a_cached_answer_is_byte_identical_and_another_shape_of_the_same_bytes_is_not_served_from_it():
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway, cache_models="double") as (facade, channel):
            predict = channel.unary_unary(f"/{SERVICE_NAME}/Predict")  # raw bytes in and out
            first = request("same", [1, 2, 3, 4, 5, 6, 7, 8])
            first.shape[:] = [2, 4]
            computed = await predict(first.SerializeToString())
            calls = gateway.inferences
            cached = await predict(first.SerializeToString())
            assert cached == computed and gateway.inferences == calls  # no second call to Triton
            other_shape = request("same", [1, 2, 3, 4, 5, 6, 7, 8])
            other_shape.shape[:] = [1, 8]  # the same bytes: not a hit (and refused: double takes [-1, 4])
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await predict(other_shape.SerializeToString())
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert count(facade, "tritonnx_facade_cache_requests_total", model="double", result="hit") == 1
            assert count(facade, "tritonnx_facade_cache_requests_total", model="double", result="miss") == 1

    run(test)


def test_a_failed_inference_is_not_cached():
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway, cache_models="double") as (facade, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            gateway.down = True
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Predict(request("r1", [1, 2, 3, 4]))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            gateway.down = False
            # The same request again: Triton answers it (the failure was not kept), then the cache does.
            for _ in range(2):
                response = await stub.Predict(request("r1", [1, 2, 3, 4]))
                assert list(response.predictions) == [2, 4, 6, 8]
            cache = facade.servicer.predictor.cache
            assert gateway.inferences == 1 and cache is not None and len(cache) == 1
            assert count(facade, "tritonnx_facade_cache_requests_total", model="double", result="miss") == 2
            assert count(facade, "tritonnx_facade_cache_requests_total", model="double", result="hit") == 1

    run(test)


class LaneGateway(FakeGateway):
    """`double` and, while `lane_served`, its latency lane `double_lane`: the same graph under a second name."""

    def __init__(self) -> None:
        super().__init__()
        self.lane_served = True
        self.models: list[str] = []  # the model each inference went to

    async def model_info(self, name: str, version: str, timeout: float | None = None) -> ModelInfo:
        if name == "double_lane" and self.lane_served:
            return replace(DOUBLE, name=name)
        return await super().model_info(name, version, timeout)

    async def infer(self, call: InferCall, timeout: float | None, metadata=()) -> service_pb2.ModelInferResponse:
        if call.header.id != PROBE_ID:
            self.models.append(call.header.model_name)
        response = await super().infer(call, timeout, metadata)
        response.model_name = call.header.model_name
        return response


def test_priority_1_calls_naming_no_version_go_to_the_models_lane_while_it_is_served():
    gateway = LaneGateway()

    async def test() -> None:
        async with serving(gateway, priority_lane=("double=double_lane",)) as (_, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            high = request("high", [1, 2, 3, 4])
            high.priority = 1
            answer = await stub.Predict(high)
            assert answer.model_name == "double_lane" and list(answer.predictions) == [2, 4, 6, 8]
            await stub.Predict(request("default", [1, 2, 3, 4]))  # priority 0: the model's default level
            pinned = request("pinned", [1, 2, 3, 4])
            pinned.priority, pinned.model_version = 1, "1"
            await stub.Predict(pinned)  # a version asked for is the model's own
            gateway.lane_served = False
            high.request_id = "high-without-lane"
            assert (await stub.Predict(high)).model_name == "double"

    run(test)
    assert gateway.models == ["double_lane", "double", "double", "double"]


@pytest.mark.parametrize("pair", ["double", "double=", "=lane", "double=double"])
def test_a_malformed_priority_lane_stops_the_facade_naming_it(pair):
    with pytest.raises(StartupError, match=f"--priority-lane '{pair}': give MODEL=LANE"):
        Facade(settings(priority_lane=(pair,)), FakeGateway())


def test_a_call_without_the_token_is_refused_before_its_body_is_read():
    async def test() -> None:
        async with serving(FakeGateway(), auth_token="s3cret") as (facade, channel):
            never = asyncio.Event()

            async def stalled() -> AsyncIterator[bytes]:
                await never.wait()
                yield b""

            # A body that never comes: a handler that read it first would answer only at the body deadline.
            for method in ("Predict", "Classify", "ListModels"):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await channel.stream_unary(f"/{SERVICE_NAME}/{method}")(stalled())
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
            stream = channel.stream_stream(f"/{SERVICE_NAME}/PredictStream")(stalled())
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stream.read()
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert facade.servicer.admission.receiving == 0
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            answer = await stub.Predict(request("r", [1, 1, 1, 1]), metadata=(("authorization", "Bearer s3cret"),))
            assert list(answer.predictions) == [2, 2, 2, 2]

    run(test)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "facade.example"])
def test_a_facade_reachable_from_elsewhere_needs_a_token_or_an_explicit_waiver(host):
    with pytest.raises(StartupError, match="TRITONNX_AUTH_TOKEN"):
        Facade(settings(host=host), FakeGateway())
    # Constructed, not started: the tests listen on loopback only.
    Facade(settings(host=host, auth_token="s3cret"), FakeGateway())
    Facade(settings(host=host, allow_unauthenticated=True), FakeGateway())


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_facade_on_loopback_needs_no_token(host):
    Facade(settings(host=host), FakeGateway())


class StreamContext:
    """What predict_stream asks of its call."""

    def time_remaining(self) -> None:
        return None

    def invocation_metadata(self) -> tuple:
        return ()


def test_a_stream_whose_answers_are_not_read_is_not_read_either():
    """Requests are read only while fewer than --stream-max-in-flight are served or unsent: a caller that stops
    reading holds at most that many in the facade (gRPC's flow control then holds its writes)."""

    async def test() -> None:
        facade = Facade(settings(stream_max_in_flight=4), FakeGateway())
        read = 0

        async def requests() -> AsyncIterator[DecodedRequest]:
            nonlocal read
            for i in range(1000):
                read += 1
                yield decode_predict_request(request(f"r{i}", [1, 2, 3, 4]).SerializeToString())

        responses = facade.servicer.predict_stream(requests(), StreamContext())
        first = await anext(responses)  # sent, as far as the servicer knows; the caller reads no more
        await until(lambda: read == 4 and facade.servicer.admission.in_flight == 0)
        for _ in range(100):  # every task that could run has run
            await asyncio.sleep(0)
        assert read == 4
        await anext(responses)  # one more sent: one more read
        await until(lambda: read == 5)
        await responses.aclose()
        assert first.message.request_id == "r0"
        await facade.gateway.close()

    run(test)
