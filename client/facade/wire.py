"""Fast, bounded wire-level (de)serialisation of `PredictRequest` / `PredictResponse`, and the limits of requests.

A resnet50 request carries 150,528 floats in `PredictRequest.data` (field 1). Parsing it with
Python protobuf and then `np.array(request.data)` creates one Python float per element, which
costs milliseconds per request. The packed wire bytes of a `repeated float` field already are
little-endian float32, so this module walks only the top-level fields of the message, takes
field 1 as a numpy view of the original buffer and leaves every other field to protobuf.
`raw_data` (field 8) is taken the same way, as a view: Python protobuf would copy its bytes on
every access. The response goes the other way: `predictions` (field 1) is written straight from a
numpy array and prepended to the protobuf serialisation of the rest (parsers accept fields in any order).

The walk is also where a request is bounded, before protobuf or numpy materialise anything: it runs as gRPC's
deserializer on the event loop every caller shares, so its work must not grow with what a caller crafts. It stops at
the first field past a limit (`Limits`: the number of fields, of each repeated field's entries, the bytes of each
string), takes unpacked `data` a run at a time with numpy, and what exceeds a limit is refused with
`RequestRefused`, naming the limit.

The server plugs `decode_predict_request` in as the gRPC request deserializer and
`serialize_response` as the response serializer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import numpy as np
from google.protobuf.message import DecodeError

from tritonnx.backend.varint import MAX_VARINT_BYTES, VarintError, read_varint, varint
from tritonnx.client.proto import inference_pb2

# Field 1 (data / predictions) of both messages, field 8 (raw_data) and field 10 (inputs) of PredictRequest.
_FLOAT_FIELD = 1
_RAW_FIELD = 8
_INPUTS_FIELD = 10
# Tag of field 1 with wire type 2 (length-delimited, i.e. packed): (1 << 3) | 2.
_PACKED_FLOAT_TAG = b"\x0a"
# An unpacked `data` element: the key of field 1 with wire type 5 (fixed32), then 4 float bytes.
_UNPACKED_FLOAT_KEY = (1 << 3) | 5
_UNPACKED_FLOAT_BYTES = 5
_FLOAT32_LE = np.dtype("<f4")
_INT64_MAX = 2**63 - 1

_WIRE_VARINT, _WIRE_FIXED64, _WIRE_LEN, _WIRE_FIXED32 = 0, 1, 2, 5

# The limits of a request: far above what any valid one needs (a valid PredictRequest has fewer than 20 top-level
# fields), low enough that checking them costs nothing.
MAX_FIELDS = 1024  # top-level fields of a message; a run of unpacked `data` elements counts as one
MAX_INPUTS = 256  # named inputs of a PredictRequest
MAX_OUTPUTS = 256  # output_names of a PredictRequest
MAX_RANK = 64  # dims of a shape: beyond any model's rank
MAX_NAME_BYTES = 256  # model names, request ids, tensor and output names
MAX_VERSION_CHARS = 19  # the digits of the largest int64, Triton's version type


# What parsing malformed bytes raises: DecodeError, and with protobuf's pure-Python implementation
# (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python) UnicodeDecodeError for a string field that is not UTF-8.
PARSE_ERRORS = (DecodeError, UnicodeDecodeError)


class WireError(ValueError):
    """The request bytes are not a well-formed `PredictRequest` (the server answers INVALID_ARGUMENT)."""


class RequestRefused(WireError):
    """Well-formed bytes past a limit of this server, or a field that cannot mean anything; the message says which."""


@dataclass(frozen=True)
class Limits:
    """How much of each field one message may carry; `counts` and `lengths` are keyed by field number."""

    message: type  # the protobuf message class: its name and its fields' names go into the refusals
    max_fields: int = MAX_FIELDS
    counts: Mapping[int, int] = dataclass_field(default_factory=dict)  # most entries of a repeated field
    lengths: Mapping[int, int] = dataclass_field(default_factory=dict)  # most bytes of a length-delimited field
    label: str = ""  # what the refusals call the message (default: its type's name)

    @property
    def name_of_message(self) -> str:
        return self.label or self.message.DESCRIPTOR.name  # type: ignore[attr-defined]

    def name(self, number: int) -> str:
        found = self.message.DESCRIPTOR.fields_by_number.get(number)  # type: ignore[attr-defined]
        return found.name if found is not None else f"<field {number}>"


# A packed shape of more than this many bytes holds more than MAX_RANK dims whatever their values.
_PACKED_DIMS_BYTES = MAX_RANK * MAX_VARINT_BYTES
TENSOR_LIMITS = Limits(
    inference_pb2.Tensor,
    max_fields=MAX_RANK + 16,
    counts={3: MAX_RANK},
    lengths={1: MAX_NAME_BYTES, 3: _PACKED_DIMS_BYTES},
    label="PredictRequest.inputs entry",
)
PREDICT_LIMITS = Limits(
    inference_pb2.PredictRequest,
    counts={2: MAX_RANK, _INPUTS_FIELD: MAX_INPUTS, 11: MAX_OUTPUTS},
    lengths={2: _PACKED_DIMS_BYTES, 3: MAX_NAME_BYTES, 4: MAX_VERSION_CHARS, 5: MAX_NAME_BYTES, 11: MAX_NAME_BYTES},
)

# A ClassifyRequest's image is bounded by the message size the servicer allows it (--max-image-bytes).
CLASSIFY_LIMITS = Limits(inference_pb2.ClassifyRequest, max_fields=64, lengths={2: MAX_NAME_BYTES, 4: MAX_NAME_BYTES})
LIST_MODELS_LIMITS = Limits(inference_pb2.ListModelsRequest, max_fields=64)


@dataclass
class DecodedRequest:
    """A `PredictRequest` split in two: every field but `data`, and `data` as float32."""

    message: inference_pb2.PredictRequest  # fields 1 (`data`) and 8 (`raw_data`) are always empty here
    data: np.ndarray | None  # 1-D float32, possibly a read-only view of the request bytes; None if absent
    raw: memoryview | None = None  # `raw_data`, a view of the request bytes; None if absent or empty
    nbytes: int = 0  # the size of the serialised request, which the views above keep alive


@dataclass
class EncodedResponse:
    """A `PredictResponse` whose `predictions` are given as an array instead of the protobuf field."""

    message: inference_pb2.PredictResponse  # field 1 (`predictions`) must be left empty
    predictions: np.ndarray | None


def decode_predict_request(buffer: bytes) -> DecodedRequest:
    """Parse serialised `PredictRequest` bytes, taking `data` as float32 without per-element work.

    Bounded before anything is materialised (`PREDICT_LIMITS`): the walk over the top-level fields stops at the
    first field past a limit, and unpacked `data` is taken a run at a time by numpy. `model_version` comes out
    canonical (a decimal number without leading zeros). Raises WireError when the bytes are truncated or malformed,
    RequestRefused (a WireError) when they exceed a limit or name no version number.
    """
    view = memoryview(buffer)
    size = len(view)
    # Field 1's floats, in wire order: packed chunks as views, runs of unpacked elements as arrays.
    float_parts: list[memoryview | np.ndarray] = []
    raw: memoryview | None = None
    # Spans of every other field, in wire order; consecutive fields stay one span.
    other_spans: list[memoryview] = []
    other_start = 0
    for field, wire_type, field_start, value_start, end in _walk(view, PREDICT_LIMITS, unpacked_floats=True):
        if field == _RAW_FIELD and wire_type == _WIRE_LEN:
            raw = view[value_start:end]  # a singular field: the last occurrence wins, as in protobuf
        elif field != _FLOAT_FIELD:
            if field == _INPUTS_FIELD and wire_type == _WIRE_LEN:
                _check_input(view[value_start:end])
            continue
        elif wire_type == _WIRE_LEN:
            if (end - value_start) % 4:
                raise WireError(f"packed float field 1 has a length of {end - value_start} bytes, not a multiple of 4")
            float_parts.append(view[value_start:end])
        elif wire_type == _WIRE_FIXED32:
            float_parts.append(_unpacked_floats(view, field_start, end))
        else:
            # protobuf would keep it as an unknown field; no client of a float field sends it.
            raise WireError(f"float field 1 has wire type {wire_type} at byte {field_start}")
        if field_start > other_start:
            other_spans.append(view[other_start:field_start])
        other_start = end
    if other_start < size:
        other_spans.append(view[other_start:])

    # Without fields 1 and 8 the buffer is the message as it is: no need to copy it (FromString wants bytes).
    taken = float_parts or raw is not None
    rest = buffer if not taken and isinstance(buffer, bytes) else b"".join(other_spans)
    try:
        message = inference_pb2.PredictRequest.FromString(rest)
    except PARSE_ERRORS as err:
        raise WireError(f"malformed PredictRequest: {err}") from err
    _check_ranks(message)
    if message.model_version:
        message.model_version = canonical_version(message.model_version)

    raw = raw if raw is not None and len(raw) else None
    if not float_parts:
        return DecodedRequest(message=message, data=None, raw=raw, nbytes=size)
    if len(float_parts) == 1 and isinstance(float_parts[0], memoryview):
        data = np.frombuffer(float_parts[0], dtype=_FLOAT32_LE)  # zero-copy view
    else:
        # A split field (legal in protobuf), or unpacked elements: one copy to make them contiguous.
        data = np.concatenate([np.frombuffer(part, dtype=_FLOAT32_LE) for part in float_parts])
    # Empty packed chunks only: the same as no data at all.
    return DecodedRequest(message=message, data=data if data.size else None, raw=raw, nbytes=size)


def canonical_version(text: str) -> str:
    """A requested model version as the number it names ("01" -> "1"); RequestRefused unless it is a decimal number.

    Triton reads a version with std::stol, so "1abc", " 1" and "1" followed by a megabyte of anything all name version
    1: taken as they are, each would be a model of its own to every cache keyed by version.
    """
    if not (text.isascii() and text.isdigit()) or int(text) > _INT64_MAX:
        shown = text if len(text) <= MAX_VERSION_CHARS else f"{text[:MAX_VERSION_CHARS]}..."
        raise RequestRefused(
            f"model_version {shown!r} is not a version number: give a decimal number such as 1, or leave it empty "
            "for the version the model's policy serves"
        )
    return str(int(text))


def field_length(buffer: bytes, limits: Limits, number: int) -> int | None:
    """The byte length of length-delimited field `number` (its last occurrence); None when absent.

    The message is walked within `limits`, raising as `check_message` does.
    """
    length = None
    for field, wire_type, _, value_start, end in _walk(memoryview(buffer), limits):
        if field == number and wire_type == _WIRE_LEN:
            length = end - value_start
    return length


def check_message(buffer: bytes, limits: Limits) -> None:
    """Walk `buffer`'s top-level fields within `limits` (RequestRefused past them, WireError when malformed).

    For messages parsed by protobuf after this: nothing they hold is materialised before the walk passed.
    """
    _check_fields(memoryview(buffer), limits)


def _check_input(view: memoryview) -> None:
    """Walk a named input (a Tensor) within its limits before protobuf parses it."""
    try:
        _check_fields(view, TENSOR_LIMITS)
    except RequestRefused:
        raise
    except WireError as error:
        raise WireError(f"malformed PredictRequest: an entry of inputs: {error}") from None


def _check_fields(view: memoryview, limits: Limits) -> None:
    for _ in _walk(view, limits):
        pass


def _walk(view: memoryview, limits: Limits, unpacked_floats: bool = False) -> Iterator[tuple[int, int, int, int, int]]:
    """(field, wire type, field start, value start, end) of each top-level field of the message in `view`.

    Refuses the message at the first field past `limits`, so the work is bounded by the limits, not by what a caller
    sends. With `unpacked_floats`, a run of unpacked `data` elements (field 1, fixed32) is one field, found by numpy.
    """
    size = len(view)
    counts = dict.fromkeys(limits.counts, 0)
    fields = 0
    pos = 0
    # The shared codec's errors are this module's: the servicer answers them as malformed requests.
    try:
        while pos < size:
            fields += 1
            if fields > limits.max_fields:
                raise RequestRefused(
                    f"the {limits.name_of_message} has more than {limits.max_fields} fields, far more than a valid one needs"
                )
            field_start = pos
            key, pos = read_varint(view, pos)
            field, wire_type = key >> 3, key & 7
            if field == 0:
                raise WireError(f"field number 0 at byte {field_start}")
            value_start = pos
            if wire_type == _WIRE_VARINT:
                _, pos = read_varint(view, pos)
            elif wire_type == _WIRE_LEN:
                length, pos = read_varint(view, pos)
                value_start, pos = pos, pos + length
                most = limits.lengths.get(field)
                if most is not None and length > most:
                    raise RequestRefused(
                        f"{limits.name_of_message}.{limits.name(field)} is {length} bytes long: at most {most} are accepted"
                    )
            elif wire_type == _WIRE_FIXED64:
                pos += 8
            elif wire_type == _WIRE_FIXED32:
                if unpacked_floats and field == _FLOAT_FIELD and view[field_start] == _UNPACKED_FLOAT_KEY:
                    pos = field_start + _UNPACKED_FLOAT_BYTES * _unpacked_float_run(view, field_start)
                else:
                    pos += 4
            else:
                # 3/4 are groups (absent from this schema, deprecated), 6/7 do not exist.
                raise WireError(f"field {field} has unsupported wire type {wire_type} at byte {field_start}")
            if pos > size:
                raise WireError(f"field {field} at byte {field_start} runs past the end of the {size}-byte message")
            if field in counts:
                counts[field] += 1
                if counts[field] > limits.counts[field]:
                    raise RequestRefused(
                        f"{limits.name_of_message}.{limits.name(field)} has more than {limits.counts[field]} entries: at most "
                        f"{limits.counts[field]} are accepted"
                    )
            yield field, wire_type, field_start, value_start, pos
    except VarintError as error:
        raise WireError(str(error)) from None


def _unpacked_float_run(view: memoryview, start: int) -> int:
    """How many unpacked `data` elements (key byte, 4 float bytes) follow one another from `start` (at least 1).

    Checked in doubling windows, so a short run costs little however much of the message follows it.
    """
    records = (len(view) - start) // _UNPACKED_FLOAT_BYTES
    if records <= 1:
        return 1  # a last, possibly truncated element: the walk checks its end
    keys = np.frombuffer(view, np.uint8, count=records * _UNPACKED_FLOAT_BYTES, offset=start)[::_UNPACKED_FLOAT_BYTES]
    checked, window = 0, 64
    while checked < records:
        chunk = keys[checked : checked + window]
        others = np.flatnonzero(chunk != _UNPACKED_FLOAT_KEY)
        if others.size:
            return checked + int(others[0])
        checked += chunk.size
        window *= 2
    return records


def _unpacked_floats(view: memoryview, start: int, end: int) -> np.ndarray:
    """The floats of unpacked `data` elements from `start` to `end`: a run, or one element with a longer key."""
    if view[start] == _UNPACKED_FLOAT_KEY and (end - start) % _UNPACKED_FLOAT_BYTES == 0:
        records = np.frombuffer(view, np.uint8, count=end - start, offset=start).reshape(-1, _UNPACKED_FLOAT_BYTES)
        return np.ascontiguousarray(records[:, 1:]).view(_FLOAT32_LE).reshape(-1)
    return np.frombuffer(view[end - 4 : end], dtype=_FLOAT32_LE)


def _check_ranks(message: inference_pb2.PredictRequest) -> None:
    """A packed shape within its byte limit may still hold more dims than any model has."""
    for where, shape in [("shape", message.shape), *((f"inputs[{t.name!r}].shape", t.shape) for t in message.inputs)]:
        if len(shape) > MAX_RANK:
            raise RequestRefused(f"PredictRequest.{where} has {len(shape)} dims: at most {MAX_RANK} are accepted")


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
