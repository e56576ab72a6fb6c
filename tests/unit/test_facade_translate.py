import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tritonnx.backend.tensors import RAW_DTYPES
from tritonnx.client.facade.errors import InvalidArgument
from tritonnx.client.facade.translate import MAX_DIM, ModelInfo, TensorInfo, to_infer_request, to_predict_response
from tritonnx.client.facade.wire import MAX_RANK, DecodedRequest, RequestRefused, decode_predict_request
from tritonnx.client.proto import inference_pb2

VISION = ModelInfo(
    "resnet50", "", (TensorInfo("input", "FP32", (-1, 3, 4, 4)),), (TensorInfo("output", "FP32", (-1, 10)),), 16
)
TEXT = ModelInfo(
    "text_classifier",
    "",
    (TensorInfo("input_ids", "INT64", (-1, -1)), TensorInfo("attention_mask", "INT64", (-1, -1))),
    (TensorInfo("logits", "FP32", (-1, 2)), TensorInfo("embedding", "FP32", (-1, 8))),
    32,
)


def decoded(**fields) -> DecodedRequest:
    """A request as the server receives it: serialised, then split by the wire decoder."""
    return decode_predict_request(inference_pb2.PredictRequest(**fields).SerializeToString())


def simple(data: np.ndarray, shape, **fields) -> DecodedRequest:
    return decoded(data=data, shape=shape, **fields)


def translated(request: DecodedRequest, info: ModelInfo, timeout_us=None) -> service_pb2.ModelInferRequest:
    """What Triton receives: the InferCall's bytes parsed as a ModelInferRequest."""
    return service_pb2.ModelInferRequest.FromString(to_infer_request(request, info, timeout_us).serialize())


def tensor(name: str, array: np.ndarray, dtype=inference_pb2.INT64) -> inference_pb2.Tensor:
    return inference_pb2.Tensor(name=name, dtype=dtype, shape=list(array.shape), raw_data=array.tobytes())


def test_data_becomes_one_raw_fp32_input():
    data = np.arange(48, dtype=np.float32)
    request = translated(simple(data, [1, 3, 4, 4], request_id="r1", priority=2), VISION, timeout_us=250_000)
    assert request.model_name == "resnet50" and request.id == "r1"
    assert [(i.name, i.datatype, list(i.shape)) for i in request.inputs] == [("input", "FP32", [1, 3, 4, 4])]
    assert request.raw_input_contents == [data.tobytes()]
    assert request.parameters["timeout"].int64_param == 250_000
    assert request.parameters["priority"].uint64_param == 2
    assert not request.outputs  # all outputs


def test_raw_data_and_named_inputs_are_passed_as_bytes():
    raw = np.ones((2, 3, 4, 4), np.float32)
    request = translated(decoded(raw_data=raw.tobytes(), shape=[2, 3, 4, 4]), VISION)
    assert request.raw_input_contents == [raw.tobytes()] and "timeout" not in request.parameters
    ids = np.array([[5, 6, 7]], np.int64)
    message = inference_pb2.PredictRequest(
        model_name="text_classifier",
        inputs=[tensor("attention_mask", np.ones_like(ids)), tensor("input_ids", ids)],
        output_names=["embedding"],
    )
    request = translated(decode_predict_request(message.SerializeToString()), TEXT)
    assert [i.name for i in request.inputs] == ["attention_mask", "input_ids"]
    assert request.raw_input_contents[1] == ids.tobytes()
    assert [o.name for o in request.outputs] == ["embedding"]


