"""The inputs and outputs of an ONNX graph, read straight from the file's protobuf wire format.

Triton's auto-complete runs in a stub process of its own before any instance starts. Building
an ONNX Runtime session there (or importing onnx) to learn a few names and dims costs most of a
second for a 100 MB model; this reader walks only the few messages it needs and skips every
weight by its length.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from backend.errors import ModelConfigError
from backend.tensors import TensorSpec, spec_from_ort

# onnx.TensorProto.DataType -> ONNX Runtime's type string (what tensors.spec_from_ort reads).
_ELEM_TYPES = {
    1: "tensor(float)", 2: "tensor(uint8)", 3: "tensor(int8)", 4: "tensor(uint16)", 5: "tensor(int16)",
    6: "tensor(int32)", 7: "tensor(int64)", 8: "tensor(string)", 9: "tensor(bool)", 10: "tensor(float16)",
    11: "tensor(double)", 12: "tensor(uint32)", 13: "tensor(uint64)",
}
# Field numbers of onnx.proto3.
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 5, 11, 12
_TENSOR_NAME = 8
_VALUE_NAME, _VALUE_TYPE = 1, 2
_TYPE_TENSOR = 1
_TENSOR_TYPE_ELEM, _TENSOR_TYPE_SHAPE = 1, 2
_SHAPE_DIM = 1
_DIM_VALUE, _DIM_PARAM = 1, 2


@dataclass(frozen=True)
class GraphTensor:
    """A graph input or output, shaped like ONNX Runtime's NodeArg (name, type, shape)."""

    name: str
    type: str
    shape: tuple[int | str | None, ...]


def _varint(data, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ModelConfigError("the ONNX file is truncated or not an ONNX model")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int | tuple[int, int]]]:
    """(field number, wire type, value) of a message's top-level fields; a length-delimited
    value is its (start, end) span, never a copy."""
    pos, end = start, len(data) if end is None else end
    while pos < end:
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = (pos, pos + length), pos + length
        elif wire in (1, 5):
            value, pos = None, pos + (8 if wire == 1 else 4)
        else:
            raise ModelConfigError(f"unexpected protobuf wire type {wire} in the ONNX file")
        if pos > end:
            raise ModelConfigError("the ONNX file is truncated or not an ONNX model")
        yield field, wire, value


def _text(data, span: tuple[int, int]) -> str:
    return bytes(data[span[0] : span[1]]).decode()


def _value_info(data, span: tuple[int, int]) -> GraphTensor:
    name, elem, dims = "", 0, []
    for field, _, value in _fields(data, *span):
        if field == _VALUE_NAME:
            name = _text(data, value)
        elif field == _VALUE_TYPE:
            for type_field, _, tensor_span in _fields(data, *value):
                if type_field != _TYPE_TENSOR:
                    continue
                for tensor_field, _, tensor_value in _fields(data, *tensor_span):
                    if tensor_field == _TENSOR_TYPE_ELEM:
                        elem = tensor_value
                    elif tensor_field == _TENSOR_TYPE_SHAPE:
                        for dim_field, _, dim_span in _fields(data, *tensor_value):
                            if dim_field == _SHAPE_DIM:
                                dims.append(_dim(data, dim_span))
    return GraphTensor(name, _ELEM_TYPES.get(elem, f"tensor(type {elem})"), tuple(dims))


def _dim(data, span: tuple[int, int]) -> int | str | None:
    for field, _, value in _fields(data, *span):
        if field == _DIM_VALUE:
            return value
        if field == _DIM_PARAM:
            return _text(data, value)
    return None


def read_graph_io(onnx_file: Path) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """The graph's inputs (initializers listed as inputs left out, as ONNX Runtime does) and outputs."""
    if onnx_file.stat().st_size == 0:
        raise ModelConfigError(f"{onnx_file.name} is empty")
    with open(onnx_file, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        graph = next((value for field, wire, value in _fields(data) if field == _MODEL_GRAPH and wire == 2), None)
        if graph is None:
            raise ModelConfigError(f"{onnx_file.name} has no graph: is it an ONNX model?")
        inputs, outputs, initializers = [], [], set()
        for field, wire, value in _fields(data, *graph):
            if wire != 2:
                continue
            if field == _GRAPH_INPUT:
                inputs.append(_value_info(data, value))
            elif field == _GRAPH_OUTPUT:
                outputs.append(_value_info(data, value))
            elif field == _GRAPH_INITIALIZER:
                initializers.update(_text(data, v) for f, w, v in _fields(data, *value) if f == _TENSOR_NAME and w == 2)
        return [t for t in inputs if t.name not in initializers], outputs


def read_file_io(onnx_file: Path, batched: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The inputs and outputs of the model in `onnx_file`, batch dim removed when `batched`."""
    inputs, outputs = read_graph_io(onnx_file)
    return tuple(spec_from_ort(t, batched) for t in inputs), tuple(spec_from_ort(t, batched) for t in outputs)
