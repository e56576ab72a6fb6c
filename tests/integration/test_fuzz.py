"""A bounded fuzz campaign against a live facade in front of a real tritonserver.

Hypothesis builds `PredictRequest`s (valid ones for every model, and ones with odd fields: every dtype, shapes
with negative, zero, huge and overflowing dims, lengths that disagree, unknown names), `ClassifyRequest`s
(real images, and files that lie about their format), `ListModelsRequest`s and PredictStreams of them, then
often mutates the serialized bytes (tests/fuzz.py: bit flips, truncations, lying lengths, duplicated,
unknown and mistyped fields, huge repeated fields, non-UTF-8 strings). Everything goes through a raw channel,
bytes in and bytes out. Each call must end before its deadline with a documented status (client/facade/errors.py;
never INTERNAL: that is a model failure or a facade bug) and no server internals in its message; a valid
request must get ONNX Runtime's answer. After each campaign nothing is in flight and the facade still serves.

`FUZZ_SECONDS` (45 in all by default, with the KServe campaign of test_fuzz_kserve.py; `make chaos` runs 600),
`FUZZ_EXAMPLES` and `FUZZ_SEED` set the bounds and the seed (tests/fuzz.py).
"""

from __future__ import annotations

import grpc
import numpy as np
import psutil
import pytest
from hypothesis import strategies as st

from client.facade.errors import FacadeError
from client.proto import inference_pb2
from tests import fuzz
from tests.helpers import metrics, wait_until
from tests.images import image_file, reference_pixels
from tests.integration.test_bad_input import INTERNALS, assert_like_onnxruntime, reference
from tests.serving import MODELS, start_facade

SERVICE = "/inference.InferenceService/"
IMAGE_MODELS = ("resnet50", "mobilenet_v3_small")
FIRST_OUTPUT = {"resnet50": "output", "mobilenet_v3_small": "output"}


def _codes(error: type[FacadeError]) -> set[str]:
    return {error.code.name}.union(*(_codes(sub) for sub in error.__subclasses__()))


# Every status of errors.py but INTERNAL (a model failure or a facade bug) and CANCELLED (nobody cancels here).
ANSWERS = {"OK"} | _codes(FacadeError) - {"INTERNAL", "CANCELLED"}
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
TALLY = fuzz.Tally()


@pytest.fixture(scope="module")
def fuzzed(triton, tmp_path_factory):
    """A facade of its own, warmed up by a valid request of each model; its RSS then."""
    facade = start_facade(triton, tmp_path_factory.mktemp("fuzzed-facade"))
    channel = grpc.insecure_channel(facade.grpc_url, options=[("grpc.max_send_message_length", 64 << 20)])
    for model in MODELS:
        still_serves(channel, model)
    print(f"fuzz seed {fuzz.SEED}, {fuzz.SECONDS:g} s, at most {fuzz.EXAMPLES} examples per campaign")
    yield facade, channel, psutil.Process(facade.pid).memory_info().rss
    channel.close()
    facade.stop()


# -- requests ----------------------------------------------------------------------------------------


def serialized(request: inference_pb2.PredictRequest, data: np.ndarray | None = None) -> bytes:
    """The request's bytes, with `data` as field 1 written directly (protobuf would make a float of each)."""
    body = request.SerializeToString()
    if data is None:
        return body
    floats = np.ascontiguousarray(data, "<f4").tobytes()
    return fuzz.length_delimited(1, floats) + body


@st.composite
def valid_predict(draw: st.DrawFn) -> tuple[str, bytes, dict[str, np.ndarray]]:
    """A valid request of one of the models (the model, its bytes, ONNX Runtime's feeds)."""
    model = draw(st.sampled_from(MODELS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    if model in IMAGE_MODELS:
        x = rng.standard_normal((draw(st.integers(1, 1 if model == "resnet50" else 2)), 3, 224, 224), np.float32)
        request = inference_pb2.PredictRequest(model_name=model, shape=x.shape, priority=draw(st.integers(0, 2)))
        if draw(st.booleans()):
            return model, serialized(request, x), {"input": x}
        request.raw_data, request.dtype = x.tobytes(), inference_pb2.FP32
        return model, serialized(request), {"input": x}
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 24)))
    ids = rng.integers(0, 1000, shape, dtype=np.int64)
    mask = (np.arange(shape[1]) < draw(st.integers(1, shape[1]))).astype(np.int64)[None].repeat(shape[0], 0)
    tensors = [
        inference_pb2.Tensor(name=name, dtype=inference_pb2.INT64, shape=shape, raw_data=array.tobytes())
        for name, array in (("input_ids", ids), ("attention_mask", mask))
    ]
    request = inference_pb2.PredictRequest(model_name=model, inputs=tensors)
    return model, serialized(request), {"input_ids": ids, "attention_mask": mask}


