"""The inputs and outputs of an ONNX graph, read straight from the file's protobuf wire format.

Triton's auto-complete runs in a stub process of its own before any instance starts. Building
an ONNX Runtime session there (or importing onnx) to learn a few names and dims costs most of a
second for a 100 MB model; this reader walks only the few messages it needs and skips every
weight by its length.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, replace
from pathlib import Path

from backend.batch_axis import Ints, Node, coupled_nodes
from backend.errors import ModelConfigError
from backend.onnx_wire import LENGTH_DELIMITED, Buffer, Span, fields, messages, repeated_ints, small_int_tensor, text
from backend.tensors import TensorSpec, tensor_spec

# Field numbers of onnx.proto3.
_MODEL_GRAPH, _MODEL_FUNCTIONS = 7, 25
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 1, 5, 11, 12
_FUNCTION_NODE = 7
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP_TYPE, _NODE_ATTRIBUTE = 1, 2, 3, 4, 5
_ATTRIBUTE_NAME, _ATTRIBUTE_INT, _ATTRIBUTE_TENSOR, _ATTRIBUTE_GRAPH, _ATTRIBUTE_INTS, _ATTRIBUTE_GRAPHS = (
    1,
    3,
    5,
    6,
    8,
    11,
)
_TENSOR_NAME = 8
_VALUE_NAME, _VALUE_TYPE = 1, 2
# TypeProto's `value` oneof: what a graph input or output holds.
_TYPE_TENSOR = 1
_TYPE_KINDS = {1: "tensor", 4: "sequence", 5: "map", 8: "sparse tensor", 9: "optional"}
_TENSOR_TYPE_ELEM, _TENSOR_TYPE_SHAPE = 1, 2
_SHAPE_DIM = 1
_DIM_VALUE, _DIM_PARAM = 1, 2

# Operators whose result for one row depends on the other rows of the batch.
BATCH_COUPLED_OPS = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"})


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
            raise ModelConfigError(
                f"{role} '{self.name}' is {article} {self.kind}, not a tensor: Triton carries tensors only"
            )
        return tensor_spec(self.name, self.elem_type, self.shape, batched, self.has_default, role)


@dataclass(frozen=True)
class GraphIO:
    """A graph's inputs and outputs, the operator types it uses (subgraphs included), and its nodes that mix rows.

    `row_mixers` says, node by node, where the main graph reduces, normalises or picks over the batch axis
    (`backend.batch_axis`).
    """

    inputs: tuple[GraphTensor, ...]
    outputs: tuple[GraphTensor, ...]
    op_types: frozenset[str]
    row_mixers: tuple[str, ...] = ()

    def specs(self, batched: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """Inputs and outputs as served, batch dim removed when `batched`.

        A batched model cannot take an input with a default whose first dim is not a batch dim
        (a weight that old exporters list among the inputs): it keeps its default. In a model that
        does not batch, an output declared with a fixed first dim 1 while every input's first dim is
        dynamic is served with a dynamic one: converters declare a classifier's `label` `[1]` and it
        holds one row per input row (onnxmltools' LightGBM), so the advertised shape is the served one.
        """
        inputs = tuple(
            t.spec(batched, "input") for t in self.inputs if not (batched and t.has_default and not t.batchable)
        )
        rows_follow = not batched and all(t.batchable or t.has_default for t in self.inputs)
        outputs = []
        for tensor in self.outputs:
            if rows_follow and tensor.kind == "tensor" and tensor.shape and tensor.shape[0] == 1:
                tensor = replace(tensor, shape=(None, *tensor.shape[1:]))
            outputs.append(self._output_spec(tensor, batched))
        return inputs, tuple(outputs)

    def _output_spec(self, tensor: GraphTensor, batched: bool) -> TensorSpec:
        try:
            return tensor.spec(batched, "output")
        except ModelConfigError as error:
            if tensor.kind == "sequence" and "ZipMap" in self.op_types:
                raise ModelConfigError(
                    f"{error}. It is a ZipMap's list of per-class maps: export the classifier without it "
                    "(skl2onnx: options={'zipmap': False}; onnxmltools' converters: zipmap=False) and its "
                    "probabilities come out as a tensor"
                ) from None
            raise

    def batch_coupling(self) -> str | None:
        """Why a row of this graph's batch may not get what it would get alone, or None.

        ONNX Runtime's dynamic quantization (`quantize_dynamic`, as used for transformers) computes one scale over the
        whole tensor it quantizes: rows stacked into one batch share it. Other nodes mix rows by what they do over
        the batch axis.
        """
        reasons = list(self.row_mixers)
        quantizers = sorted(self.op_types & BATCH_COUPLED_OPS)
        if quantizers:
            reasons.insert(0, f"{', '.join(quantizers)} quantizes each tensor with one scale over the whole batch")
        return "; ".join(reasons) or None

    def cannot_batch(self) -> str | None:
        """Why Triton's batcher cannot stack requests of this graph, or None when it can.

        As Triton's onnxruntime backend decides, every input and output needs a dynamic first dim (inputs with a default
        aside, see `specs`).
        """
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


def _value_info(data: Buffer, span: Span, defaults: frozenset[str] = frozenset()) -> GraphTensor:
    name, kind, elem, dims, has_shape = "", "unknown", 0, [], False
    for name_span in messages(data, span, _VALUE_NAME):
        name = text(data, name_span)
    for type_span in messages(data, span, _VALUE_TYPE):
        for field in fields(data, *type_span):
            if field.wire != LENGTH_DELIMITED or field.number not in _TYPE_KINDS:
                continue
            kind = _TYPE_KINDS[field.number]
            if field.number != _TYPE_TENSOR:
                continue
            for tensor_field in fields(data, *field.span):
                if tensor_field.number == _TENSOR_TYPE_ELEM:
                    elem = tensor_field.value
                elif tensor_field.number == _TENSOR_TYPE_SHAPE:
                    has_shape = True
                    dims += [_dim(data, dim_span) for dim_span in messages(data, tensor_field.span, _SHAPE_DIM)]
    return GraphTensor(name, kind, elem, tuple(dims) if has_shape else None, name in defaults)


def _dim(data: Buffer, span: Span) -> int | str | None:
    for field in fields(data, *span):
        if field.number == _DIM_VALUE:
            return field.value
        if field.number == _DIM_PARAM:
            return text(data, field.span)
    return None


def _op_types(data: Buffer, graph: Span, found: set[str]) -> None:
    for node in messages(data, graph, _GRAPH_NODE):
        _node_op_types(data, node, found)


def _node_op_types(data: Buffer, node: Span, found: set[str]) -> None:
    found.update(text(data, op) for op in messages(data, node, _NODE_OP_TYPE))
    for attribute in messages(data, node, _NODE_ATTRIBUTE):
        for number in (_ATTRIBUTE_GRAPH, _ATTRIBUTE_GRAPHS):
            for subgraph in messages(data, attribute, number):
                _op_types(data, subgraph, found)  # If, Loop, Scan bodies


def _node(data: Buffer, span: Span) -> Node:
    """A node's op type, name, inputs, outputs and integer attributes (an int, ints, or a small int tensor)."""
    strings: dict[int, list[str]] = {_NODE_INPUT: [], _NODE_OUTPUT: [], _NODE_NAME: [], _NODE_OP_TYPE: []}
    ints: dict[str, Ints] = {}
    for field in fields(data, *span):
        if field.number in strings and field.wire == LENGTH_DELIMITED:
            strings[field.number].append(text(data, field.span))
        elif field.number == _NODE_ATTRIBUTE and field.wire == LENGTH_DELIMITED:
            name, values = "", []
            for part in fields(data, *field.span):
                if part.number == _ATTRIBUTE_NAME:
                    name = text(data, part.span)
                elif part.number in (_ATTRIBUTE_INT, _ATTRIBUTE_INTS):
                    values += repeated_ints(data, part)
                elif part.number == _ATTRIBUTE_TENSOR:
                    values += small_int_tensor(data, part.span) or ()
            if values:
                ints[name] = tuple(values)
    return Node(
        op_type="".join(strings[_NODE_OP_TYPE]),
        name="".join(strings[_NODE_NAME]),
        inputs=tuple(strings[_NODE_INPUT]),
        outputs=tuple(strings[_NODE_OUTPUT]),
        ints=ints,
    )


