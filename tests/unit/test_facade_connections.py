"""What one connection may do before the facade closes it (client/facade/connections.py), and the pools of long-lived
calls: an in-process facade with a stand-in gateway, real gRPC clients and raw HTTP/2 connections
(bench/attacks/h2raw.py) for what no gRPC client sends. Outcomes only, synchronised on conditions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from bench.attacks.h2raw import INITIAL_WINDOW_SIZE, RawConnection
from tests.unit.fakes import FakeGateway
from tests.unit.test_facade_server import count, run, serving, until
from tritonnx.client.facade.connections import REFLECTION_REQUESTS, peer_address
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc

PREDICT = "/inference.InferenceService/Predict"
CHECK = health_pb2.HealthCheckRequest(service="")


async def _raw(port: int, settings: dict[int, int] | None = None, source: str = "") -> RawConnection:
    return await asyncio.to_thread(RawConnection, "127.0.0.1", port, settings, source=source)


async def _still_served(channel: grpc.aio.Channel) -> None:
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    response = await stub.Predict(inference_pb2.PredictRequest(data=[1, 2, 3, 4], shape=[1, 4]))
    assert list(response.predictions) == [2, 4, 6, 8]


def test_peer_strings_are_read_as_addresses():
    assert peer_address("ipv4:127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert peer_address("ipv6:[::1]:443") == ("::1", 443)
    assert peer_address("unix:/tmp/socket") is None


def test_a_connection_resetting_calls_before_their_body_is_closed_and_others_are_served():
    async def test() -> None:
        async with serving(FakeGateway(), max_resets_per_second=20) as (facade, channel):
            attacker = await _raw(facade.grpc_port)
            sent = await asyncio.to_thread(attacker.reset_calls, PREDICT, 5000)
            await until(attacker.closed.is_set)
            assert attacker.closed_at and sent <= 5000
            assert count(facade, "tritonnx_facade_connections_closed_total", reason="resets") == 1
            await _still_served(channel)
            attacker.close()

    run(test)


def test_a_connection_that_never_reads_its_answers_is_closed():
    async def test() -> None:
        async with serving(FakeGateway(), send_timeout=0.2) as (facade, channel):
            attacker = await _raw(facade.grpc_port, {INITIAL_WINDOW_SIZE: 0})
            for _ in range(20):
                attacker.call("/grpc.health.v1.Health/Check", CHECK.SerializeToString())
            await until(attacker.closed.is_set)
            assert attacker.closed_at
            assert count(facade, "tritonnx_facade_connections_closed_total", reason="unread") == 1
            await until(lambda: not facade.guard._unread)  # every call of that connection ended
            health = health_pb2_grpc.HealthStub(channel)
            assert (await health.Check(CHECK)).status == health_pb2.HealthCheckResponse.SERVING
            attacker.close()

    run(test)


def test_a_caller_on_an_address_of_its_own_keeps_its_receive_place_against_another_addresss_connections():
    async def test() -> None:
        async with serving(FakeGateway(), max_receiving=4) as (facade, channel):
            predict = channel.stream_unary(
                PREDICT,
                request_serializer=inference_pb2.PredictRequest.SerializeToString,
                response_deserializer=inference_pb2.PredictResponse.FromString,
            )
            body_due = asyncio.Event()

            async def body() -> AsyncIterator[inference_pb2.PredictRequest]:
                await body_due.wait()
                yield inference_pb2.PredictRequest(data=[1, 2, 3, 4], shape=[1, 4])

            upload = asyncio.ensure_future(predict(body()))  # from 127.0.0.1: the oldest call waiting for its body
            await until(lambda: facade.servicer.admission.receiving == 1)
            # Eight connections from another loopback address, each a call sending headers only: the last five
            # take the places of that address's own oldest calls, never the upload's.
            attackers = [await _raw(facade.grpc_port, source="127.0.0.2") for _ in range(8)]
            for attacker in attackers:
                attacker.send(attacker.headers(PREDICT))
            await until(lambda: facade.servicer.admission.places.evicted == 5)
            assert facade.servicer.admission.receiving == 4 and not upload.done()
            body_due.set()
            assert list((await upload).predictions) == [2, 4, 6, 8]
            for attacker in attackers:
                attacker.close()

    run(test)


def test_watch_streams_have_a_pool_of_their_own_and_end_at_the_servers_deadline():
    async def test() -> None:
        async with serving(FakeGateway(), max_health_watches=2, health_watch_seconds=0.3) as (facade, channel):
            health = health_pb2_grpc.HealthStub(channel)
            watches = [health.Watch(CHECK) for _ in range(2)]
            for watch in watches:
                assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            refused = health.Watch(CHECK)
            try:
                await refused.read()
                raise AssertionError("a third Watch was served")
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "health Watch streams" in error.details()
            for watch in watches:  # the server's deadline ends them, OK: the watcher watches again
                assert await watch.code() == grpc.StatusCode.OK
            assert (await health.Watch(CHECK).read()).status == health_pb2.HealthCheckResponse.SERVING
            await _still_served(channel)

    run(test)


def test_a_reflection_stream_past_its_requests_closes_its_connection():
    async def test() -> None:
        async with serving(FakeGateway()) as (facade, channel):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{facade.grpc_port}") as flooding:
                reflection = reflection_pb2_grpc.ServerReflectionStub(flooding)
                request = reflection_pb2.ServerReflectionRequest(list_services="")
                answers = 0
                try:
                    async for _ in reflection.ServerReflectionInfo(iter([request] * (REFLECTION_REQUESTS + 50))):
                        answers += 1
                    raise AssertionError("every reflection request was answered")
                except grpc.aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.UNAVAILABLE
                assert answers <= REFLECTION_REQUESTS
            assert count(facade, "tritonnx_facade_connections_closed_total", reason="reflection_flood") == 1
            await _still_served(channel)

    run(test)


def test_predict_streams_beyond_a_connections_share_are_refused():
    async def test() -> None:
        async with serving(FakeGateway(), max_predict_streams=4) as (facade, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            held = [stub.PredictStream() for _ in range(1)]  # a quarter of 4 for one connection
            request = inference_pb2.PredictRequest(data=[1, 2, 3, 4], shape=[1, 4])
            await held[0].write(request)
            assert list((await held[0].read()).predictions) == [2, 4, 6, 8]
            refused = stub.PredictStream()
            await refused.done_writing()
            assert await refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            await held[0].done_writing()
            assert await held[0].code() == grpc.StatusCode.OK

    run(test)


def test_an_idle_connection_gets_goaway_and_connections_past_the_cap_are_closed():
    async def test() -> None:
        async with serving(FakeGateway(), max_connection_idle=0.2, max_connections=3) as (facade, channel):
            await _still_served(channel)  # the channel's connection, the first
            idle = await _raw(facade.grpc_port)
            await until(lambda: idle.goaway is not None)  # gRPC's GOAWAY ("connection idle"), then its close
            await until(idle.closed.is_set)
            crowd = [await _raw(facade.grpc_port) for _ in range(4)]
            await until(lambda: any(raw.closed_at for raw in crowd))
            for raw in (idle, *crowd):
                raw.close()

    run(test)


def test_an_address_past_its_connections_loses_its_newest_and_other_addresses_keep_theirs():
    async def test() -> None:
        async with serving(FakeGateway(), max_connections_per_address=3) as (facade, channel):
            await _still_served(channel)  # from 127.0.0.1: one connection
            first = [await _raw(facade.grpc_port, source="127.0.0.2") for _ in range(3)]
            # Its three are within the cap: wait until a census has seen them, so that the next two are the newest.
            await until(lambda: sum(c[0] == "127.0.0.2" for c in facade.guard._first_seen) == 3)
            newest = [await _raw(facade.grpc_port, source="127.0.0.2") for _ in range(2)]
            await until(lambda: all(raw.closed.is_set() for raw in newest))
            assert count(facade, "tritonnx_facade_connections_closed_total", reason="per_address") == 2
            assert not any(raw.closed.is_set() for raw in first)
            await _still_served(channel)
            for raw in (*first, *newest):
                raw.close()

    run(test)


def test_a_connection_answered_lately_outlasts_its_addresses_silent_ones():
    async def test() -> None:
        async with serving(FakeGateway(), max_connections_per_address=2) as (facade, _):
            silent = [await _raw(facade.grpc_port, source="127.0.0.2") for _ in range(2)]
            await until(lambda: sum(c[0] == "127.0.0.2" for c in facade.guard._first_seen) == 2)
            facade.guard.max_per_address = 0  # no count while the newest connection gets its answer
            served = await _raw(facade.grpc_port, source="127.0.0.2")
            body = inference_pb2.PredictRequest(data=[1, 2, 3, 4], shape=[1, 4]).SerializeToString()
            stream = served.call(PREDICT, body)
            await until(lambda: stream in served.ended)
            facade.guard.max_per_address = 2
            await until(lambda: any(raw.closed.is_set() for raw in silent))
            assert sum(raw.closed.is_set() for raw in silent) == 1  # counted in one census: either is the newest
            assert not served.closed.is_set()
            for raw in (*silent, served):
                raw.close()

    run(test)


def test_the_http_port_closes_a_connection_whose_request_never_completes_and_serves_whole_ones():
    async def test() -> None:
        async with serving(FakeGateway(), http_request_timeout=0.3) as (facade, _):
            slow_reader, slow = await asyncio.open_connection("127.0.0.1", facade.http_port)
            slow.write(b"GET /metrics HTTP/1.1\r\nHost: facade\r\n")  # headers that never end
            reader, writer = await asyncio.open_connection("127.0.0.1", facade.http_port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: facade\r\n\r\n")
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            assert await slow_reader.read() == b""  # closed by the facade, nothing answered
            assert b"tritonnx_facade_" in await reader.read()  # the answer's rest, then EOF: idle, it is closed too
            slow.close()
            writer.close()

    run(test)
