"""Requests crafted to cost the facade the most, against a facade in front of a real tritonserver.

Each is answered with the documented status, bounded state stays bounded, and the facade goes on serving valid
requests, with ONNX Runtime's answer. Statuses and counts only: how fast each is answered, what a probe sees
meanwhile and the facade's memory are gates of `make chaos` (bench/attacks).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from tests.helpers import metrics, wait_until
from tests.kserve import assert_close, reference_session
from tests.serving import FACADE_MAX_IN_FLIGHT, FACADE_MAX_MESSAGE_BYTES, onnx_file
from tritonnx.client.facade.wire import MAX_FIELDS, MAX_OUTPUTS, MAX_RANK, varint
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc

MODEL = "mobilenet_v3_small"
SHAPE = [1, 3, 224, 224]
PREDICT = "/inference.InferenceService/Predict"


@pytest.fixture(scope="module")
def channel(facade):
    with grpc.insecure_channel(facade.grpc_url, options=[("grpc.max_send_message_length", 64 << 20)]) as opened:
        yield opened


def raw_predict(channel: grpc.Channel, body: bytes, timeout: float = 30.0) -> grpc.StatusCode:
    """A Predict of raw bytes: its status."""
    try:
        channel.unary_unary(PREDICT)(body, timeout=timeout)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def valid(seed: int = 0) -> tuple[inference_pb2.PredictRequest, np.ndarray]:
    data = np.random.default_rng(seed).standard_normal(SHAPE, dtype=np.float32)
    return inference_pb2.PredictRequest(model_name=MODEL, raw_data=data.tobytes(), shape=SHAPE), data


def assert_still_serves(channel: grpc.Channel) -> None:
    request, data = valid(seed=7)
    response = inference_pb2_grpc.InferenceServiceStub(channel).Predict(request, timeout=30)
    expected = reference_session(onnx_file(MODEL)).run(None, {"input": data})[0]
    assert_close(np.array(response.predictions, np.float32), expected.ravel())


def just_under_the_limit(field: bytes) -> bytes:
    """`field` repeated to just under the facade's message limit: what reaches the facade's own decoding."""
    return field * ((FACADE_MAX_MESSAGE_BYTES - 1024) // len(field))


def test_versions_with_junk_after_the_number_are_refused_and_cache_nothing(facade, channel):
    request, _ = valid()
    before = metrics(facade.http_url).value("tritonnx_facade_metadata_cache_entries")
    codes = set()
    for i in range(50):
        request.model_version = f"1{'x' * 1000}{i}"
        codes.add(raw_predict(channel, request.SerializeToString()))
    request.model_version = "1" + "x" * 2**20  # the megabyte of junk
    codes.add(raw_predict(channel, request.SerializeToString()))
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT}
    assert metrics(facade.http_url).value("tritonnx_facade_metadata_cache_entries") <= before
    request.model_version = "001"  # version 1, spelt another way: the same entry as "1"
    assert raw_predict(channel, request.SerializeToString()) == grpc.StatusCode.OK
    request.model_version = "1"
    assert raw_predict(channel, request.SerializeToString()) == grpc.StatusCode.OK
    assert metrics(facade.http_url).value("tritonnx_facade_metadata_cache_entries") <= before + 1
    assert_still_serves(channel)


@pytest.mark.parametrize(
    "field",
    [
        inference_pb2.PredictRequest(priority=1).SerializeToString(),  # a singular field, millions of times
        inference_pb2.PredictRequest(output_names=[""]).SerializeToString(),
        bytes([2 << 3 | 0, 1]),  # unpacked shape dims
        bytes([12 << 3 | 0, 1]),  # an unknown field
    ],
    ids=["priority", "output_names", "unpacked-shape", "unknown-field"],
)
def test_millions_of_fields_are_refused_as_invalid(facade, channel, field):
    assert raw_predict(channel, just_under_the_limit(field)) == grpc.StatusCode.INVALID_ARGUMENT
    assert_still_serves(channel)


def test_a_packed_shape_of_millions_of_dims_is_invalid(channel):
    dims = b"\x01" * (FACADE_MAX_MESSAGE_BYTES - 1024)
    assert raw_predict(channel, bytes([2 << 3 | 2]) + varint(len(dims)) + dims) == grpc.StatusCode.INVALID_ARGUMENT
    assert raw_predict(channel, inference_pb2.PredictRequest(shape=[1] * (MAX_RANK + 1)).SerializeToString()) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    assert_still_serves(channel)


def test_unpacked_floats_are_served_and_millions_of_them_refused_by_the_shape(channel):
    request, data = valid(seed=3)
    request.ClearField("raw_data")
    unpacked = b"".join(bytes([1 << 3 | 5]) + value.tobytes() for value in data.ravel())
    response = inference_pb2.PredictResponse.FromString(
        channel.unary_unary(PREDICT)(unpacked + request.SerializeToString(), timeout=30)
    )
    expected = reference_session(onnx_file(MODEL)).run(None, {"input": data})[0]
    assert_close(np.array(response.predictions, np.float32), expected.ravel())
    flood = just_under_the_limit(bytes([1 << 3 | 5]) + np.float32(1).tobytes())
    assert raw_predict(channel, flood + request.SerializeToString()) == grpc.StatusCode.INVALID_ARGUMENT


def test_a_message_above_the_limit_is_refused_by_its_size(channel):
    flood = inference_pb2.PredictRequest(priority=1).SerializeToString() * (FACADE_MAX_MESSAGE_BYTES // 2 + 1)
    assert raw_predict(channel, flood) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_still_serves(channel)


def test_callers_that_never_send_a_body_do_not_lock_out_others(facade, channel):
    """More header-only calls than the facade has slots: valid calls, priority 1 or not, are still served."""
    stalled = threading.Event()
    calls = []

    def never() -> Iterator[bytes]:
        """A request stream that sends nothing until the test ends: the call's headers, and no body."""
        stalled.wait(60)
        yield from ()

    stream_unary = channel.stream_unary(PREDICT)
    for _ in range(3 * FACADE_MAX_IN_FLIGHT):
        calls.append(stream_unary.future(never(), timeout=60))
    wait_until(
        lambda: metrics(facade.http_url).value("tritonnx_facade_receiving_calls") >= 3 * FACADE_MAX_IN_FLIGHT,
        30,
        "every header-only call waits for its body",
    )
    request, _ = valid()
    request.priority = 1
    assert raw_predict(channel, request.SerializeToString()) == grpc.StatusCode.OK
    assert_still_serves(channel)
    for call in calls:
        call.cancel()
    stalled.set()
    wait_until(lambda: metrics(facade.http_url).value("tritonnx_facade_receiving_calls") == 0, 30, "places given back")


def test_too_many_output_names_or_fields_name_the_limit(channel):
    request, _ = valid()
    request.output_names.extend(["output"] * (MAX_OUTPUTS + 1))
    with pytest.raises(grpc.RpcError) as caught:
        inference_pb2_grpc.InferenceServiceStub(channel).Predict(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"output_names has more than {MAX_OUTPUTS} entries" in caught.value.details()
    flood = inference_pb2.PredictRequest(priority=1).SerializeToString() * (MAX_FIELDS + 1)
    with pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary(PREDICT)(flood, timeout=30)
    assert f"more than {MAX_FIELDS} fields" in caught.value.details()
