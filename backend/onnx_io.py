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

from tritonnx.backend.batch_axis import Dims, Graph, Ints, Node, Verdict, judge
from tritonnx.backend.errors import ModelConfigError
from tritonnx.backend.onnx_wire import (
    LENGTH_DELIMITED,
    Buffer,
    Span,
    fields,
    messages,
    repeated_ints,
    small_int_tensor,
    text,
)
from tritonnx.backend.tensors import TensorSpec, tensor_spec

# Field numbers of onnx.proto3.
_MODEL_GRAPH, _MODEL_FUNCTIONS = 7, 25
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 1, 5, 11, 12
_FUNCTION_NAME, _FUNCTION_INPUT, _FUNCTION_OUTPUT, _FUNCTION_NODE, _FUNCTION_DOMAIN = 1, 4, 5, 7, 10
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP_TYPE, _NODE_ATTRIBUTE, _NODE_DOMAIN = 1, 2, 3, 4, 5, 7
_ATTRIBUTE_NAME, _ATTRIBUTE_INT, _ATTRIBUTE_STRING, _ATTRIBUTE_TENSOR, _ATTRIBUTE_GRAPH, _ATTRIBUTE_INTS = (
    1,
    3,
    4,
    5,
    6,
    8,
)
_ATTRIBUTE_GRAPHS, _ATTRIBUTE_REF = 11, 21
_TENSOR_DIMS, _TENSOR_NAME = 1, 8
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
            raise ModelConfigError(
                f"{role} '{self.name}' is {article} {self.kind}, not a tensor: Triton carries tensors only"
            )
        return tensor_spec(self.name, self.elem_type, self.shape, batched, self.has_default, role)


@dataclass(frozen=True)
class GraphIO:
    """A graph's inputs and outputs, the operator types it uses (subgraphs included), and its nodes that mix rows.

    `rows` is `tritonnx.backend.batch_axis`'s verdict: node by node, where the graph (its subgraphs and local functions
    included) mixes the rows of a batch, and what the rule cannot judge.
    """

    inputs: tuple[GraphTensor, ...]
    outputs: tuple[GraphTensor, ...]
    op_types: frozenset[str]
    rows: Verdict = Verdict()

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
        whole tensor it quantizes: rows stacked into one batch share it (a quantizer of a constant weight shares
        nothing). Other nodes mix rows by what they do over the batch axis.
        """
        return "; ".join(self.rows.coupled) or None

    def batch_undecided(self) -> str | None:
        """What the batch-axis rule could not judge (the empirical check at load decides), or None."""
        return "; ".join(self.rows.undecided) or None

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
    """A node as `tritonnx.backend.batch_axis` reads it.

    Its op type, domain, name, inputs, outputs, integer and string attributes, subgraphs, and references to the
    attributes of a function's call.
    """
    strings: dict[int, list[str]] = {
        _NODE_INPUT: [],
        _NODE_OUTPUT: [],
        _NODE_NAME: [],
        _NODE_OP_TYPE: [],
        _NODE_DOMAIN: [],
    }
    ints: dict[str, Ints] = {}
    words: dict[str, str] = {}
    graphs: dict[str, Graph] = {}
    refs: dict[str, str] = {}
    value_dims: Dims | None = None  # a Constant's
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
                    value_dims = _tensor_dims(data, part.span)
                elif part.number == _ATTRIBUTE_STRING and part.wire == LENGTH_DELIMITED:
                    words[name] = text(data, part.span)
                elif part.number == _ATTRIBUTE_GRAPH:
                    graphs[name] = _graph(data, part.span)
                elif part.number == _ATTRIBUTE_REF:
                    refs[name] = text(data, part.span)
            if values:
                ints[name] = tuple(values)
            if name in ("value_float", "value_int"):
                value_dims = ()
            elif name in ("value_floats", "value_ints"):
                value_dims = (len(values) or None,)
            if name in words and name in refs:
                del words[name]
    return Node(
        op_type="".join(strings[_NODE_OP_TYPE]),
        name="".join(strings[_NODE_NAME]),
        inputs=tuple(strings[_NODE_INPUT]),
        outputs=tuple(strings[_NODE_OUTPUT]),
        ints=ints,
        domain="".join(strings[_NODE_DOMAIN]),
        strings=words,
        graphs=graphs,
        refs=refs,
        value_dims=value_dims,
    )


def _tensor_dims(data: Buffer, span: Span) -> Dims:
    return tuple(d for f in fields(data, *span) if f.number == _TENSOR_DIMS for d in repeated_ints(data, f))


def _graph(data: Buffer, span: Span) -> Graph:
    """A graph for the batch-axis rule: nodes, formal inputs and outputs, small integer constants, known dims."""
    constants: dict[str, Ints] = {}
    dims: dict[str, Dims] = {}
    for initializer in messages(data, span, _GRAPH_INITIALIZER):
        names = [text(data, n) for n in messages(data, initializer, _TENSOR_NAME)]
        shape = _tensor_dims(data, initializer)
        values = small_int_tensor(data, initializer)
        for name in names:
            dims[name] = shape
            if values is not None:
                constants[name] = values
    inputs: list[str] = []
    outputs: list[str] = []
    for number, found in ((_GRAPH_INPUT, inputs), (_GRAPH_OUTPUT, outputs)):
        for value in messages(data, span, number):
            tensor = _value_info(data, value)
            found.append(tensor.name)
            if number == _GRAPH_INPUT and tensor.shape is not None and tensor.name not in dims:
                dims[tensor.name] = tuple(d if isinstance(d, int) and d > 0 else None for d in tensor.shape)
    nodes = tuple(_node(data, node) for node in messages(data, span, _GRAPH_NODE))
    return Graph(nodes, tuple(inputs), tuple(outputs), constants, dims)


def _functions(data: Buffer, whole: Span) -> dict[tuple[str, str], Graph]:
    """The model's local functions by (domain, name), as a node calls them."""
    found = {}
    for function in messages(data, whole, _MODEL_FUNCTIONS):
        parts: dict[int, list[str]] = {
            _FUNCTION_NAME: [],
            _FUNCTION_DOMAIN: [],
            _FUNCTION_INPUT: [],
            _FUNCTION_OUTPUT: [],
        }
        for number, values in parts.items():
            values += (text(data, s) for s in messages(data, function, number))
        nodes = tuple(_node(data, node) for node in messages(data, function, _FUNCTION_NODE))
        key = ("".join(parts[_FUNCTION_DOMAIN]), "".join(parts[_FUNCTION_NAME]))
        found[key] = Graph(nodes, tuple(parts[_FUNCTION_INPUT]), tuple(parts[_FUNCTION_OUTPUT]))
    return found


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
        batched = [t.name for t in inputs if t.batchable and not t.has_default]
        return GraphIO(
            inputs,
            tuple(_value_info(data, span) for span in messages(data, graph, _GRAPH_OUTPUT)),
            frozenset(op_types),
            _rows(data, whole, graph, batched),
        )


def _rows(data: Buffer, whole: Span, graph: Span, batched: list[str]) -> Verdict:
    """The batch-axis rule's verdict; a graph the rule trips on is left to the check at load, not refused."""
    try:
        return judge(_graph(data, graph), batched, _functions(data, whole))
    except (IndexError, KeyError, ValueError, TypeError, ZeroDivisionError) as error:
        return Verdict(undecided=(f"the batch-axis rule failed on this graph ({type(error).__name__}: {error})",))


def read_file_io(onnx_file: Path, batched: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The inputs and outputs of the model in `onnx_file` as served, batch dim removed when `batched`."""
    return read_graph_io(onnx_file).specs(batched)
