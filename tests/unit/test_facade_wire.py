"""tritonnx.client.facade.wire against real protobuf (de)serialisation, which serves as the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from tritonnx.client.facade import wire
from tritonnx.client.facade.wire import (
    MAX_FIELDS,
    MAX_INPUTS,
    MAX_NAME_BYTES,
    MAX_OUTPUTS,
    MAX_RANK,
    DecodedRequest,
    EncodedResponse,
    Limits,
    RequestRefused,
    WireError,
    canonical_version,
    check_message,
    decode_predict_request,
    encode_predict_response,
    serialize_response,
    varint,
)
from tritonnx.client.proto import inference_pb2

PredictRequest = inference_pb2.PredictRequest
PredictResponse = inference_pb2.PredictResponse
Tensor = inference_pb2.Tensor

UINT32_MAX = 2**32 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
RESNET_INPUT = 1 * 3 * 224 * 224

# float32 bit patterns protobuf's float -> double -> float path might not keep: signalling NaNs,
# NaN payloads and signs, infinities, signed zero, denormals, extremes.
SPECIAL_BITS = np.array(
    [
        0x7FC00000,  # quiet NaN
        0xFFC00000,  # negative quiet NaN
        0x7FC12345,  # quiet NaN with a payload
        0x7F800001,  # signalling NaN
        0xFF800123,  # negative signalling NaN with a payload
        0x7F800000,  # +inf
        0xFF800000,  # -inf
        0x80000000,  # -0.0
        0x00000001,  # smallest denormal
        0x7F7FFFFF,  # float32 max
        0x3F800000,  # 1.0
    ],
    dtype="<u4",
)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def packed_data(values: np.ndarray) -> bytes:
    """Field 1 as one packed chunk of `values` (float32)."""
    raw = np.asarray(values, "<f4").tobytes()
    return tag(1, 2) + varint(len(raw)) + raw


def unpacked_data(values: np.ndarray) -> bytes:
    """Field 1 as one fixed32 element per value."""
    return b"".join(tag(1, 5) + v.tobytes() for v in np.asarray(values, "<f4"))


def assert_decodes_like_protobuf(buffer: bytes) -> DecodedRequest:
    """decode_predict_request(buffer) matches protobuf's own parse of the same bytes."""
    decoded = decode_predict_request(buffer)
    full = PredictRequest.FromString(buffer)
    if full.model_version:
        full.model_version = str(int(full.model_version))  # decoding makes it canonical
    expected_data = np.array(full.data, np.float32)
    expected_raw = full.raw_data
    full.ClearField("data")
    full.ClearField("raw_data")
    assert isinstance(decoded.message, PredictRequest)
    assert decoded.message == full
    assert len(decoded.message.data) == 0 and not decoded.message.raw_data
    assert (bytes(decoded.raw) if decoded.raw is not None else b"") == expected_raw
    if expected_data.size == 0:
        assert decoded.data is None
    else:
        assert decoded.data is not None
        assert decoded.data.dtype == np.float32 and decoded.data.ndim == 1
        np.testing.assert_array_equal(decoded.data, expected_data)
    return decoded


def random_text(rng: np.random.Generator) -> str:
    # ASCII, Latin-1, CJK, emoji and NUL; surrogates are not valid UTF-8 and are left out.
    alphabets = ["abcXYZ019_-./", "\x00\té\xff", "日本語ščž", "🚀😀𝄞"]
    return "".join(rng.choice(list(rng.choice(alphabets))) for _ in range(rng.integers(0, 12)))


def random_floats(rng: np.random.Generator, count: int) -> np.ndarray:
    values = rng.standard_normal(count).astype(np.float32) * np.float32(10.0) ** rng.integers(-30, 30)
    values[rng.random(count) < 0.05] = np.inf  # a few specials protobuf keeps exactly
    values[rng.random(count) < 0.05] = -0.0
    return values