@pytest.mark.parametrize(
    ("data_len", "shape", "message"),
    [
        (48, [], "has no shape"),
        (48, [1, 3, 4, 0], "does not fit [-1, 3, 4, 4]"),
        (48, [0, 3, 4, 4], "has batch size 0: send 1 to 16"),
        (48, [1, 3, -4, 4], "a dim cannot be negative"),
        (48, [2**40, 3, 4, 4], f"dims above {MAX_DIM}"),
        (48, [3, 4, 4], "wants rank 4"),
        (48, [1, 3, 4, 5], "does not fit [-1, 3, 4, 4]"),
        (17 * 48, [17, 3, 4, 4], "above the model's max_batch_size 16"),
        (47, [1, 3, 4, 4], "carries 47 values but shape [1, 3, 4, 4] needs 48"),
    ],
)
def test_simple_requests_that_do_not_fit_are_refused_with_the_reason(data_len, shape, message):
    with pytest.raises(InvalidArgument) as caught:
        to_infer_request(simple(np.zeros(data_len, np.float32), shape), VISION, None)
    assert message in caught.value.message


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (inference_pb2.PredictRequest(shape=[1, 3, 4, 4]), "the request has no input"),
        (
            inference_pb2.PredictRequest(raw_data=b"\0" * 192, dtype=inference_pb2.INT32, shape=[1, 3, 4, 4]),
            "is INT32 but the model wants FP32",
        ),
        (inference_pb2.PredictRequest(raw_data=b"\0" * 191, shape=[1, 3, 4, 4]), "191 bytes is not a whole number"),
        (
            inference_pb2.PredictRequest(raw_data=b"\0" * 192, shape=[1, 3, 4, 4], output_names=["nope"]),
            "unknown output(s) ['nope']",
        ),
    ],
)
def test_extended_requests_that_do_not_fit_are_refused(message, text):
    with pytest.raises(InvalidArgument, match=None) as caught:
        to_infer_request(decode_predict_request(message.SerializeToString()), VISION, None)
    assert text in caught.value.message


def test_data_and_raw_data_together_are_ambiguous():
    both = decoded(raw_data=b"\0" * 192, data=np.zeros(48, np.float32), shape=[1, 3, 4, 4])
    with pytest.raises(InvalidArgument, match="sets data and raw_data"):
        to_infer_request(both, VISION, None)


def test_data_is_fp32_only():
    with pytest.raises(InvalidArgument, match="`data` holds FP32 values"):
        to_infer_request(simple(np.zeros(48, np.float32), [1, 3, 4, 4], dtype=inference_pb2.INT64), VISION, None)


def test_a_multi_input_model_needs_named_inputs():
    with pytest.raises(InvalidArgument, match="takes 2 inputs .*send them by name"):
        to_infer_request(simple(np.zeros(3, np.float32), [1, 3]), TEXT, None)
    ids = np.ones((1, 3), np.int64)
    wrong = inference_pb2.PredictRequest(inputs=[tensor("input_ids", ids), tensor("token_type_ids", ids)])
    with pytest.raises(InvalidArgument) as caught:
        to_infer_request(decode_predict_request(wrong.SerializeToString()), TEXT, None)
    assert (
        "unknown: ['token_type_ids']" in caught.value.message and "missing: ['attention_mask']" in caught.value.message
    )


def infer_response(*outputs: tuple[str, np.ndarray, str]) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name="text_classifier", model_version="1")
    for name, array, datatype in outputs:
        response.outputs.append(
            service_pb2.ModelInferResponse.InferOutputTensor(name=name, datatype=datatype, shape=list(array.shape))
        )
        response.raw_output_contents.append(array.tobytes())
    return response


def test_the_response_carries_the_first_output_as_predictions():
    logits, embedding = np.array([[0.25, -1.5]], np.float32), np.arange(8, dtype=np.float32).reshape(1, 8)
    response = infer_response(("logits", logits, "FP32"), ("embedding", embedding, "FP32"))
    encoded = to_predict_response(decoded(request_id="abc", data=[1.0], shape=[1]), TEXT, response)
    np.testing.assert_array_equal(encoded.predictions, logits.ravel())
    assert list(encoded.message.shape) == [1, 2] and encoded.message.request_id == "abc"
    assert encoded.message.model_version == "1" and not encoded.message.outputs


def test_extended_requests_also_get_every_output_by_name():
    logits, embedding = np.array([[0.25, -1.5]], np.float32), np.ones((1, 8), np.float32)
    response = infer_response(("embedding", embedding, "FP32"), ("logits", logits, "FP32"))
    encoded = to_predict_response(decoded(output_names=["embedding", "logits"]), TEXT, response)
    np.testing.assert_array_equal(encoded.predictions, embedding.ravel())  # the first requested
    by_name = {t.name: t for t in encoded.message.outputs}
    assert np.frombuffer(by_name["logits"].raw_data, np.float32).tolist() == [0.25, -1.5]
    assert by_name["embedding"].dtype == inference_pb2.FP32 and list(by_name["embedding"].shape) == [1, 8]


