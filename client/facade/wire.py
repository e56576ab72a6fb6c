"""Fast wire-level (de)serialisation of the float payload of `PredictRequest` / `PredictResponse`.

A resnet50 request carries 150,528 floats in `PredictRequest.data` (field 1). Parsing it with
Python protobuf and then `np.array(request.data)` creates one Python float per element, which
costs milliseconds per request. The packed wire bytes of a `repeated float` field already are
little-endian float32, so this module walks only the top-level fields of the message, takes
field 1 as a numpy view of the original buffer and leaves every other field to protobuf.
`raw_data` (field 8) is taken the same way, as a view: Python protobuf would copy its bytes on
every access. The
response goes the other way: `predictions` (field 1) is written straight from a numpy array and
prepended to the protobuf serialisation of the rest (parsers accept fields in any order).

The server plugs `decode_predict_request` in as the gRPC request deserializer and
`serialize_response` as the response serializer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError

from client.proto import inference_pb2

# Field 1 (data / predictions) of both messages, and field 8 (raw_data) of PredictRequest.
_FLOAT_FIELD = 1
_RAW_FIELD = 8
# Tag of field 1 with wire type 2 (length-delimited, i.e. packed): (1 << 3) | 2.
_PACKED_FLOAT_TAG = b"\x0a"
_FLOAT32_LE = np.dtype("<f4")
# A varint encodes at most 64 bits, in at most 10 bytes.
_MAX_VARINT_BYTES = 10

_WIRE_VARINT, _WIRE_FIXED64, _WIRE_LEN, _WIRE_FIXED32 = 0, 1, 2, 5


# What parsing malformed bytes raises: DecodeError, and with protobuf's pure-Python implementation
# (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python) UnicodeDecodeError for a string field that is not UTF-8.
PARSE_ERRORS = (DecodeError, UnicodeDecodeError)


class WireError(ValueError):
    """The request bytes are not a well-formed `PredictRequest` (the server answers INVALID_ARGUMENT)."""


@dataclass
class DecodedRequest:
    """A `PredictRequest` split in two: every field but `data`, and `data` as float32."""

    message: inference_pb2.PredictRequest  # fields 1 (`data`) and 8 (`raw_data`) are always empty here
    data: np.ndarray | None  # 1-D float32, possibly a read-only view of the request bytes; None if absent
    raw: memoryview | None = None  # `raw_data`, a view of the request bytes; None if absent or empty


@dataclass
class EncodedResponse:
    """A `PredictResponse` whose `predictions` are given as an array instead of the protobuf field."""

    message: inference_pb2.PredictResponse  # field 1 (`predictions`) must be left empty
    predictions: np.ndarray | None


def varint(n: int) -> bytes:
    """The protobuf base-128 varint encoding of the unsigned integer `n`."""
    if n < 0:
        raise ValueError(f"varint of a negative number: {n}")
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(buffer: memoryview | bytes, pos: int) -> tuple[int, int]:
    """The varint starting at `pos`, and the position after it."""
    result = 0
    shift = 0
    end = min(len(buffer), pos + _MAX_VARINT_BYTES)
    while pos < end:
        byte = buffer[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    if pos == len(buffer):
        raise WireError(f"truncated varint at byte {pos} of {len(buffer)}")
    raise WireError(f"varint longer than {_MAX_VARINT_BYTES} bytes ending at byte {pos}")


def decode_predict_request(buffer: bytes) -> DecodedRequest:
    """Parse serialised `PredictRequest` bytes, taking `data` as float32 without per-element work.

    Raises WireError when the bytes are truncated or malformed.
    """
    view = memoryview(buffer)
    size = len(view)
    # Spans of field 1's float bytes, in wire order (packed chunks and single unpacked elements).
    float_spans: list[memoryview] = []
    raw: memoryview | None = None
    # Spans of every other field, in wire order; consecutive fields stay one span.
    other_spans: list[memoryview] = []
    other_start = 0
    pos = 0
    while pos < size:
        field_start = pos
        key, pos = read_varint(view, pos)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise WireError(f"field number 0 at byte {field_start}")
        if wire_type == _WIRE_VARINT:
            _, pos = read_varint(view, pos)
        elif wire_type == _WIRE_LEN:
            length, pos = read_varint(view, pos)
            value_start, pos = pos, pos + length
        elif wire_type == _WIRE_FIXED64:
            pos += 8
        elif wire_type == _WIRE_FIXED32:
            pos += 4
        else:
            # 3/4 are groups (absent from this schema, deprecated), 6/7 do not exist.
            raise WireError(f"field {field} has unsupported wire type {wire_type} at byte {field_start}")
        if pos > size:
            raise WireError(f"field {field} at byte {field_start} runs past the end of the {size}-byte message")
        if field == _RAW_FIELD and wire_type == _WIRE_LEN:
            raw = view[value_start:pos]  # a singular field: the last occurrence wins, as in protobuf
        elif field != _FLOAT_FIELD:
            continue
        elif wire_type == _WIRE_LEN:
            if length % 4:
                raise WireError(f"packed float field 1 has a length of {length} bytes, not a multiple of 4")
            float_spans.append(view[value_start:pos])
        elif wire_type == _WIRE_FIXED32:
            float_spans.append(view[pos - 4 : pos])
        else:
            # protobuf would keep it as an unknown field; no client of a float field sends it.
            raise WireError(f"float field 1 has wire type {wire_type} at byte {field_start}")
        if field_start > other_start:
            other_spans.append(view[other_start:field_start])
        other_start = pos
    if other_start < size:
        other_spans.append(view[other_start:])

    # Without fields 1 and 8 the buffer is the message as it is: no need to copy it (FromString wants bytes).
    taken = float_spans or raw is not None
    rest = buffer if not taken and isinstance(buffer, bytes) else b"".join(other_spans)
    try:
        message = inference_pb2.PredictRequest.FromString(rest)
    except PARSE_ERRORS as err:
        raise WireError(f"malformed PredictRequest: {err}") from err

    raw = raw if raw is not None and len(raw) else None
    if not float_spans:
        return DecodedRequest(message=message, data=None, raw=raw)
    if len(float_spans) == 1:
        data = np.frombuffer(float_spans[0], dtype=_FLOAT32_LE)  # zero-copy view
    else:
        # A split field (legal in protobuf): one copy to make the chunks contiguous.
        data = np.frombuffer(b"".join(float_spans), dtype=_FLOAT32_LE)
    # Empty packed chunks only: the same as no data at all.
    return DecodedRequest(message=message, data=data if data.size else None, raw=raw)


def encode_predict_response(message: inference_pb2.PredictResponse, predictions: np.ndarray | None) -> bytes:
    """Serialise `message` with `predictions` (any shape, flattened in C order) as its field 1."""
    body = message.SerializeToString()
    if predictions is None or predictions.size == 0:
        return body
    if len(message.predictions):
        # Both would be concatenated on parsing: a caller's mistake, not a payload to send.
        raise ValueError("message.predictions is set and predictions were given as well")
    # Casts / makes C-contiguous only when needed; bytes.join then copies the buffer once.
    floats = np.ascontiguousarray(predictions, dtype=_FLOAT32_LE)
    return b"".join((_PACKED_FLOAT_TAG, varint(floats.nbytes), floats.data, body))


def serialize_response(response: EncodedResponse) -> bytes:
    """The gRPC response serializer: `response` as `PredictResponse` bytes."""
    return encode_predict_response(response.message, response.predictions)
