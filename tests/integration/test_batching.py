"""Batches Triton forms from concurrent requests: ragged token requests and a bad image file among good ones, each
answered as it would be alone.

These models are served here by a tritonserver of their own whose batcher waits up to a second for a batch to fill
(`max_queue_delay_microseconds`; the demo configs wait a few ms at most): with the demo configs, requests batch
mostly while the instances are busy, which a fast model on a loaded machine may never be. Each test checks that a batch formed.
"""

from __future__ import annotations

import concurrent.futures
import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.images import image_file, image_input, reference_pixels, truncated
from tests.kserve import assert_close, execution_counts, infer, infer_concurrently, reference_session
from tests.serving import MODEL_REPOSITORY, onnx_file
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack
from tritonnx.server.triton import TritonServer

MODELS = ("text_classifier", "token_classifier", "image_preprocess", "mobilenet_v3_small", "mobilenet_v3_small_image")
BATCH_WINDOW_US = 1_000_000


@pytest.fixture(scope="module")
def batching(tmp_path_factory) -> TritonServer:
    workdir = tmp_path_factory.mktemp("batching")
    configs = {
        model: re.sub(
            r"max_queue_delay_microseconds:\s*\d+",
            f"max_queue_delay_microseconds: {BATCH_WINDOW_US}",
            (MODEL_REPOSITORY / model / "config.pbtxt").read_text(),
        )
        for model in MODELS
    }
    assert all(f"max_queue_delay_microseconds: {BATCH_WINDOW_US}" in configs[m] for m in MODELS[:4])
    repository = link_models(workdir / "repository", {m: MODEL_REPOSITORY / m for m in MODELS}, configs)
    with ServingStack(repository, workdir, with_facade=False, triton_http=False) as stack:
        yield stack.triton


@pytest.fixture(scope="module")
def client(batching):
    with grpcclient.InferenceServerClient(batching.grpc_url) as client:
        yield client


@pytest.fixture(scope="module")
def alone_client(triton):
    """The session's tritonserver: the same model files with the demo configs, where a lone request runs at once."""
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        yield client


def token_request(length: int, seed: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(1, 1000, size=(1, length), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def test_text_classifier_batches_ragged_requests_like_single_ones(batching, client, alone_client):
    lengths = [3, 17, 8, 1, 32, 12, 5, 24] * 3
    requests = [token_request(length, seed) for seed, length in enumerate(lengths)]
    alone = [infer(alone_client, "text_classifier", r, ["logits", "embedding"]) for r in requests]
    before = execution_counts(client, "text_classifier", batching.admin_headers)
    together = infer_concurrently(client, "text_classifier", requests, ["logits", "embedding"])
    after = execution_counts(client, "text_classifier", batching.admin_headers, at_least=before[0] + len(requests))

    assert after[1] - before[1] < len(requests), "ragged requests were not batched together"
    session = reference_session(onnx_file("text_classifier"))
    for request, single, batched in zip(requests, alone, together, strict=False):
        assert single.error is None and batched.error is None
        assert batched.outputs["logits"].shape == (1, 2)
        assert batched.outputs["embedding"].shape == single.outputs["embedding"].shape
        for name in ("logits", "embedding"):
            np.testing.assert_allclose(batched.outputs[name], single.outputs[name], rtol=1e-5, atol=1e-5)
        expected = dict(zip(["logits", "embedding"], session.run(["logits", "embedding"], request), strict=False))
        assert_close(single.outputs["logits"], expected["logits"])


def test_token_classifier_gives_each_request_its_own_length_in_a_ragged_batch(batching, client, alone_client):
    lengths = [3, 17, 8, 1, 32, 12, 5, 24] * 3
    requests = [token_request(length, seed) for seed, length in enumerate(lengths)]
    alone = [infer(alone_client, "token_classifier", r, ["token_logits"]) for r in requests]
    before = execution_counts(client, "token_classifier", batching.admin_headers)
    together = infer_concurrently(client, "token_classifier", requests, ["token_logits"])
    after = execution_counts(client, "token_classifier", batching.admin_headers, at_least=before[0] + len(requests))

    assert after[1] - before[1] < len(requests), "ragged requests were not batched together"
    session = reference_session(onnx_file("token_classifier"))
    for request, length, single, batched in zip(requests, lengths, alone, together, strict=False):
        assert single.error is None and batched.error is None
        # Its own length, not the padded length of the longest request it shared a batch with.
        assert batched.outputs["token_logits"].shape == single.outputs["token_logits"].shape == (1, length, 5)
        np.testing.assert_allclose(
            batched.outputs["token_logits"], single.outputs["token_logits"], rtol=1e-5, atol=1e-5
        )
        assert_close(single.outputs["token_logits"], session.run(["token_logits"], request)[0])


def test_a_file_that_cannot_be_decoded_fails_alone_in_its_batch(batching, client):
    model = "mobilenet_v3_small"
    files = {
        "jpeg 640x480": image_file(640, 480, seed=1),
        "png grey 256x256": image_file(256, 256, "PNG", mode="L", seed=5),
        "png tiny 2x3": image_file(2, 3, "PNG", seed=7),
        "jpeg grey 333x517": image_file(333, 517, mode="L", seed=2),
    }
    pixels = np.stack([reference_pixels(data) for data in files.values()])
    scores = reference_session(onnx_file(model)).run(["output"], {"input": pixels})[0]
    expected = dict(zip(files, scores, strict=True))
    good = list(files.items()) * 4  # 16 good requests ...
    bad = {
        "truncated jpeg": (
            truncated(files["jpeg 640x480"]),
            "the JPEG image cannot be decoded: image file is truncated",
        ),
        "not an image": (b"GIF87a is said to be here" + bytes(64), "the image is GIF, which is not accepted"),
        "text": (b"just some text, not an image", "the bytes are not a JPEG or PNG image"),
    }
    # ... with the bad ones among them, all sent at once.
    sequence = [("good", name, data) for name, data in good]
    for position, (name, (data, _)) in zip((2, 7, 11), bad.items(), strict=True):
        sequence.insert(position, ("bad", name, data))
    before = execution_counts(client, "image_preprocess", batching.admin_headers)
    outcomes: list = [None] * len(sequence)
    done = concurrent.futures.Future()
    remaining = [len(sequence)]

    def callback(index, result, error):
        outcomes[index] = (result, error)
        remaining[0] -= 1
        if remaining[0] == 0:
            done.set_result(True)

    for index, (_, _, data) in enumerate(sequence):
        client.async_infer(
            f"{model}_image",
            [image_input(data)],
            callback=lambda result, error, i=index: callback(i, result, error),
        )
    done.result(timeout=120)
    after = execution_counts(client, "image_preprocess", batching.admin_headers, at_least=before[0] + len(sequence))

    for (kind, name, _), (result, error) in zip(sequence, outcomes, strict=True):
        if kind == "good":
            assert error is None, (name, error)
            np.testing.assert_allclose(result.as_numpy("scores")[0], expected[name], rtol=1e-4, atol=1e-4)
        else:
            assert isinstance(error, InferenceServerException), name
            assert error.status() == "StatusCode.INVALID_ARGUMENT", (name, error)
            assert bad[name][1] in error.message(), (name, error.message())
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert executions < inferences, f"{inferences} requests ran in {executions} executions: never batched"
    assert client.is_model_ready(f"{model}_image") and client.is_model_ready("image_preprocess")