def test_a_dtype_number_the_proto_does_not_define_is_the_callers_error():
    # proto3 enums are open: 99 parses, and must not surface as a Python ValueError (gRPC UNKNOWN).
    raw = decoded(raw_data=b"\0" * 192, dtype=99, shape=[1, 3, 4, 4])
    with pytest.raises(InvalidArgument) as caught:
        to_infer_request(raw, VISION, None)
    assert "input 'input' has dtype 99, which is not an ElementType: use one of FP32, FP16" in caught.value.message
    ids = np.ones((1, 3), np.int64)
    named = inference_pb2.PredictRequest(inputs=[tensor("input_ids", ids, dtype=42), tensor("attention_mask", ids)])
    with pytest.raises(InvalidArgument, match="input 'input_ids' has dtype 42"):
        to_infer_request(decode_predict_request(named.SerializeToString()), TEXT, None)


@pytest.mark.parametrize("field", ["data", "raw_data"])
def test_an_empty_tensor_is_checked_for_its_shape_not_taken_for_a_request_without_input(field):
    # Its data is empty, so protobuf leaves the field out: only the shape tells.
    empty = decoded(**{field: [] if field == "data" else b""}, shape=[1, 3, 4, 0])
    with pytest.raises(InvalidArgument) as caught:
        to_infer_request(empty, VISION, None)
    assert "input 'input' has shape [1, 3, 4, 0], which does not fit [-1, 3, 4, 4]" in caught.value.message
    with pytest.raises(InvalidArgument, match="the request has no input"):
        to_infer_request(decoded(shape=[1, 3, 4, 4]), VISION, None)


def test_an_empty_tensor_a_model_takes_is_forwarded_with_no_bytes():
    flexible = ModelInfo("flex", "1", (TensorInfo("x", "FP32", (-1, -1)),), (TensorInfo("y", "FP32", (-1, -1)),), 8)
    call = to_infer_request(decoded(raw_data=b"", shape=[2, 0]), flexible, None)
    assert [(t.name, t.datatype, list(t.shape)) for t in call.header.inputs] == [("x", "FP32", [2, 0])]
    assert [len(p) for p in call.payloads] == [0]


def test_an_optional_input_may_be_left_out_and_a_required_one_not():
    with_default = ModelInfo(
        "m",
        "1",
        (TensorInfo("x", "FP32", (2,)), TensorInfo("bias", "FP32", (2,), optional=True)),
        (TensorInfo("y", "FP32", (2,)),),
        0,
    )
    x = np.ones(2, np.float32)
    call = to_infer_request(decoded(inputs=[tensor("x", x, inference_pb2.FP32)]), with_default, None)
    assert [t.name for t in call.header.inputs] == ["x"]
    with pytest.raises(InvalidArgument, match=r"missing: \['x'\]") as caught:
        to_infer_request(decoded(inputs=[tensor("bias", x, inference_pb2.FP32)]), with_default, None)
    assert "bias (FP32 [2], optional)" in caught.value.message


def test_every_element_type_of_the_proto_has_its_raw_bytes_in_the_one_dtype_table():
    names = [name for name in inference_pb2.ElementType.keys() if name != "ELEMENT_TYPE_UNSPECIFIED"]
    assert set(names) <= set(RAW_DTYPES)  # backend/tensors.py: the one KServe <-> numpy table
    assert all(RAW_DTYPES[name].byteorder in "<|" for name in names)  # KServe's raw tensors are little-endian
    assert (RAW_DTYPES["FP16"], RAW_DTYPES["BOOL"]) == (np.dtype("<f2"), np.dtype("?"))


# Found by the fuzz campaign (tests/integration/test_fuzz.py): shapes of a million dims of 2^63.
MILLION_HUGE_DIMS = [2**63 - 1] * 1_000_000


def test_a_shape_of_a_million_dims_is_refused_while_decoding_in_a_short_message():
    with pytest.raises(RequestRefused) as refused:
        decoded(raw_data=bytes(16), shape=MILLION_HUGE_DIMS, dtype=inference_pb2.FP32)
    assert str(refused.value).startswith("PredictRequest.shape is 9000000 bytes long")
    assert len(str(refused.value)) < 200


def test_a_shape_of_huge_dims_without_data_is_refused_without_multiplying_them():
    # The product of a million of them has 63 million bits: computing it took the facade hours.
    with pytest.raises(InvalidArgument) as refused:
        to_infer_request(decoded(shape=[2**63 - 1] * MAX_RANK), VISION, None)
    assert "has no input" in refused.value.message


def test_a_long_shape_within_the_rank_limit_is_shortened_in_the_message():
    with pytest.raises(InvalidArgument) as refused:
        to_infer_request(decoded(raw_data=bytes(16), shape=[1] * 40), VISION, None)
    assert "has shape [1, 1, 1, 1, 1, 1, 1, 1, ... (40 dims)] (rank 40)" in refused.value.message
