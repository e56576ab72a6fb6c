"""The load engine (bench.load targets, closed loop and burst), against tiny in-process servers (grpc.aio, sync
grpc, aiohttp): no Triton."""

from __future__ import annotations

import asyncio
import math
import time
from concurrent import futures
from functools import partial

import grpc
import numpy as np
import pytest
from aiohttp import web
from tritonclient.grpc import service_pb2

from bench.load.burst import burst
from bench.load.http import HttpTarget
from bench.load.loops import LoadResult, run, run_load
from bench.load.targets import FacadeTarget, KServeTarget, VerificationError
from tritonnx.client.proto import inference_pb2

pytestmark = pytest.mark.timeout(30)
# A window ended by max_requests: longer than the test's timeout, so the count, not the clock, ends it.
UNTIL_COUNT_S = 600.0

IMAGE_INPUTS = [("input", "FP32", [-1, 3, 224, 224])]
IMAGE_OUTPUTS = [("output", "FP32", [-1, 1000])]
TEXT_INPUTS = [("input_ids", "INT64", [-1, -1]), ("attention_mask", "INT64", [-1, -1])]
TEXT_OUTPUTS = [("logits", "FP32", [-1, 2]), ("embedding", "FP32", [-1, 64])]


class Fake:
    """The answers of a fake Triton + facade, counting calls and keeping the first request.

    `fail_every` = n makes every n-th call (1-based, all methods but metadata) fail with
    UNAVAILABLE; `wrong_dim` answers the second dim of every output one short."""

    def __init__(self, inputs=IMAGE_INPUTS, outputs=IMAGE_OUTPUTS, *, fail_every=0, delay_s=0.002, wrong_dim=False):
        self.inputs, self.outputs = inputs, outputs
        self.fail_every, self.delay_s, self.wrong_dim = fail_every, delay_s, wrong_dim
        self.calls = 0
        self.first: bytes | None = None
        self.all_same = True
        self._answers: dict[str, bytes] = {}

    def metadata(self, request: service_pb2.ModelMetadataRequest) -> service_pb2.ModelMetadataResponse:
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=request.name,
            versions=["1"],
            platform="python",
            inputs=[tensor(name=n, datatype=d, shape=s) for n, d, s in self.inputs],
            outputs=[tensor(name=n, datatype=d, shape=s) for n, d, s in self.outputs],
        )

    def _count(self, body: bytes) -> bool:
        """Record the call; True if it must fail."""
        self.calls += 1
        if self.first is None:
            self.first = body
        elif body != self.first:
            self.all_same = False
        return bool(self.fail_every) and self.calls % self.fail_every == 0

    def _shape(self, batch: int, dims) -> list[int]:
        shape = [batch, *dims[1:]]
        if self.wrong_dim and len(shape) > 1:
            shape[1] -= 1
        return shape

    def model_infer(self, body: bytes) -> bytes | None:
        if self._count(body):
            return None
        if "infer" not in self._answers:
            request = service_pb2.ModelInferRequest.FromString(body)
            batch = request.inputs[0].shape[0]
            response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1")
            for name, datatype, dims in self.outputs:
                shape = self._shape(batch, dims)
                response.outputs.add(name=name, datatype=datatype, shape=shape)
                response.raw_output_contents.append(np.zeros(shape, np.float32).tobytes())
            self._answers["infer"] = response.SerializeToString()
        return self._answers["infer"]

    def predict(self, body: bytes) -> bytes | None:
        if self._count(body):
            return None
        if "predict" not in self._answers:
            request = inference_pb2.PredictRequest.FromString(body)
            batch = request.inputs[0].shape[0] if request.inputs else request.shape[0]
            name, _, dims = self.outputs[0]
            shape = self._shape(batch, dims)
            response = inference_pb2.PredictResponse(shape=shape, predictions=[0.5] * math.prod(shape))
            if request.raw_data or request.inputs:
                for name, _, dims in self.outputs:
                    shape = self._shape(batch, dims)
                    response.outputs.add(
                        name=name, dtype=inference_pb2.FP32, shape=shape, raw_data=np.zeros(shape, np.float32).tobytes()
                    )
            self._answers["predict"] = response.SerializeToString()
        return self._answers["predict"]