INTERESTING_DIMS = (-(2**63), -(2**31), -2, -1, 0, 1, 2, 3, 224, 2**31 - 1, 2**31, 2**32 + 1, fuzz.HUGE)
dims = st.one_of(st.sampled_from(INTERESTING_DIMS), st.integers(-(2**63), fuzz.HUGE), st.integers(0, 300))
shapes = st.lists(dims, max_size=6)
names = st.sampled_from(["input", "input_ids", "attention_mask", "output", "logits", "x", "", "\u00e9\u00e9"])
models = st.one_of(st.sampled_from([*MODELS, "", "image_preprocess", "resnet50_image", "nope", "../x"]), st.text())
dtypes = st.one_of(st.sampled_from(inference_pb2.ElementType.values()), st.integers(-(2**31), 2**31 - 1))


def payload(draw: st.DrawFn, shape: list[int]) -> bytes:
    """Bytes for `shape` at 4 bytes an element when that is small, else a few bytes too many or too few."""
    elements = int(np.prod(np.clip(shape, 0, None), dtype=object)) if shape else 1
    size = elements * 4 if elements * 4 <= 1 << 20 else draw(st.integers(0, 4096))
    size = max(0, size + draw(st.sampled_from([0, 0, 0, -4, -1, 1, 4])))
    return np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()


