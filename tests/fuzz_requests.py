"""What the fuzz campaign of tests/integration/test_fuzz.py sends to the facade: hypothesis strategies.

Valid `PredictRequest`s of every demo model (with the model and ONNX Runtime's feeds, to check the answer),
requests with odd fields, `ClassifyRequest`s with real images and files that lie about their format,
`ListModelsRequest`s; often their bytes mutated (tests/fuzz.py). Each example is (kind, bytes, what a valid
request's answer is checked against, or None).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from tests import fuzz
from tests.images import image_file
from tests.serving import MODELS
from tritonnx.client.proto import inference_pb2

IMAGE_MODELS = ("resnet50", "mobilenet_v3_small")


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


@st.composite
def stream_of_predicts(draw: st.DrawFn) -> list[tuple[str, bytes, tuple[str, dict[str, np.ndarray]] | None]]:
    return draw(st.lists(predict(), min_size=0, max_size=5))


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


@st.composite
def list_models(draw: st.DrawFn) -> tuple[str, bytes]:
    body = inference_pb2.ListModelsRequest(ready_only=draw(st.booleans())).SerializeToString()
    if draw(st.booleans()):
        return "valid", body
    if draw(st.booleans()):
        return "random bytes", draw(st.binary(max_size=64))
    mutation, body = draw(fuzz.mutated(body + fuzz.key(1, 0) + b"\x01", (), 1))
    return f"mutated: {mutation}", body
