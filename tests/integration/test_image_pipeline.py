"""Image files in, labels out: the image ensembles through Triton directly (tritonclient, gRPC and HTTP, with the
classification extension) and through the facade's Classify, every answer compared with the same pre-processing
(tests/images.py) followed by in-process ONNX Runtime on the classifier's file."""

from __future__ import annotations

import concurrent.futures

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.helpers import metrics
from tests.images import image_file, image_input, reference_pixels, truncated
from tests.kserve import reference_session
from tests.serving import IMAGE_CLASSIFIERS, MODEL_REPOSITORY, onnx_file
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc

# Kinds of files a caller sends: RGB, grey, RGBA and palette; odd, tiny and large sizes.
FILES = {
    "jpeg 640x480": lambda: image_file(640, 480, seed=1),
    "jpeg grey 333x517": lambda: image_file(333, 517, mode="L", seed=2),
    "jpeg 3000x2000": lambda: image_file(3000, 2000, seed=3, quality=85),
    "png rgba 301x227": lambda: image_file(301, 227, "PNG", mode="RGBA", seed=4),
    "png grey 256x256": lambda: image_file(256, 256, "PNG", mode="L", seed=5),
    "png palette 500x375": lambda: image_file(500, 375, "PNG", mode="P", seed=6),
    "png tiny 2x3": lambda: image_file(2, 3, "PNG", seed=7),
}
# Triton's classification strings print scores with 6 decimals.
SCORE_TOLERANCE = 2e-5


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return {name: make() for name, make in FILES.items()}


@pytest.fixture(scope="module")
def expected(files) -> dict[str, dict[str, np.ndarray]]:
    """classifier -> file name -> its scores [1000], from the reference pre-processing and in-process ONNX Runtime."""
    pixels = np.stack([reference_pixels(data) for data in files.values()])
    scores = {}
    for model in IMAGE_CLASSIFIERS:
        output = reference_session(onnx_file(model)).run(["output"], {"input": pixels})[0]
        scores[model] = dict(zip(files, output, strict=True))
    return scores


@pytest.fixture(scope="module")
def labels() -> list[str]:
    lines = (MODEL_REPOSITORY / "resnet50_image" / "labels.txt").read_text().splitlines()
    assert len(lines) == 1000
    return lines


@pytest.fixture(scope="module")
def client(triton):
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        yield client


@pytest.fixture(scope="module")
def stub(facade):
    with grpc.insecure_channel(facade.grpc_url) as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel)


def assert_top_k(classes: list[tuple[float, int, str]], scores: np.ndarray, labels: list[str], k: int) -> None:
    """Best first, the indices of the k highest reference scores (up to near ties), each score and label right."""
    assert len(classes) == k
    got = [index for _, index, _ in classes]
    want = list(np.argsort(-scores, kind="stable")[:k])
    for position, (index, wanted) in enumerate(zip(got, want, strict=True)):
        # Two classes whose scores differ by less than the tolerance may swap places.
        assert index == wanted or abs(scores[index] - scores[wanted]) < SCORE_TOLERANCE, (position, got, want)
    for score, index, label in classes:
        assert abs(score - scores[index]) < SCORE_TOLERANCE, (index, score, scores[index])
        assert label == labels[index]


def parse(strings: np.ndarray) -> list[tuple[float, int, str]]:
    """Triton's "score:index:label" strings."""
    parsed = []
    for item in strings:
        score, index, label = item.decode().split(":", 2)
        parsed.append((float(score), int(index), label))
    return parsed