def random_int64s(rng: np.random.Generator, count: int) -> list[int]:
    pool = [0, 1, -1, 3, 224, 1000, INT64_MIN, INT64_MAX, UINT32_MAX]
    return [int(rng.choice(pool)) if rng.random() < 0.5 else int(rng.integers(-(2**40), 2**40)) for _ in range(count)]


def random_uint32(rng: np.random.Generator) -> int:
    return int(rng.choice([0, 1, 127, 128, 2**31, UINT32_MAX - 1, UINT32_MAX, int(rng.integers(0, 2**32))]))


def random_tensor(rng: np.random.Generator) -> Tensor:
    tensor = Tensor(name=random_text(rng), dtype=int(rng.integers(0, 13)), shape=random_int64s(rng, rng.integers(0, 4)))
    tensor.raw_data = rng.bytes(int(rng.choice([0, 1, 7, 64, 4096])))
    return tensor


def random_request(rng: np.random.Generator) -> PredictRequest:
    """Any combination of PredictRequest fields, each present about half of the time."""
    msg = PredictRequest()
    if rng.random() < 0.6:
        msg.data.extend(random_floats(rng, int(rng.choice([1, 2, 3, 10, 1000, 5000]))))
    if rng.random() < 0.5:
        msg.shape.extend(random_int64s(rng, rng.integers(1, 5)))
    for field in ("model_name", "request_id"):
        if rng.random() < 0.5:
            setattr(msg, field, random_text(rng))
    if rng.random() < 0.5:
        msg.model_version = str(rng.choice(["1", "2", "007", "9223372036854775807", "0"]))
    for field in ("priority", "timeout_ms"):
        if rng.random() < 0.5:
            setattr(msg, field, random_uint32(rng))
    if rng.random() < 0.3:
        msg.raw_data = rng.bytes(int(rng.integers(0, 300)))
    if rng.random() < 0.4:
        # Open enum: values outside DataType and negative ones (10-byte varint) are legal on the wire.
        msg.dtype = int(rng.choice([0, 1, 12, 99, 2**31 - 1, -1]))
    for _ in range(int(rng.choice([0, 0, 1, 3]))):
        msg.inputs.append(random_tensor(rng))
    if rng.random() < 0.4:
        msg.output_names.extend(random_text(rng) for _ in range(rng.integers(1, 4)))
    return msg


def full_request(data: np.ndarray | None = None) -> PredictRequest:
    msg = PredictRequest(
        shape=[1, 3, 224, 224],
        model_name="resnet50",
        model_version="1",
        request_id="réq-🚀-日本",
        priority=UINT32_MAX,
        timeout_ms=UINT32_MAX - 1,
        raw_data=b"\x00\x01\xff",
        dtype=inference_pb2.FP16,
        inputs=[Tensor(name="input_ids", dtype=inference_pb2.INT64, shape=[1, 8], raw_data=bytes(64)), Tensor()],
        output_names=["logits", "", "ünïcode"],
    )
    if data is not None:
        msg.data.extend(data)
    return msg


# ---------------------------------------------------------------- round trips of valid requests


@pytest.mark.parametrize(
    "msg",
    [
        PredictRequest(),
        PredictRequest(data=[1.5]),
        PredictRequest(data=[1.0, -2.0, 3.25], shape=[3]),
        PredictRequest(shape=[1, 4], model_name="m"),
        full_request(),
        full_request(data=np.linspace(-1, 1, 17, dtype=np.float32)),
        PredictRequest(request_id="\x00", priority=1),
        PredictRequest(inputs=[Tensor(name="x", raw_data=b"\x0a\x04abcd")]),  # field-1-like bytes nested
    ],
    ids=["empty", "one-float", "data-shape", "no-data", "all-but-data", "all-fields", "nul-id", "nested-tag-1"],
)
def test_decode_matches_protobuf(msg):
    decoded = assert_decodes_like_protobuf(msg.SerializeToString())
    expected = PredictRequest()
    expected.CopyFrom(msg)
    expected.ClearField("data")
    expected.ClearField("raw_data")
    assert decoded.message == expected
    assert decoded.nbytes == msg.ByteSize()


