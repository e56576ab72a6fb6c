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
from backend.tensors import TensorSpec, tensor_spec

# Field numbers of onnx.proto3.
_MODEL_GRAPH, _MODEL_FUNCTIONS = 7, 25
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 1, 5, 11, 12
_FUNCTION_NODE = 7
_NODE_OP_TYPE, _NODE_ATTRIBUTE = 4, 5
_ATTRIBUTE_GRAPH, _ATTRIBUTE_GRAPHS = 6, 11
_TENSOR_NAME = 8
_VALUE_NAME, _VALUE_TYPE = 1, 2
# TypeProto's `value` oneof: what a graph input or output holds.
_TYPE_TENSOR = 1
_TYPE_KINDS = {1: "tensor", 4: "sequence", 5: "map", 8: "sparse tensor", 9: "optional"}
_TENSOR_TYPE_ELEM, _TENSOR_TYPE_SHAPE = 1, 2
_SHAPE_DIM = 1
_DIM_VALUE, _DIM_PARAM = 1, 2


@dataclass(frozen=True)
class GraphTensor:
    """A graph input or output as the file declares it.

    `kind` is "tensor" for the only kind Triton can carry (else sequence, map, optional, sparse
    tensor); `shape` is None when the graph gives no shape (unknown rank); `has_default` marks an
    input that is also an initializer, which a caller may leave out.
    """

    name: str
    kind: str
    elem_type: int
    shape: tuple[int | str | None, ...] | None
    has_default: bool = False

    @property
    def batchable(self) -> bool:
        """A tensor whose first dim is dynamic (named or not), so it may be a batch dim."""
        if self.kind != "tensor" or not self.shape:
            return False
        first = self.shape[0]
        return not (isinstance(first, int) and first >= 0)

    def spec(self, batched: bool, role: str) -> TensorSpec:
        if self.kind != "tensor":
            article = "an" if self.kind[0] in "aeiou" else "a"
            raise ModelConfigError(f"{role} '{self.name}' is {article} {self.kind}, not a tensor: Triton carries tensors only")
        return tensor_spec(self.name, self.elem_type, self.shape, batched, self.has_default, role)


@dataclass(frozen=True)
class GraphIO:
    """A graph's inputs and outputs, and the operator types it uses (subgraphs included)."""

    inputs: tuple[GraphTensor, ...]
    outputs: tuple[GraphTensor, ...]
    op_types: frozenset[str]

    def specs(self, batched: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """Inputs and outputs as served, batch dim removed when `batched`.

        A batched model cannot take an input with a default whose first dim is not a batch dim
        (a weight that old exporters list among the inputs): it keeps its default.
        """
        inputs = tuple(
            t.spec(batched, "input") for t in self.inputs if not (batched and t.has_default and not t.batchable)
        )
        return inputs, tuple(t.spec(batched, "output") for t in self.outputs)

    def cannot_batch(self) -> str | None:
        """Why Triton's batcher cannot stack requests of this graph, or None when it can: as
        Triton's onnxruntime backend decides, every input and output needs a dynamic first dim
        (inputs with a default aside, see `specs`)."""
        for role, tensors in (("input", self.inputs), ("output", self.outputs)):
            for tensor in tensors:
                if tensor.batchable or (role == "input" and tensor.has_default):
                    continue
                if tensor.kind != "tensor":
                    return f"{role} '{tensor.name}' is not a tensor but a {tensor.kind}"
                if tensor.shape is None:
                    return f"{role} '{tensor.name}' has no shape (unknown rank)"
                if not tensor.shape:
                    return f"{role} '{tensor.name}' is a scalar"
                return f"{role} '{tensor.name}' has a fixed first dim {tensor.shape[0]}"
        return None

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


def _value_info(data, span: tuple[int, int], defaults: frozenset[str] = frozenset()) -> GraphTensor:
    name, kind, elem, dims, has_shape = "", "unknown", 0, [], False
    for field, _, value in _fields(data, *span):
        if field == _VALUE_NAME:
            name = _text(data, value)
        elif field == _VALUE_TYPE:
            for type_field, wire, tensor_span in _fields(data, *value):
                if wire != 2 or type_field not in _TYPE_KINDS:
                    continue
                kind = _TYPE_KINDS[type_field]
                if type_field != _TYPE_TENSOR:
                    continue
                for tensor_field, _, tensor_value in _fields(data, *tensor_span):
                    if tensor_field == _TENSOR_TYPE_ELEM:
                        elem = tensor_value
                    elif tensor_field == _TENSOR_TYPE_SHAPE:
                        has_shape = True
                        for dim_field, _, dim_span in _fields(data, *tensor_value):
                            if dim_field == _SHAPE_DIM:
                                dims.append(_dim(data, dim_span))
    return GraphTensor(name, kind, elem, tuple(dims) if has_shape else None, name in defaults)


def _dim(data, span: tuple[int, int]) -> int | str | None:
    for field, _, value in _fields(data, *span):
        if field == _DIM_VALUE:
            return value
        if field == _DIM_PARAM:
            return _text(data, value)
    return None


def _op_types(data, graph: tuple[int, int], found: set[str]) -> None:
    for field, wire, value in _fields(data, *graph):
        if field == _GRAPH_NODE and wire == 2:
            _node_op_types(data, value, found)


def _node_op_types(data, node: tuple[int, int], found: set[str]) -> None:
    for field, wire, value in _fields(data, *node):
        if field == _NODE_OP_TYPE and wire == 2:
            found.add(_text(data, value))
        elif field == _NODE_ATTRIBUTE and wire == 2:
            for attr_field, attr_wire, attr_value in _fields(data, *value):
                if attr_field in (_ATTRIBUTE_GRAPH, _ATTRIBUTE_GRAPHS) and attr_wire == 2:
                    _op_types(data, attr_value, found)  # If, Loop, Scan bodies


def read_graph_io(onnx_file: Path) -> GraphIO:
    """The graph's inputs (an input that is also an initializer marked as having a default) and
    outputs, and the operator types of the graph, its subgraphs and its local functions."""
    if onnx_file.stat().st_size == 0:
        raise ModelConfigError(f"{onnx_file.name} is empty")
    with open(onnx_file, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        graph, functions = None, []
        for field, wire, value in _fields(data):
            if field == _MODEL_GRAPH and wire == 2:
                graph = value
            elif field == _MODEL_FUNCTIONS and wire == 2:
                functions.append(value)
        if graph is None:
            raise ModelConfigError(f"{onnx_file.name} has no graph: is it an ONNX model?")
        input_spans, output_spans, initializers = [], [], set()
        for field, wire, value in _fields(data, *graph):
            if wire != 2:
                continue
            if field == _GRAPH_INPUT:
                input_spans.append(value)
            elif field == _GRAPH_OUTPUT:
                output_spans.append(value)
            elif field == _GRAPH_INITIALIZER:
                initializers.update(_text(data, v) for f, w, v in _fields(data, *value) if f == _TENSOR_NAME and w == 2)
        op_types: set[str] = set()
        _op_types(data, graph, op_types)
        for function in functions:
            for field, wire, value in _fields(data, *function):
                if field == _FUNCTION_NODE and wire == 2:
                    _node_op_types(data, value, op_types)
        defaults = frozenset(initializers)
        return GraphIO(
            tuple(_value_info(data, span, defaults) for span in input_spans),
            tuple(_value_info(data, span) for span in output_spans),
            frozenset(op_types),
        )


def read_file_io(onnx_file: Path, batched: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The inputs and outputs of the model in `onnx_file` as served, batch dim removed when `batched`."""
    return read_graph_io(onnx_file).specs(batched)