def _aio_handler(fake: Fake) -> grpc.GenericRpcHandler:
    async def infer(body, context):
        await asyncio.sleep(fake.delay_s)
        answer = fake.model_infer(body)
        if answer is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "queue full")
        return answer

    async def predict(body, context):
        await asyncio.sleep(fake.delay_s)
        answer = fake.predict(body)
        if answer is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "queue full")
        return answer

    async def metadata(request, context):
        return fake.metadata(request)

    return _handlers(infer, predict, metadata)


def _handlers(infer, predict, metadata) -> list[grpc.GenericRpcHandler]:
    return [
        grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService",
            {
                "ModelInfer": grpc.unary_unary_rpc_method_handler(infer),  # bytes in, bytes out
                "ModelMetadata": grpc.unary_unary_rpc_method_handler(
                    metadata,
                    request_deserializer=service_pb2.ModelMetadataRequest.FromString,
                    response_serializer=service_pb2.ModelMetadataResponse.SerializeToString,
                ),
            },
        ),
        grpc.method_handlers_generic_handler(
            "inference.InferenceService",
            {
                "Predict": grpc.unary_unary_rpc_method_handler(predict),
            },
        ),
    ]


async def _aio_server(fake: Fake) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1)])
    for handler in _aio_handler(fake):
        server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def load(make_target, fake: Fake, **kwargs) -> LoadResult:
    """run_load on a fresh grpc.aio fake in one event loop."""

    async def scenario():
        server, url = await _aio_server(fake)
        try:
            return await run_load(make_target(url), **kwargs)
        finally:
            await server.stop(None)

    return asyncio.run(scenario())


def check_consistent(result: LoadResult, fake: Fake) -> None:
    assert result.requests + sum(result.errors.values()) + result.warmup_requests == fake.calls
    assert fake.all_same, "the same request bytes must be sent every time"
    if result.requests:
        assert 0 < result.p50_ms <= result.p95_ms <= result.p99_ms
        assert result.throughput_rps == pytest.approx(result.requests / result.seconds)
        assert result.images_per_s == pytest.approx(result.throughput_rps * result.batch)
    assert result.client_cpu > 0
    assert set(result.as_dict()) >= {
        "target",
        "model",
        "batch",
        "concurrency",
        "requests",
        "errors",
        "seconds",
        "throughput_rps",
        "images_per_s",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "client_cpu",
    }


def test_kserve_counts_latencies_and_request():
    fake = Fake()
    result = load(
        lambda url: KServeTarget(url, "resnet50", 2),
        fake,
        concurrency=3,
        duration_s=UNTIL_COUNT_S,
        warmup_s=0.2,
        max_requests=20,
    )
    assert (result.target, result.model, result.batch, result.concurrency) == ("triton-grpc", "resnet50", 2, 3)
    assert result.requests == 20 and result.errors == {}
    # The verification call, and one warm-up call per worker at least: each sends one as soon as it starts.
    assert result.warmup_requests >= 1 + 3
    check_consistent(result, fake)
    request = service_pb2.ModelInferRequest.FromString(fake.first)
    assert request.model_name == "resnet50"
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [("input", "FP32", [2, 3, 224, 224])]
    data = np.frombuffer(request.raw_input_contents[0], "<f4")
    assert data.size == 2 * 3 * 224 * 224 and 0.9 < data.std() < 1.1


