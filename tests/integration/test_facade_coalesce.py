"""The facade merging concurrent calls (--coalesce) in front of the real tritonserver: each caller
gets its own rows, equal to in-process ONNX Runtime on its own input, and a bad call fails alone."""

from __future__ import annotations

import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from client.proto import inference_pb2, inference_pb2_grpc
from tests.kserve import assert_close, reference_session
from tests.serving import onnx_file, start_facade

CALLS = 16


@pytest.fixture(scope="module")
def coalescing(triton, tmp_path_factory):
    # Depth 1: every call that comes while one is at Triton waits and joins the next request.
    facade = start_facade(triton, tmp_path_factory.mktemp("coalesce"), "--coalesce", "1", "--coalesce-depth", "1",
                          "--max-in-flight", "64")  # fmt: skip
    yield facade
    facade.stop()


@pytest.fixture(scope="module")
def stub(coalescing):
    with grpc.insecure_channel(coalescing.grpc_url) as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel)


def merged_requests(facade) -> tuple[float, float]:
    """(requests sent to Triton, those that carried more than one call) from the facade's /metrics."""
    with urllib.request.urlopen(f"{facade.http_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    count = float(re.search(r"^tritonnx_facade_calls_per_triton_request_count (\S+)$", text, re.M).group(1))
    alone = float(
        re.search(r'^tritonnx_facade_calls_per_triton_request_bucket\{le="1\.0"\} (\S+)$', text, re.M).group(1)
    )
    return count, count - alone


def at_once(calls) -> list:
    """Run the calls from as many threads at once; each one's outcome (a response or the RpcError)."""

    def outcome(call):
        try:
            return call()
        except grpc.RpcError as error:
            return error

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(outcome, calls))


def test_concurrent_images_are_merged_and_each_caller_gets_its_own_answer(stub, coalescing):
    session = reference_session(onnx_file("mobilenet_v3_small"))
    images = [np.random.default_rng(seed).standard_normal((1, 3, 224, 224), dtype=np.float32) for seed in range(CALLS)]
    sent_before, merged_before = merged_requests(coalescing)
    for _ in range(3):
        responses = at_once([
            lambda x=x: stub.Predict(
                inference_pb2.PredictRequest(model_name="mobilenet_v3_small", raw_data=x.tobytes(), shape=x.shape),
                timeout=60,
            )
            for x in images
        ])  # fmt: skip
        for x, response in zip(images, responses, strict=True):
            assert not isinstance(response, grpc.RpcError), response
            assert list(response.outputs[0].shape) == [1, 1000]
            served = np.frombuffer(response.outputs[0].raw_data, "<f4").reshape(1, 1000)
            assert_close(served, session.run(None, {"input": x})[0])
    sent, merged = merged_requests(coalescing)
    assert sent - sent_before < 3 * CALLS  # fewer requests reached Triton than calls were made
    assert merged - merged_before >= 1


def test_a_call_the_model_refuses_fails_alone_among_merged_ones(stub, coalescing):
    session = reference_session(onnx_file("text_classifier"))
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, 1000, (1, 16), dtype=np.int64) for _ in range(8)]
    ids[3] = np.full((1, 16), 5000, np.int64)  # outside the 1,000-token vocabulary: the model fails on it
    mask = np.ones((1, 16), np.int64)

    def predict(tokens):
        request = inference_pb2.PredictRequest(model_name="text_classifier", output_names=["logits"])
        for name, value in (("input_ids", tokens), ("attention_mask", mask)):
            request.inputs.add(name=name, dtype=inference_pb2.INT64, shape=value.shape, raw_data=value.tobytes())
        return stub.Predict(request, timeout=60)

    sent_before, _ = merged_requests(coalescing)
    outcomes = at_once([lambda t=t: predict(t) for t in ids])
    bad = outcomes[3]
    assert isinstance(bad, grpc.RpcError) and bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "model 'text_classifier' rejected the request" in bad.details()
    for index, (tokens, response) in enumerate(zip(ids, outcomes, strict=True)):
        if index == 3:
            continue
        assert not isinstance(response, grpc.RpcError), response
        logits = np.frombuffer(response.outputs[0].raw_data, "<f4").reshape(1, 2)
        expected = session.run(["logits"], {"input_ids": tokens, "attention_mask": mask})[0]
        assert_close(logits, expected)
    # The server keeps serving, merged or not.
    assert not isinstance(at_once([lambda: predict(ids[0])])[0], grpc.RpcError)
    assert merged_requests(coalescing)[0] > sent_before