@pytest.mark.parametrize("seed", range(20))
def test_decode_matches_protobuf_on_random_requests(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        msg = random_request(rng)
        decoded = assert_decodes_like_protobuf(msg.SerializeToString())
        if len(msg.data):
            np.testing.assert_array_equal(decoded.data.view("<u4"), np.array(msg.data, np.float32).view("<u4"))
        else:
            assert decoded.data is None


def test_decode_resnet_sized_payload_is_a_view_of_the_buffer():
    values = np.random.default_rng(0).standard_normal(RESNET_INPUT).astype(np.float32)
    buffer = full_request(values).SerializeToString()
    decoded = assert_decodes_like_protobuf(buffer)
    np.testing.assert_array_equal(decoded.data, values)
    # No copy of the float bytes: the array reads the request buffer itself.
    assert np.shares_memory(decoded.data, np.frombuffer(buffer, np.uint8))


def test_decode_accepts_bytearray_and_memoryview():
    buffer = full_request(np.arange(5, dtype=np.float32)).SerializeToString()
    for other in (bytearray(buffer), memoryview(buffer)):
        decoded = decode_predict_request(other)
        assert decoded.message == decode_predict_request(buffer).message
        np.testing.assert_array_equal(decoded.data, np.arange(5, dtype=np.float32))


def test_fields_before_and_after_data():
    # Concatenated messages merge on parsing: this puts fields on both sides of field 1.
    before = PredictRequest(model_name="resnet50", shape=[1, 3], inputs=[Tensor(name="a")]).SerializeToString()
    data = PredictRequest(data=[1.0, 2.0, 3.0]).SerializeToString()
    after = PredictRequest(request_id="id-1", shape=[4], priority=7, output_names=["y"]).SerializeToString()
    decoded = assert_decodes_like_protobuf(before + data + after)
    np.testing.assert_array_equal(decoded.data, [1.0, 2.0, 3.0])
    assert decoded.message == PredictRequest(
        model_name="resnet50",
        shape=[1, 3, 4],
        inputs=[Tensor(name="a")],
        request_id="id-1",
        priority=7,
        output_names=["y"],
    )


def test_data_split_into_packed_chunks_is_concatenated():
    chunks = [np.arange(i * 10, i * 10 + n, dtype=np.float32) for i, n in enumerate([3, 1, 5])]
    other = PredictRequest(model_name="m").SerializeToString()
    buffer = packed_data(chunks[0]) + other + packed_data(chunks[1]) + packed_data(chunks[2]) + other
    decoded = assert_decodes_like_protobuf(buffer)
    np.testing.assert_array_equal(decoded.data, np.concatenate(chunks))
    assert decoded.message == PredictRequest(model_name="m")


def test_unpacked_data_and_mixed_forms_keep_wire_order():
    buffer = (
        unpacked_data(np.array([1.0, 2.0]))
        + PredictRequest(shape=[5]).SerializeToString()
        + packed_data(np.array([3.0, 4.0]))
        + unpacked_data(np.array([5.0]))
    )
    decoded = assert_decodes_like_protobuf(buffer)
    np.testing.assert_array_equal(decoded.data, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert decoded.message == PredictRequest(shape=[5])


@pytest.mark.parametrize("buffer", [packed_data(np.array([])), packed_data(np.array([])) * 3], ids=["one", "three"])
def test_empty_packed_chunks_mean_no_data(buffer):
    assert decode_predict_request(buffer).data is None


def test_non_minimal_varints_are_accepted():
    # Tag 1/2 as the 2-byte varint 0x8a 0x00, length 8 as 0x88 0x00: wasteful but legal.
    floats = np.array([1.0, 2.0], "<f4").tobytes()
    buffer = b"\x8a\x00\x88\x00" + floats + PredictRequest(priority=3).SerializeToString()
    decoded = assert_decodes_like_protobuf(buffer)
    np.testing.assert_array_equal(decoded.data, [1.0, 2.0])


def test_special_float_bits_survive_decoding():
    values = SPECIAL_BITS.view("<f4")
    for buffer in (packed_data(values), unpacked_data(values), packed_data(values[:4]) + unpacked_data(values[4:])):
        decoded = decode_predict_request(buffer + PredictRequest(request_id="x").SerializeToString())
        np.testing.assert_array_equal(decoded.data.view("<u4"), SPECIAL_BITS)


# ---------------------------------------------------------------- malformed requests


@pytest.mark.parametrize(
    "buffer, message",
    [
        (b"\x80", "truncated varint"),  # tag cut short
        (b"\x30\x80\x80", "truncated varint"),  # priority's value cut short
        (b"\x30" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
        (b"\x1a\x05abc", "past the end"),  # model_name: 5 bytes announced, 3 present
        (b"\x1a\x80", "truncated varint"),  # length cut short
        (packed_data(np.zeros(2))[:-1], "past the end"),
        (b"\x0a\x03abc", "not a multiple of 4"),
        (b"\x0a\x06" + bytes(6), "not a multiple of 4"),
        (b"\x0d\x00\x00", "past the end"),  # unpacked float cut short
        (b"\x61" + bytes(4), "past the end"),  # fixed64 (unknown field 12) cut short
        (b"\x1b\x1c", "wire type 3"),  # a group: protobuf itself would accept this as an unknown field
        (b"\x1c", "wire type 4"),
        (b"\x1e", "wire type 6"),
        (b"\x1f", "wire type 7"),
        (b"\x00", "field number 0"),
        (b"\x02\x00", "field number 0"),
        (b"\x08\x01", "float field 1 has wire type 0"),
        (b"\x09" + bytes(8), "float field 1 has wire type 1"),
        (b"\x1a\x02\xff\xfe", "malformed PredictRequest"),  # invalid UTF-8 in a string
        (b"\x52\x02\x0a\x05", "malformed PredictRequest"),  # a Tensor whose name runs past its end
        (full_request(np.ones(4)).SerializeToString() + b"\x80", "truncated varint"),  # trailing junk
    ],
)
def test_malformed_requests_raise_wire_error(buffer, message):
    with pytest.raises(WireError, match=message) as info:
        decode_predict_request(buffer)
    assert isinstance(info.value, ValueError)


def _decode_or_wire_error(buffer: bytes) -> DecodedRequest | None:
    """The decoded request, None on WireError; any other exception fails the test."""
    try:
        decoded = decode_predict_request(buffer)
    except WireError:
        return None
    # What decodes must also be a PredictRequest protobuf accepts, with the same content.
    assert_decodes_like_protobuf(buffer)
    return decoded


@pytest.mark.parametrize("seed", range(5))
def test_random_garbage_only_raises_wire_error(seed):
    rng = np.random.default_rng(1000 + seed)
    for _ in range(400):
        _decode_or_wire_error(rng.bytes(int(rng.integers(0, 80))))


@pytest.mark.parametrize("seed", range(5))
def test_truncated_and_corrupted_requests_only_raise_wire_error(seed):
    rng = np.random.default_rng(2000 + seed)
    for _ in range(5):
        msg = random_request(rng)
        del msg.data[10:]  # keep the buffers short: every prefix is tried
        buffer = msg.SerializeToString()
        for end in range(len(buffer)):
            _decode_or_wire_error(buffer[:end])
        for _ in range(50):
            corrupted = bytearray(buffer or b"\x00")
            corrupted[rng.integers(len(corrupted))] ^= 1 << int(rng.integers(8))
            _decode_or_wire_error(bytes(corrupted))


# ---------------------------------------------------------------- responses


def full_response() -> PredictResponse:
    return PredictResponse(
        shape=[1, 1000],
        request_id="réq-🚀",
        model_name="resnet50",
        model_version="1",
        outputs=[Tensor(name="logits", dtype=inference_pb2.FP32, shape=[1, 2], raw_data=bytes(8))],
        error=inference_pb2.Error(code=3, message="bad"),
    )


def expected_response(message: PredictResponse, predictions: np.ndarray) -> PredictResponse:
    """The same response built the protobuf way."""
    expected = PredictResponse()
    expected.CopyFrom(message)
    expected.predictions.extend(np.asarray(predictions, np.float32).ravel(order="C").tolist())
    return expected


_VALUES = np.random.default_rng(7).standard_normal((4, 250))


@pytest.mark.parametrize(
    "predictions",
    [
        _VALUES.astype(np.float32).ravel(),
        _VALUES.astype(np.float32),  # 2-D: flattened row-major
        _VALUES,  # float64: cast
        _VALUES.astype(np.float32)[:, ::3],  # non-contiguous
        np.asfortranarray(_VALUES.astype(np.float32)),
        _VALUES.astype(">f4"),  # big-endian
        np.arange(10, dtype=np.int64),
        np.float32(2.5).reshape(()),  # 0-d
        np.array([1.0], np.float32),
    ],
    ids=["f32", "2d", "f64", "strided", "fortran", "big-endian", "int64", "0-d", "one"],
)
@pytest.mark.parametrize("message", [PredictResponse(), full_response()], ids=["empty", "full"])
def test_encoded_response_parses_like_protobuf(message, predictions):
    encoded = encode_predict_response(message, predictions)
    parsed = PredictResponse.FromString(encoded)
    expected = expected_response(message, predictions)
    assert parsed == expected
    np.testing.assert_array_equal(np.array(parsed.predictions, np.float32), np.asarray(predictions, np.float32).ravel())
    # Same size as protobuf's own (packed) encoding: only the field order differs.
    assert len(encoded) == len(expected.SerializeToString())


@pytest.mark.parametrize(
    "predictions", [None, np.array([], np.float32), np.zeros((0, 5))], ids=["none", "empty", "0x5"]
)
def test_encode_without_predictions_is_the_message(predictions):
    message = full_response()
    assert encode_predict_response(message, predictions) == message.SerializeToString()


def test_encode_refuses_predictions_given_twice():
    with pytest.raises(ValueError, match="predictions"):
        encode_predict_response(PredictResponse(predictions=[1.0]), np.ones(2))


def test_encoded_predictions_are_the_exact_float_bits():
    values = SPECIAL_BITS.view("<f4")
    encoded = encode_predict_response(PredictResponse(request_id="x"), values)
    header = b"\x0a" + varint(values.nbytes)
    assert encoded.startswith(header + SPECIAL_BITS.tobytes())
    parsed = PredictResponse.FromString(encoded)
    assert parsed.request_id == "x"
    np.testing.assert_array_equal(np.array(parsed.predictions, np.float32), values)  # NaNs compare equal here


def test_serialize_response_is_encode_predict_response():
    response = EncodedResponse(message=full_response(), predictions=np.arange(3, dtype=np.float32))
    assert serialize_response(response) == encode_predict_response(response.message, response.predictions)
    assert serialize_response(EncodedResponse(PredictResponse(), None)) == b""


def test_response_of_resnet_output_size():
    logits = np.random.default_rng(3).standard_normal((1, 1000)).astype(np.float32)
    message = PredictResponse(shape=[1, 1000], request_id="r", model_name="resnet50")
    parsed = PredictResponse.FromString(encode_predict_response(message, logits))
    np.testing.assert_array_equal(np.array(parsed.predictions, np.float32), logits.ravel())


# ---------------------------------------------------------------- varint


@pytest.mark.parametrize(
    "value, encoded",
    [(0, "00"), (1, "01"), (127, "7f"), (128, "8001"), (300, "ac02"), (2**64 - 1, "ffffffffffffffffff01")],
)
def test_varint_known_values(value, encoded):
    assert varint(value).hex() == encoded


@pytest.mark.parametrize("value", [1, 127, 128, 16383, 16384, 2**21, 2**28, UINT32_MAX])
def test_varint_matches_protobuf(value):
    # timeout_ms is field 7, wire type 0: tag byte 0x38 (0, the proto3 default, is not serialised).
    assert b"\x38" + varint(value) == PredictRequest(timeout_ms=value).SerializeToString()


def test_varint_refuses_negative_numbers():
    with pytest.raises(ValueError):
        varint(-1)


def test_raw_data_is_a_view_of_the_buffer_and_the_last_occurrence_wins():
    payload = np.arange(1000, dtype=np.float32).tobytes()
    buffer = PredictRequest(raw_data=payload, shape=[1000], request_id="r").SerializeToString()
    decoded = decode_predict_request(buffer)
    assert bytes(decoded.raw) == payload and decoded.message.request_id == "r"
    assert np.shares_memory(np.frombuffer(decoded.raw, np.uint8), np.frombuffer(buffer, np.uint8))
    twice = PredictRequest(raw_data=b"old").SerializeToString() + buffer
    assert bytes(decode_predict_request(twice).raw) == payload


# ---------------------------------------------------------------- limits: what a crafted request may cost


def refused(buffer: bytes, match: str) -> RequestRefused:
    with pytest.raises(RequestRefused, match=match) as info:
        decode_predict_request(buffer)
    return info.value


def count_varint_reads(monkeypatch) -> list[int]:
    """Every varint the walk reads, counted: the walk's work, measured in fields instead of seconds."""
    reads = [0]
    real = wire.read_varint

    def counting(buffer, pos):
        reads[0] += 1
        return real(buffer, pos)

    monkeypatch.setattr(wire, "read_varint", counting)
    return reads


@pytest.mark.parametrize(
    "field, repeat, match",
    [
        (PredictRequest(priority=1).SerializeToString(), 4_000_000, f"more than {MAX_FIELDS} fields"),
        (PredictRequest(output_names=[""]).SerializeToString(), 4_000_000, f"output_names has more than {MAX_OUTPUTS}"),
        (PredictRequest(inputs=[Tensor()]).SerializeToString(), 4_000_000, f"inputs has more than {MAX_INPUTS}"),
        (tag(2, 0) + b"\x01", 4_000_000, f"shape has more than {MAX_RANK}"),  # unpacked dims
        (tag(12, 0) + b"\x01", 4_000_000, f"more than {MAX_FIELDS} fields"),  # an unknown field
    ],
    ids=["priority", "output_names", "inputs", "unpacked-shape", "unknown"],
)
def test_a_flood_of_fields_is_refused_after_a_bounded_walk(monkeypatch, field, repeat, match):
    buffer = field * repeat  # megabytes: as many fields as gRPC's message limit lets through
    reads = count_varint_reads(monkeypatch)
    refused(buffer, match)
    # Each field is a key and at most one length or value: the walk stopped at the limit, not at the end.
    assert reads[0] <= 2 * (MAX_FIELDS + 1)


def test_a_packed_shape_of_millions_of_dims_is_refused_by_its_length():
    dims = b"\x01" * 10_000_000
    error = refused(tag(2, 2) + varint(len(dims)) + dims, "shape is 10000000 bytes long")
    assert f"at most {MAX_RANK * 10}" in str(error)


def test_a_packed_shape_within_its_bytes_but_above_the_rank_is_refused():
    refused(PredictRequest(shape=[1] * (MAX_RANK + 1)).SerializeToString(), f"{MAX_RANK + 1} dims")
    refused(
        PredictRequest(inputs=[Tensor(name="x", shape=[1] * (MAX_RANK + 1))]).SerializeToString(),
        rf"inputs\['x'\].shape has {MAX_RANK + 1} dims",
    )
    assert len(decode_predict_request(PredictRequest(shape=[7] * MAX_RANK).SerializeToString()).message.shape) == 64


@pytest.mark.parametrize("field", ["model_name", "request_id"])
def test_names_longer_than_the_limit_are_refused(field):
    assert decode_predict_request(PredictRequest(**{field: "n" * MAX_NAME_BYTES}).SerializeToString())
    refused(PredictRequest(**{field: "n" * (MAX_NAME_BYTES + 1)}).SerializeToString(), f"{field} is 257 bytes long")
    refused(PredictRequest(output_names=["o" * 1000]).SerializeToString(), "output_names is 1000 bytes long")
    refused(PredictRequest(inputs=[Tensor(name="i" * 1000)]).SerializeToString(), "inputs entry.name is 1000 bytes")


def test_an_input_tensor_with_a_flood_of_dims_is_refused_before_protobuf_parses_it(monkeypatch):
    dims = (tag(3, 0) + b"\x01") * 1_000_000
    inner = Tensor(name="x").SerializeToString() + dims
    reads = count_varint_reads(monkeypatch)
    refused(tag(10, 2) + varint(len(inner)) + inner, f"inputs entry.shape has more than {MAX_RANK}")
    assert reads[0] <= 2 * (MAX_RANK + 8)


@pytest.mark.parametrize(
    "given, canonical", [("1", "1"), ("01", "1"), ("0042", "42"), ("9223372036854775807", "9223372036854775807")]
)
def test_versions_are_decimal_numbers_made_canonical(given, canonical):
    assert canonical_version(given) == canonical
    assert decode_predict_request(PredictRequest(model_version=given).SerializeToString()).message.model_version == (
        canonical
    )


@pytest.mark.parametrize(
    "given", ["1abc", " 1", "1 ", "+1", "-1", "1.0", "0x1", "١", "9223372036854775808", "1" + "\x00" * 3]
)
def test_versions_that_are_not_decimal_numbers_are_refused(given):
    with pytest.raises(RequestRefused, match="not a version number"):
        canonical_version(given)


def test_a_version_followed_by_a_megabyte_is_refused_by_its_length():
    error = refused(PredictRequest(model_version="1" + "x" * 2**20).SerializeToString(), "model_version is")
    assert len(str(error)) < 200  # the junk is not echoed back


def test_millions_of_unpacked_floats_are_decoded_as_arrays():
    values = np.random.default_rng(5).standard_normal(3_000_000).astype(np.float32)
    decoded = decode_predict_request(unpacked_data(values) + PredictRequest(shape=[3_000_000]).SerializeToString())
    np.testing.assert_array_equal(decoded.data, values)
    assert decoded.message.shape == [3_000_000]


def test_runs_of_unpacked_floats_between_other_fields_count_as_fields(monkeypatch):
    # Short runs interleaved with other fields: each run is one field, found without scanning the rest.
    piece = unpacked_data(np.array([1.0, 2.0])) + PredictRequest(priority=1).SerializeToString()
    decoded = decode_predict_request(piece * (MAX_FIELDS // 2))
    np.testing.assert_array_equal(decoded.data, np.tile([1.0, 2.0], MAX_FIELDS // 2))
    refused(piece * (MAX_FIELDS // 2 + 1), f"more than {MAX_FIELDS} fields")


def test_check_message_walks_other_messages_within_their_limits():
    limits = Limits(inference_pb2.ClassifyRequest, max_fields=8, lengths={2: 4})
    check_message(inference_pb2.ClassifyRequest(model_name="abcd", top_k=3).SerializeToString(), limits)
    with pytest.raises(RequestRefused, match="ClassifyRequest.model_name is 5 bytes long: at most 4"):
        check_message(inference_pb2.ClassifyRequest(model_name="abcde").SerializeToString(), limits)
    with pytest.raises(RequestRefused, match="more than 8 fields"):
        check_message(inference_pb2.ClassifyRequest(priority=1).SerializeToString() * 9, limits)
    with pytest.raises(WireError, match="past the end"):
        check_message(b"\x22\x05ab", limits)  # request_id: 5 bytes announced, 2 present