@pytest.mark.parametrize("model", IMAGE_CLASSIFIERS)
def test_the_ensemble_scores_every_kind_of_file_as_in_process(client, files, expected, model):
    for name, data in files.items():
        result = client.infer(f"{model}_image", [image_input(data)])
        scores = result.as_numpy("scores")
        assert scores.shape == (1, 1000), name
        np.testing.assert_allclose(scores[0], expected[model][name], rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_classification_extension_gives_the_top_labels(triton, files, expected, labels, protocol):
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(triton.grpc_url if protocol == "grpc" else triton.http_url)
    for model in IMAGE_CLASSIFIERS:
        for name, data in files.items():
            result = client.infer(
                f"{model}_image",
                [image_input(data, module)],
                outputs=[module.InferRequestedOutput("scores", class_count=5)],
            )
            strings = result.as_numpy("scores")
            assert strings.shape == (1, 5), (model, name)
            assert_top_k(parse(strings[0]), expected[model][name], labels, 5)
    client.close()


def test_the_ensembles_and_the_labels_are_configured_as_documented(client, labels):
    for model in IMAGE_CLASSIFIERS:
        config = client.get_model_config(f"{model}_image").config
        assert config.platform == "ensemble" and config.max_batch_size == 16
        assert [(s.model_name, s.model_version) for s in config.ensemble_scheduling.step] == [
            ("image_preprocess", -1),
            (model, -1),
        ]
        assert [(o.name, list(o.dims), o.label_filename) for o in config.output] == [("scores", [1000], "labels.txt")]
        assert (MODEL_REPOSITORY / f"{model}_image" / "labels.txt").read_text().splitlines() == labels
    assert len(set(labels)) == 1000 and all(labels)
    preprocess = client.get_model_config("image_preprocess").config
    assert [(i.name, list(i.dims), i.allow_ragged_batch) for i in preprocess.input] == [("image", [-1], True)]
    assert [(o.name, list(o.dims)) for o in preprocess.output] == [("pixels", [3, 224, 224])]


# --- through the facade -------------------------------------------------------------------


@pytest.mark.parametrize("model", IMAGE_CLASSIFIERS)
def test_classify_answers_as_in_process(stub, files, expected, labels, model):
    for position, (name, data) in enumerate(files.items()):
        k = (1, 5, 10)[position % 3]
        reply = stub.Classify(
            inference_pb2.ClassifyRequest(image=data, model_name=model, top_k=k, request_id=f"{name}-{k}"), timeout=60
        )
        assert (reply.model_name, reply.model_version, reply.request_id) == (f"{model}_image", "1", f"{name}-{k}")
        classes = [(c.score, c.index, c.label) for c in reply.classes]
        assert_top_k(classes, expected[model][name], labels, k)


def test_classify_defaults_to_the_default_model_and_five_classes(stub, files, expected, labels):
    reply = stub.Classify(inference_pb2.ClassifyRequest(image=files["png rgba 301x227"]), timeout=60)
    assert reply.model_name == "resnet50_image"  # the facade's --default-model
    assert_top_k(
        [(c.score, c.index, c.label) for c in reply.classes], expected["resnet50"]["png rgba 301x227"], labels, 5
    )
    every = stub.Classify(
        inference_pb2.ClassifyRequest(image=files["jpeg 640x480"], model_name="mobilenet_v3_small_image", top_k=1000),
        timeout=60,
    )
    assert sorted(c.index for c in every.classes) == list(range(1000))


BAD_CALLS = {
    "not an image": (
        {"image": b"%just text, no image%"},
        grpc.StatusCode.INVALID_ARGUMENT,
        "the bytes are not a JPEG or PNG image (they start with 25 6a 75 73 74 20 74 65",
    ),
    "gif": ({"image": "GIF"}, grpc.StatusCode.INVALID_ARGUMENT, "the image is GIF, which is not accepted"),
    "webp": ({"image": "WEBP"}, grpc.StatusCode.INVALID_ARGUMENT, "the image is WebP, which is not accepted"),
    "bmp": ({"image": "BMP"}, grpc.StatusCode.INVALID_ARGUMENT, "the image is BMP, which is not accepted"),
    "truncated jpeg": (
        {"image": "truncated"},
        grpc.StatusCode.INVALID_ARGUMENT,
        "the JPEG image cannot be decoded: image file is truncated",
    ),
    "too large": (
        {"image": b"\xff\xd8\xff" + bytes(9 * 1024 * 1024)},
        grpc.StatusCode.INVALID_ARGUMENT,
        "the image is 9437187 bytes, above this server's limit of 8388608 bytes (--max-image-bytes)",
    ),
    "k=0": ({"top_k": 0}, grpc.StatusCode.INVALID_ARGUMENT, "top_k 0 is outside 1..1000"),
    "k=1001": ({"top_k": 1001}, grpc.StatusCode.INVALID_ARGUMENT, "top_k 1001 is outside 1..1000"),
    "unknown model": (
        {"model_name": "no_such_model"},
        grpc.StatusCode.NOT_FOUND,
        "model 'no_such_model' has no image pipeline ('no_such_model_image') on this server; models that classify "
        "images: mobilenet_v3_small, resnet50",
    ),
    "a model without images": ({"model_name": "text_classifier"}, grpc.StatusCode.NOT_FOUND, "no image pipeline"),
}


def bad_request(fields: dict, files: dict[str, bytes]) -> inference_pb2.ClassifyRequest:
    fields = {"image": files["jpeg 640x480"], "model_name": "mobilenet_v3_small", **fields}
    if fields["image"] == "truncated":
        fields["image"] = truncated(files["jpeg 640x480"])
    elif isinstance(fields["image"], str):
        fields["image"] = image_file(64, 48, fields["image"])
    return inference_pb2.ClassifyRequest(**fields)


def test_bad_calls_get_their_status_and_good_ones_in_the_same_batch_their_answer(facade, stub, files, expected, labels):
    good = ["jpeg 640x480", "png grey 256x256", "png palette 500x375", "jpeg grey 333x517"]
    calls = [
        ("good", name, inference_pb2.ClassifyRequest(image=files[name], model_name="mobilenet_v3_small"))
        for name in good
    ]
    for position, (name, (fields, _, _)) in enumerate(BAD_CALLS.items()):
        calls.insert(position % len(calls), ("bad", name, bad_request(fields, files)))
    # At most the facade's 8 test slots at once, less its priority reserve: 6 calls in flight.
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(stub.Classify, request, timeout=60) for _, _, request in calls]
        concurrent.futures.wait(futures, timeout=120)
    for (kind, name, _), future in zip(calls, futures, strict=True):
        if kind == "good":
            reply = future.result()
            assert_top_k(
                [(c.score, c.index, c.label) for c in reply.classes], expected["mobilenet_v3_small"][name], labels, 5
            )
            continue
        error = future.exception()
        _, code, message = BAD_CALLS[name]
        assert isinstance(error, grpc.RpcError), name
        assert error.code() == code, (name, error.code(), error.details())
        assert message in error.details(), (name, error.details())
    # The server keeps serving, and the facade counted both kinds.
    assert stub.Classify(inference_pb2.ClassifyRequest(image=files["png tiny 2x3"]), timeout=60).classes
    page = metrics(facade.http_url)
    assert page.value("tritonnx_facade_requests_total", code="OK", model="mobilenet_v3_small_image") >= 1
    assert page.value("tritonnx_facade_requests_total", code="INVALID_ARGUMENT", model="mobilenet_v3_small_image") >= 1


def test_a_malformed_classify_request_is_invalid_argument(facade):
    with grpc.insecure_channel(facade.grpc_url) as channel:
        call = channel.unary_unary("/inference.InferenceService/Classify")
        with pytest.raises(grpc.RpcError) as caught:
            call(b"\x0a\xff\xff\xff\xff\x0f", timeout=10)  # field 1 claims 4 GiB
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed ClassifyRequest" in caught.value.details()