def test_kserve_text_model_inputs_from_metadata():
    fake = Fake(TEXT_INPUTS, TEXT_OUTPUTS)
    result = load(
        lambda url: KServeTarget(url, "text_classifier", 4),
        fake,
        concurrency=2,
        duration_s=UNTIL_COUNT_S,
        warmup_s=0,
        max_requests=20,
    )
    assert result.requests == 20
    check_consistent(result, fake)
    request = service_pb2.ModelInferRequest.FromString(fake.first)
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
        ("input_ids", "INT64", [4, 16]),
        ("attention_mask", "INT64", [4, 16]),
    ]
    ids, mask = (np.frombuffer(raw, "<i8") for raw in request.raw_input_contents)
    assert ids.min() >= 1 and ids.max() < 1000 and (mask == 1).all()


def test_a_window_ended_by_its_duration_spans_it_and_each_worker_awaits_every_answer():
    delay, concurrency = 0.005, 4
    fake = Fake(delay_s=delay)
    result = load(lambda url: KServeTarget(url, "m", 1), fake, concurrency=concurrency, duration_s=0.5, warmup_s=0.2)
    # The nominal span (a slow machine only makes it longer; the event loop's timer may fire a clock tick early) ...
    assert result.seconds >= 0.5 - 0.01
    # ... in which a worker sends its next call only after the answer to its last, which takes `delay` at least.
    sent = result.requests + sum(result.errors.values())
    assert 0 < sent <= concurrency * (result.seconds / delay + 1)
    check_consistent(result, fake)


def test_max_requests_is_exact():
    fake = Fake()
    result = load(
        lambda url: KServeTarget(url, "m", 1),
        fake,
        concurrency=3,
        duration_s=UNTIL_COUNT_S,
        warmup_s=0.1,
        max_requests=7,
    )
    assert result.requests == 7 and result.errors == {}
    assert result.seconds < UNTIL_COUNT_S  # the count ended the window, not the clock
    check_consistent(result, fake)


def test_errors_counted_by_code():
    # Concurrency 1 and no warm-up: call 1 verifies, calls 2..10 are measured; calls 3, 6 and 9 fail.
    fake = Fake(fail_every=3)
    result = load(
        lambda url: KServeTarget(url, "m", 1), fake, concurrency=1, duration_s=UNTIL_COUNT_S, warmup_s=0, max_requests=9
    )
    assert result.warmup_requests == 1 and fake.calls == 10
    assert result.errors == {"UNAVAILABLE": 3} and result.requests == 6
    check_consistent(result, fake)

    fake = Fake(fail_every=3)
    result = load(
        lambda url: FacadeTarget(url, "resnet50", 1),
        fake,
        concurrency=4,
        duration_s=UNTIL_COUNT_S,
        warmup_s=0.1,
        max_requests=12,
    )
    assert set(result.errors) == {"UNAVAILABLE"} and result.requests + result.errors["UNAVAILABLE"] == 12
    check_consistent(result, fake)


class MismatchedOutputs(Fake):
    """Metadata lists the two text outputs, ModelInfer answers the one image output."""

    def metadata(self, request):
        response = super().metadata(request)
        del response.outputs[:]
        for name, datatype, dims in TEXT_OUTPUTS:
            response.outputs.add(name=name, datatype=datatype, shape=dims)
        return response


def test_kserve_verification_rejects_wrong_shape():
    fake = Fake(wrong_dim=True)
    with pytest.raises(VerificationError, match=r"output 'output' has shape \[1, 999\], expected \[1, 1000\]"):
        load(lambda url: KServeTarget(url, "resnet50", 1), fake, concurrency=1, duration_s=0.2)
    assert fake.calls == 1  # no load after a failed verification
    with pytest.raises(VerificationError, match=r"response has outputs \['output'\].*\['embedding', 'logits'\]"):
        load(lambda url: KServeTarget(url, "m", 1), MismatchedOutputs(), concurrency=1, duration_s=0.2)


def test_first_call_failure_raises():
    with pytest.raises(VerificationError, match="first call failed: UNAVAILABLE: queue full"):
        load(lambda url: FacadeTarget(url, "resnet50", 1), Fake(fail_every=1), concurrency=2, duration_s=0.2)