@st.composite
def odd_predict(draw: st.DrawFn) -> bytes:
    """A request with odd fields: any model, dtype, shape, lengths, names and limits."""
    shape = draw(shapes)
    request = inference_pb2.PredictRequest(
        model_name=draw(models),
        model_version=draw(st.sampled_from(["", "1", "7", "latest", "-1", "99999999999999999999"])),
        request_id=draw(st.text(max_size=40)),
        priority=draw(st.sampled_from([0, 1, 2, 3, 2**32 - 1])),
        timeout_ms=draw(st.sampled_from([0, 0, 1, 50, 2000, 2**32 - 1])),
        output_names=draw(st.lists(names, max_size=3)),
    )
    form = draw(st.sampled_from(["data", "raw_data", "inputs", "both"]))
    if form in ("raw_data", "both"):
        request.shape[:] = shape
        request.raw_data, request.dtype = payload(draw, shape), draw(dtypes)
    if form == "inputs":
        for _ in range(draw(st.integers(0, 3))):
            shape = draw(shapes)
            request.inputs.add(name=draw(names), dtype=draw(dtypes), shape=shape, raw_data=payload(draw, shape))
    if form in ("data", "both"):
        request.shape[:] = shape
        data = payload(draw, shape)
        return serialized(request, np.frombuffer(data[: len(data) // 4 * 4], "<f4"))
    return serialized(request)


PREDICT_STRINGS = (3, 4, 5, 11)  # model_name, model_version, request_id, output_names
SHAPE = 2


@st.composite
def predict(draw: st.DrawFn) -> tuple[str, bytes, tuple[str, dict[str, np.ndarray]] | None]:
    """(kind, bytes, (model, feeds) when the request is valid as sent)."""
    if draw(st.integers(0, 3)) == 0:
        model, body, feeds = draw(valid_predict())
        if draw(st.booleans()):
            return "valid", body, (model, feeds)
    else:
        body = draw(odd_predict())
        if draw(st.booleans()):
            return "odd fields", body, None
    kind, body = draw(fuzz.mutated(body, PREDICT_STRINGS, SHAPE))
    return f"mutated: {kind}", body, None


# -- checks ------------------------------------------------------------------------------------------


def documented(answer: fuzz.Answer, what: str) -> None:
    fuzz.not_a_hang(answer, what)
    assert answer.code in ANSWERS, f"{what}: {answer.code} {answer.message!r}"
    assert not INTERNALS.search(answer.message), f"{what}: the message shows internals: {answer.message!r}"
    # The facade's own message, not gRPC's refusal of a trailer too large to read (a message quoting megabytes).
    assert "metadata size exceeds" not in answer.message, f"{what}: {answer.message[:200]!r}"


def outputs_of(response: inference_pb2.PredictResponse) -> dict[str, np.ndarray]:
    if response.outputs:
        dtypes = {inference_pb2.FP32: np.float32, inference_pb2.INT64: np.int64}
        return {t.name: np.frombuffer(t.raw_data, dtypes[t.dtype]).reshape(t.shape) for t in response.outputs}
    first = FIRST_OUTPUT[response.model_name]
    return {first: np.array(response.predictions, np.float32).reshape(response.shape)}


def answered_right(body: bytes, model: str, feeds: dict[str, np.ndarray]) -> None:
    response = inference_pb2.PredictResponse.FromString(body)
    assert response.model_name == model
    assert_like_onnxruntime(model, outputs_of(response), feeds)


def still_serves(channel: grpc.Channel, model: str = "mobilenet_v3_small") -> None:
    x = np.random.default_rng(7).standard_normal((1, 3, 224, 224), np.float32)
    if model in IMAGE_MODELS:
        body, feeds = serialized(inference_pb2.PredictRequest(model_name=model, shape=x.shape), x), {"input": x}
    else:
        ids, mask = np.arange(1, 10, dtype=np.int64)[None], np.ones((1, 9), np.int64)
        tensors = [
            inference_pb2.Tensor(name=n, dtype=inference_pb2.INT64, shape=a.shape, raw_data=a.tobytes())
            for n, a in (("input_ids", ids), ("attention_mask", mask))
        ]
        body = serialized(inference_pb2.PredictRequest(model_name=model, inputs=tensors))
        feeds = {"input_ids": ids, "attention_mask": mask}
    answer = fuzz.unary(channel, SERVICE + "Predict", body)
    assert answer.code == "OK", answer
    answered_right(answer.body, model, feeds)


def came_through(facade, channel: grpc.Channel, campaign: str) -> None:
    """Nothing in flight, the facade alive and serving; prints what the campaign sent."""
    print(TALLY.report(campaign))
    in_flight = lambda: metrics(facade.http_url).value("tritonnx_facade_in_flight_requests") == 0  # noqa: E731
    wait_until(in_flight, 30, "the facade's in-flight gauge back to 0")
    assert facade.process.poll() is None, "the facade exited"
    still_serves(channel)


# -- the campaigns -----------------------------------------------------------------------------------


def test_fuzzed_predicts_get_documented_statuses_and_valid_ones_right_answers(fuzzed):
    facade, channel, _ = fuzzed

    def check(example) -> None:
        kind, body, valid = example
        answer = fuzz.unary(channel, SERVICE + "Predict", body)
        TALLY.add("Predict", kind, answer.code)
        documented(answer, kind)
        if valid is not None:
            assert answer.code == "OK", answer
            answered_right(answer.body, *valid)

    fuzz.campaign(0.25, predict(), check)
    came_through(facade, channel, "Predict")


@st.composite
def stream_of_predicts(draw: st.DrawFn) -> list[tuple[str, bytes, tuple[str, dict[str, np.ndarray]] | None]]:
    return draw(st.lists(predict(), min_size=0, max_size=5))


def test_fuzzed_streams_answer_every_request_and_go_on(fuzzed):
    facade, channel, _ = fuzzed

    def check(requests) -> None:
        # A valid request's answer is found by its request_id (a later field 5 wins).
        bodies = [
            body + fuzz.length_delimited(5, f"valid-{i}".encode()) if valid else body
            for i, (_, body, valid) in enumerate(requests)
        ]
        answer, responses = fuzz.stream(channel, SERVICE + "PredictStream", bodies)
        for kind, _, _ in requests:
            TALLY.add("PredictStream", kind, answer.code)
        documented(answer, "stream")
        if answer.code != "OK":  # a message above the size limit ends the stream
            return
        assert len(responses) == len(requests)
        by_id = {}
        for body in responses:
            response = inference_pb2.PredictResponse.FromString(body)
            code = CODE_NAMES[response.error.code]
            assert code in ANSWERS, f"stream: {code} {response.error.message!r}"
            assert not INTERNALS.search(response.error.message), response.error.message
            by_id[response.request_id] = (code, body)
            TALLY.statuses["PredictStream", f"a response {code}"] += 1
        for i, (_, _, valid) in enumerate(requests):
            if valid is not None:
                code, body = by_id[f"valid-{i}"]
                assert code == "OK", by_id[f"valid-{i}"]
                answered_right(body, *valid)

    fuzz.campaign(0.1, stream_of_predicts(), check)
    came_through(facade, channel, "PredictStream")


def lying_images(data: bytes) -> dict[str, bytes]:
    """Files that say they are one thing and are another, or are cut, or claim impossible sizes."""
    png, jpeg = b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff"
    # A PNG header claiming 100000 x 100000 pixels, with no pixels behind it.
    ihdr = b"IHDR" + (100_000).to_bytes(4, "big") * 2 + b"\x08\x02\x00\x00\x00"
    huge_png = png + len(ihdr[4:]).to_bytes(4, "big") + ihdr + b"\x00\x00\x00\x00"
    return {
        "PNG magic, JPEG body": png + data[3:],
        "JPEG magic, PNG body": jpeg + data[8:],
        "truncated": data[: len(data) // 2],
        "magic only": data[:8],
        "empty": b"",
        "GIF": b"GIF89a" + data,
        "BMP": b"BM" + data,
        "huge PNG header": huge_png,
        "zero-size PNG header": huge_png.replace((100_000).to_bytes(4, "big"), bytes(4)),
        "trailing garbage": data + bytes(range(256)) * 4,
        "random": np.random.default_rng(len(data)).integers(0, 256, 2000, dtype=np.uint8).tobytes(),
    }


@st.composite
def classify(draw: st.DrawFn) -> tuple[str, bytes, tuple[str, bytes, int] | None]:
    """(kind, bytes, (model, image, top_k) when the request is valid as sent)."""
    kind = draw(st.sampled_from(["JPEG", "PNG"]))
    data = image_file(draw(st.integers(8, 300)), draw(st.integers(8, 300)), kind, seed=draw(st.integers(0, 999)))
    model = draw(st.sampled_from(IMAGE_MODELS))
    top_k = draw(st.one_of(st.none(), st.integers(1, 10)))
    request = inference_pb2.ClassifyRequest(image=data, model_name=model, top_k=top_k)
    what = draw(st.sampled_from(["valid", "lying image", "odd fields", "mutated"]))
    if what == "valid":
        return f"valid {kind}", request.SerializeToString(), (model, data, 5 if top_k is None else top_k)
    if what == "lying image":
        lie, request.image = draw(st.sampled_from(sorted(lying_images(data).items())))
        return f"image: {lie}", request.SerializeToString(), None
    if what == "odd fields":
        request.model_name = draw(models)
        request.top_k = draw(st.sampled_from([0, 1, 1000, 1001, 2**32 - 1]))
        request.priority, request.timeout_ms = draw(st.sampled_from([0, 3, 2**32 - 1])), draw(st.sampled_from([0, 1]))
        return "odd fields", request.SerializeToString(), None
    mutation, body = draw(fuzz.mutated(request.SerializeToString(), (2, 4), 1))
    return f"mutated: {mutation}", body, None


def classified_right(body: bytes, model: str, data: bytes, top_k: int) -> None:
    response = inference_pb2.ClassifyResponse.FromString(body)
    assert response.model_name == f"{model}_image"
    session = reference(model)
    scores = session.run(None, {"input": reference_pixels(data)[None]})[0][0]
    assert len(response.classes) == top_k
    # Scores as ONNX Runtime gives them (6 decimals), the best ones (ties may come in either order).
    kth = np.sort(scores)[::-1][top_k - 1]
    for item in response.classes:
        assert abs(item.score - scores[item.index]) < 1e-3 * max(1.0, abs(scores[item.index])), item
        assert item.score >= kth - 1e-3, (item, kth)


def test_fuzzed_classify_requests_and_lying_images_get_documented_statuses(fuzzed):
    facade, channel, _ = fuzzed

    def check(example) -> None:
        kind, body, valid = example
        answer = fuzz.unary(channel, SERVICE + "Classify", body)
        TALLY.add("Classify", kind, answer.code)
        documented(answer, kind)
        if valid is not None:
            assert answer.code == "OK", answer
            classified_right(answer.body, *valid)

    fuzz.campaign(0.2, classify(), check)
    came_through(facade, channel, "Classify")


@st.composite
def list_models(draw: st.DrawFn) -> tuple[str, bytes]:
    body = inference_pb2.ListModelsRequest(ready_only=draw(st.booleans())).SerializeToString()
    if draw(st.booleans()):
        return "valid", body
    if draw(st.booleans()):
        return "random bytes", draw(st.binary(max_size=64))
    mutation, body = draw(fuzz.mutated(body + fuzz.key(1, 0) + b"\x01", (), 1))
    return f"mutated: {mutation}", body


def test_fuzzed_list_models_requests_get_documented_statuses(fuzzed):
    facade, channel, _ = fuzzed

    def check(example) -> None:
        kind, body = example
        answer = fuzz.unary(channel, SERVICE + "ListModels", body)
        TALLY.add("ListModels", kind, answer.code)
        documented(answer, kind)
        if answer.code == "OK":
            listed = inference_pb2.ListModelsResponse.FromString(answer.body)
            assert {m.name for m in listed.models if m.state == "READY"} >= set(MODELS)
        else:
            assert kind != "valid", answer

    fuzz.campaign(0.05, list_models(), check)
    came_through(facade, channel, "ListModels")


def test_the_facade_keeps_its_memory_after_the_campaigns(fuzzed, gate):
    """Last: the facade's RSS after every campaign against after its warm-up (a gate: a size outcome)."""
    facade, channel, before = fuzzed
    still_serves(channel)
    after = psutil.Process(facade.pid).memory_info().rss
    growth = (after - before) / 2**20
    gate(growth < 64, f"facade RSS {before / 2**20:.0f} MiB -> {after / 2**20:.0f} MiB ({growth:+.0f} MiB, below 64)")