def _row_mixers(data: Buffer, graph: Span, inputs: tuple[GraphTensor, ...]) -> tuple[str, ...]:
    constants: dict[str, Ints] = {}
    for initializer in messages(data, graph, _GRAPH_INITIALIZER):
        values = small_int_tensor(data, initializer)
        if values is not None:
            constants.update(dict.fromkeys((text(data, n) for n in messages(data, initializer, _TENSOR_NAME)), values))
    nodes = [_node(data, span) for span in messages(data, graph, _GRAPH_NODE)]
    for node in nodes:
        if node.op_type == "Constant" and len(node.ints) == 1 and node.outputs:
            constants[node.outputs[0]] = next(iter(node.ints.values()))
    batched = (t.name for t in inputs if t.batchable and not t.has_default)
    return tuple(coupled_nodes(nodes, batched, constants))


def read_graph_io(onnx_file: Path) -> GraphIO:
    """The graph's inputs and outputs, the operator types it uses, and the nodes that mix the rows of a batch.

    An input that is also an initializer is marked as having a default; the operator types
    include those of subgraphs and local functions.
    """
    if onnx_file.stat().st_size == 0:
        raise ModelConfigError(f"{onnx_file.name} is empty")
    with open(onnx_file, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        whole = (0, len(data))
        graph = next(messages(data, whole, _MODEL_GRAPH), None)
        if graph is None:
            raise ModelConfigError(f"{onnx_file.name} has no graph: is it an ONNX model?")
        initializers = frozenset(
            text(data, name)
            for initializer in messages(data, graph, _GRAPH_INITIALIZER)
            for name in messages(data, initializer, _TENSOR_NAME)
        )
        op_types: set[str] = set()
        _op_types(data, graph, op_types)
        for function in messages(data, whole, _MODEL_FUNCTIONS):
            for node in messages(data, function, _FUNCTION_NODE):
                _node_op_types(data, node, op_types)
        inputs = tuple(_value_info(data, span, initializers) for span in messages(data, graph, _GRAPH_INPUT))
        return GraphIO(
            inputs,
            tuple(_value_info(data, span) for span in messages(data, graph, _GRAPH_OUTPUT)),
            frozenset(op_types),
            _row_mixers(data, graph, inputs),
        )


def read_file_io(onnx_file: Path, batched: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The inputs and outputs of the model in `onnx_file` as served, batch dim removed when `batched`."""
    return read_graph_io(onnx_file).specs(batched)