def test_facade_raw_and_named_requests():
    fake = Fake()
    result = load(
        lambda url: FacadeTarget(url, "mobilenet_v3_small", 2),
        fake,
        concurrency=2,
        duration_s=UNTIL_COUNT_S,
        warmup_s=0,
        max_requests=10,
    )
    assert result.target == "facade" and result.requests == 10
    check_consistent(result, fake)
    request = inference_pb2.PredictRequest.FromString(fake.first)
    assert request.model_name == "mobilenet_v3_small" and list(request.shape) == [2, 3, 224, 224]
    assert len(request.raw_data) == 2 * 3 * 224 * 224 * 4 and request.dtype == inference_pb2.FP32
    assert len(request.data) == 0

    fake = Fake(TEXT_INPUTS, TEXT_OUTPUTS)
    text = {"input_ids": np.arange(48).reshape(3, 16), "attention_mask": np.ones((3, 16), np.int64)}
    result = load(
        lambda url: FacadeTarget(url, "text_classifier", 3, images=[text]),
        fake,
        concurrency=1,
        duration_s=UNTIL_COUNT_S,
        warmup_s=0,
        max_requests=5,
    )
    assert result.requests == 5
    request = inference_pb2.PredictRequest.FromString(fake.first)
    assert [(t.name, t.dtype, list(t.shape)) for t in request.inputs] == [
        ("input_ids", inference_pb2.INT64, [3, 16]),
        ("attention_mask", inference_pb2.INT64, [3, 16]),
    ]


def test_facade_verification_rejects_wrong_batch():
    class WrongBatch(Fake):
        def predict(self, body):
            self._count(body)
            return inference_pb2.PredictResponse(shape=[1, 1000], predictions=[0.0] * 1000).SerializeToString()

    with pytest.raises(VerificationError, match=r"response shape \[1, 1000\], expected the batch 4 first"):
        load(lambda url: FacadeTarget(url, "resnet50", 4), WrongBatch(), concurrency=1, duration_s=0.2)

    class Garbage(Fake):
        def predict(self, body):
            self._count(body)
            return b"\xff\xff\xff"

    with pytest.raises(VerificationError, match=r"first response \(3 bytes\) is not a inference.PredictResponse"):
        load(lambda url: FacadeTarget(url, "resnet50", 1), Garbage(), concurrency=1, duration_s=0.2)


def _made(made: list, kind, url: str, **options):
    """A target of `kind`, kept in `made` for the test to read after the run."""
    made.append(kind(url, "resnet50", 1, **options))
    return made[-1]


def test_given_images_are_sent_in_turn_and_every_answer_is_checked():
    images = [np.full((1, 3, 224, 224), value, np.float32) for value in (1.0, 2.0)]
    for kind, answer in ((KServeTarget, 0.0), (FacadeTarget, 0.5)):  # what the fake answers
        # The first image's expected output is the fake's answer, the second's is not.
        expected = [np.full(1000, answer, np.float32), np.full(1000, answer + 1, np.float32)]
        fake, made = Fake(), []
        result = load(
            partial(_made, made, kind, images=images, expected=expected),
            fake,
            concurrency=1,
            duration_s=UNTIL_COUNT_S,
            warmup_s=0,
            max_requests=6,
        )
        assert result.requests == 6 and result.requests + result.warmup_requests == fake.calls
        assert not fake.all_same
        # The verification call is not compared; the 6 calls alternate, from the first image.
        assert made[0].wrong == 3
        second = made[0].payloads[1]
        if kind is KServeTarget:  # named as the model's metadata names its input
            request = service_pb2.ModelInferRequest.FromString(second)
            assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
                ("input", "FP32", [1, 3, 224, 224])
            ]
            data = request.raw_input_contents[0]
        else:
            request = inference_pb2.PredictRequest.FromString(second)
            assert list(request.shape) == [1, 3, 224, 224] and request.dtype == inference_pb2.FP32
            data = request.raw_data
        assert (np.frombuffer(data, "<f4") == 2.0).all()
    with pytest.raises(ValueError, match="a batch of 2"):
        FacadeTarget("127.0.0.1:1", "resnet50", 2, images=images)
    with pytest.raises(ValueError, match="one array of images each"):
        FacadeTarget("127.0.0.1:1", "resnet50", 1, images=images, expected=expected[:1])


