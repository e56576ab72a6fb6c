"""The compiled generator (bench.load.compiled, bench/load/loadgen.c) against tiny servers of this process: a thread-pool
gRPC server and an aiohttp one, each answering as the fakes of test_bench_loadgen do. Outcomes are counted, never
timed: which calls were answered, refused, timed out or wrong, and that every answer was checked."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import numpy as np
import pytest
from aiohttp import web

from bench.load import compiled
from bench.load.http import HttpTarget
from bench.load.targets import FacadeTarget, KServeTarget
from tests.unit.test_bench_loadgen import Fake, _handlers

pytestmark = pytest.mark.timeout(60)
IMAGES = [np.full((1, 3, 224, 224), value, np.float32) for value in (1.0, 2.0)]


@pytest.fixture
def grpc_fake() -> Iterator[tuple[Fake, str]]:
    fake = Fake(delay_s=0.001)

    def unary(answer):
        def handler(body, context):
            time.sleep(fake.delay_s)
            response = answer(body)
            if response is None:
                context.abort(grpc.StatusCode.UNAVAILABLE, "queue full")
            return response

        return handler

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.max_receive_message_length", -1)])
    server.add_generic_rpc_handlers(
        tuple(_handlers(unary(fake.model_infer), unary(fake.predict), lambda request, context: fake.metadata(request)))
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield fake, f"127.0.0.1:{port}"
    server.stop(None)


def opened(target):
    asyncio.run(target.open())  # builds the requests (KServe's from the model's metadata)
    asyncio.run(target.close())
    return target


@pytest.mark.parametrize(("kind", "answer"), [(KServeTarget, 0.0), (FacadeTarget, 0.5)])
def test_every_answer_is_checked_against_its_requests_expected_output(grpc_fake, kind, answer):
    fake, url = grpc_fake
    # The fake answers `answer` everywhere: right for the first image, wrong for the second.
    expected = [np.full(1000, answer, np.float32), np.full(1000, answer + 1, np.float32)]
    target = opened(kind(url, "resnet50", 1, images=IMAGES, expected=expected))
    calls = compiled.run(target, 0.5, concurrency=2)
    assert len(calls.status) == fake.calls > 2
    assert set(calls.status[calls.request == 0]) == {compiled.GRPC_OK}
    assert set(calls.status[calls.request == 1]) == {compiled.WRONG}
    assert not fake.all_same  # the two images went out in turn
    assert calls.cpu_s > 0


def test_an_open_loop_sorts_every_scheduled_call_by_how_it_ended(grpc_fake):
    fake, url = grpc_fake
    fake.fail_every = 3
    target = opened(KServeTarget(url, "resnet50", 1, images=IMAGES[:1], expected=[np.zeros(1000, np.float32)]))
    result, cpu_s = compiled.offer(target, 200.0, 0.5, seed=7)
    assert result.scheduled == fake.calls > 0
    assert result.refused == fake.calls // 3  # every third call was refused, the others answered right
    assert result.answered + result.refused == result.scheduled
    assert result.generator_refused == 0 and result.wrong == 0 and result.timed_out == 0 and not result.other_errors
    assert compiled.offer(target, 200.0, 0.5, seed=7)[0].scheduled == result.scheduled  # the seed fixes the schedule
    assert result.p50_ms <= result.p99_ms and result.lag_p99_ms <= result.lag_max_ms and cpu_s > 0


def test_a_call_past_its_deadline_counts_as_timed_out(grpc_fake):
    fake, url = grpc_fake
    fake.delay_s = 1.0
    target = opened(FacadeTarget(url, "resnet50", 1, images=IMAGES[:1]))
    target.timeout_s = 0.1
    result, _ = compiled.offer(target, 20.0, 0.3, seed=1)
    assert result.scheduled > 0 and result.timed_out == result.scheduled and result.answered == 0


def test_a_closed_loop_keeps_its_concurrency_and_counts_the_window_after_the_warm_up(grpc_fake):
    fake, url = grpc_fake
    target = opened(FacadeTarget(url, "resnet50", 1, images=IMAGES[:1], expected=[np.full(1000, 0.5, np.float32)]))
    result = compiled.keep(target, 4, 0.4, warmup_s=0.2)
    assert result.requests > 0 and not result.errors and result.concurrency == 4
    assert result.requests + result.warmup_requests == fake.calls
    assert result.throughput_rps == pytest.approx(result.requests / result.seconds)
    assert result.p50_ms <= result.p95_ms <= result.p99_ms and result.client_cpu > 0


@pytest.fixture
def http_fake() -> Iterator[tuple[Fake, str]]:
    """An aiohttp server in a thread of its own: every third call 503, the others 1000 zeros per image."""
    fake, started, stop = Fake(fail_every=3), threading.Event(), threading.Event()
    address: list[str] = []

    async def predict(request: web.Request) -> web.Response:
        body = await request.read()
        if fake._count(body + request.headers["x-shape"].encode()):
            return web.Response(status=503, text="busy")
        return web.Response(body=b"\0" * 4000, content_type="application/octet-stream")

    async def serve() -> None:
        app = web.Application(client_max_size=1 << 26)
        app.router.add_post("/predict", predict)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        address.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        started.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    yield fake, address[0]
    stop.set()
    thread.join(10)


def test_http_answers_are_checked_and_refusals_counted(http_fake):
    fake, url = http_fake
    target = HttpTarget(url, 1, images=IMAGES, expected=[np.zeros(1000, np.float32), np.ones(1000, np.float32)])
    calls = compiled.run(target, 0.5, concurrency=2)
    labels = [calls.label(int(status)) for status in calls.status]
    assert len(labels) == fake.calls and labels.count("503") == fake.calls // 3
    answered = calls.status != 503
    assert set(calls.status[answered & (calls.request == 0)]) <= {200}
    assert set(calls.status[answered & (calls.request == 1)]) <= {compiled.WRONG}
    assert (answered & (calls.request == 0)).any() and (answered & (calls.request == 1)).any()


def test_an_unopened_grpc_target_and_an_unknown_one_are_refused():
    with pytest.raises(compiled.GeneratorError, match="open the target first"):
        compiled.wire(KServeTarget("127.0.0.1:1", "m", 1))
    with pytest.raises(compiled.GeneratorError, match="gRPC and HTTP targets only"):
        compiled.wire(object())  # type: ignore[arg-type]
