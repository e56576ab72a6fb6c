"""Reading an ONNX file's protobuf wire format in place: fields, sub-messages, strings and small integer tensors.

The file is memory-mapped and walked message by message; a field is skipped by its length, so a weight is never
read or copied. Field numbers are onnx.proto's.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from typing import NamedTuple

from tritonnx.backend.errors import ModelConfigError
from tritonnx.backend.varint import VarintError, read_varint

Span = tuple[int, int]  # a message's (start, end) in the file
Buffer = mmap.mmap  # the file, mapped: never read whole

LENGTH_DELIMITED = 2
_NOT_ONNX = "the ONNX file is truncated or not an ONNX model"
# TensorProto: the fields a small integer constant (axes, perm) is read from.
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_INT32_DATA, _TENSOR_INT64_DATA, _TENSOR_RAW_DATA = 1, 2, 5, 7, 9
_INT32, _INT64 = 6, 7
# Larger integer tensors are data, not the axes or shapes an operator is configured with.
_SMALL_TENSOR = 16


class Field(NamedTuple):
    """One top-level field of a protobuf message.

    A varint's `value`, or a length-delimited field's `span` (start, end) in the file, never a copy.
    """

    number: int
    wire: int
    value: int = 0
    span: Span = (0, 0)


def signed(value: int) -> int:
    """An int64 as the wire carries it (two's complement in 64 bits) back to its sign."""
    return value - (1 << 64) if value >= 1 << 63 else value


def varint(data: Buffer, pos: int) -> tuple[int, int]:
    try:
        return read_varint(data, pos)
    except VarintError:
        raise ModelConfigError(_NOT_ONNX) from None


def fields(data: Buffer, start: int = 0, end: int | None = None) -> Iterator[Field]:
    pos, end = start, len(data) if end is None else end
    while pos < end:
        key, pos = varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(data, pos)
            field = Field(number, wire, value=value)
        elif wire == LENGTH_DELIMITED:
            length, pos = varint(data, pos)
            field, pos = Field(number, wire, span=(pos, pos + length)), pos + length
        elif wire in (1, 5):
            field, pos = Field(number, wire), pos + (8 if wire == 1 else 4)
        else:
            raise ModelConfigError(f"unexpected protobuf wire type {wire} in the ONNX file")
        if pos > end:
            raise ModelConfigError(_NOT_ONNX)
        yield field


def messages(data: Buffer, span: Span, number: int) -> Iterator[Span]:
    """The spans of the length-delimited fields `number` (sub-messages, strings) in the message at `span`."""
    return (f.span for f in fields(data, *span) if f.number == number and f.wire == LENGTH_DELIMITED)


def text(data: Buffer, span: Span) -> str:
    return bytes(data[span[0] : span[1]]).decode()


def repeated_ints(data: Buffer, field: Field) -> list[int]:
    """A repeated int64 field's values from one occurrence: packed (one span of varints) or not (one varint)."""
    if field.wire == 0:
        return [signed(field.value)]
    if field.wire != LENGTH_DELIMITED:
        return []
    values, pos = [], field.span[0]
    while pos < field.span[1]:
        value, pos = varint(data, pos)
        values.append(signed(value))
    return values


def small_int_tensor(data: Buffer, span: Span) -> tuple[int, ...] | None:
    """The values of an int32/int64 TensorProto of a few elements (axes, a permutation), else None."""
    dims: list[int] = []
    data_type, values, raw = 0, [], None
    for field in fields(data, *span):
        if field.number == _TENSOR_DIMS:
            dims += repeated_ints(data, field)
        elif field.number == _TENSOR_DATA_TYPE:
            data_type = field.value
        elif field.number in (_TENSOR_INT32_DATA, _TENSOR_INT64_DATA):
            values += repeated_ints(data, field)
        elif field.number == _TENSOR_RAW_DATA:
            raw = field.span
    count = 1
    for dim in dims:
        count *= dim
    if data_type not in (_INT32, _INT64) or count > _SMALL_TENSOR:
        return None
    if raw is not None:
        width = 4 if data_type == _INT32 else 8
        chunk = bytes(data[raw[0] : raw[1]])
        return tuple(int.from_bytes(chunk[i : i + width], "little", signed=True) for i in range(0, len(chunk), width))
    return tuple(values)