async def _http_server(fake: Fake, body_bytes_per_image: int = 4000):
    async def predict(request: web.Request) -> web.Response:
        body = await request.read()
        await asyncio.sleep(fake.delay_s)
        if fake._count(body + request.headers["x-shape"].encode()):
            return web.Response(status=503, text="busy")
        batch = int(request.headers["x-shape"].split(",")[0])
        assert len(body) == batch * 3 * 224 * 224 * 4
        return web.Response(body=b"\0" * (batch * body_bytes_per_image), content_type="application/octet-stream")

    app = web.Application(client_max_size=1 << 26)
    app.router.add_post("/predict", predict)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def http_load(fake: Fake, batch: int, body_bytes_per_image: int = 4000, **kwargs) -> LoadResult:
    async def scenario():
        runner, url = await _http_server(fake, body_bytes_per_image)
        try:
            return await run_load(HttpTarget(url, batch), **kwargs)
        finally:
            await runner.cleanup()

    return asyncio.run(scenario())


def test_http_counts_errors_and_verification():
    fake = Fake(fail_every=3)
    result = http_load(fake, 2, concurrency=3, duration_s=UNTIL_COUNT_S, warmup_s=0.1, max_requests=12)
    assert result.target == "fastapi" and result.requests + result.errors["503"] == 12
    assert set(result.errors) == {"503"}
    check_consistent(result, fake)
    assert fake.first.endswith(b"2,3,224,224")

    with pytest.raises(VerificationError, match="999 output values, expected 1000"):
        http_load(Fake(), 1, body_bytes_per_image=3996, concurrency=1, duration_s=0.2)


@pytest.fixture
def sync_server():
    """A thread-pool grpc server, for the sync `run` and the CLI (each runs its own event loop)."""
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


def test_run_sync_wrapper_reuses_target(sync_server):
    fake, url = sync_server
    target = KServeTarget(url, "resnet50", 1)
    first = run(target, 2, UNTIL_COUNT_S, warmup_s=0, max_requests=6)
    second = run(target, 1, UNTIL_COUNT_S, warmup_s=0, max_requests=4)  # a new loop and channel, the same bytes
    assert (first.requests, second.requests) == (6, 4)
    assert not target.is_open
    assert fake.calls == first.warmup_requests + 6 + second.warmup_requests + 4 and fake.all_same


def test_arguments_are_checked():
    target = KServeTarget("127.0.0.1:1", "m", 1)
    for kwargs in (
        {"concurrency": 0, "duration_s": 1},
        {"concurrency": 1, "duration_s": 0},
        {"concurrency": 1, "duration_s": 1, "max_requests": 0},
    ):
        with pytest.raises(ValueError):
            asyncio.run(run_load(target, **kwargs))


def test_unreachable_server_fails_clearly_and_closes():
    target = KServeTarget("127.0.0.1:1", "resnet50", 1)
    with pytest.raises(VerificationError, match="ModelMetadata of 'resnet50' at 127.0.0.1:1 failed: UNAVAILABLE"):
        run(target, 1, 0.2)
    assert not target.is_open


def test_a_burst_sends_every_call_at_once_and_tallies_them_by_status():
    fake = Fake(fail_every=4)

    async def scenario():
        server, url = await _aio_server(fake)
        target = KServeTarget(url, "m", 1)
        try:
            return await burst(target, 20)
        finally:
            await target.close()
            await server.stop(None)

    result = asyncio.run(scenario())
    assert result.calls == fake.calls == 20 and result.statuses == {"OK": 15, "UNAVAILABLE": 5}
    assert result.wrong_outputs == 0 and 0 < result.accepted_p50_ms <= result.accepted_p99_ms
    assert math.isnan(result.rejection_p99_ms)  # none was refused for the in-flight limit (RESOURCE_EXHAUSTED)
