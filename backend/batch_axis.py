"""Which nodes of a graph mix the rows of a batch: the batch axis followed from the inputs to every operator.

Triton's batcher stacks requests along the first axis, and each request should get what it would get alone. A
graph breaks that when an operator reduces, normalises, contracts, reorders or picks over the batch axis, merges
rows into one (a Reshape whose first dim is not the batch), quantizes with one scale over the batch, or uses the
batch size as data. The batch axis starts at 0 on every batched input and is followed through the graph, the
bodies of If, Loop and Scan and the model's local functions included; ranks and dims are followed from the
inputs' shapes so that negative axes resolve. Shapes are followed symbolically too (`Shape`, `Gather`, `Concat`,
arithmetic), so that the Shape -> Gather -> Concat -> Reshape that exporters write to keep the batch first is told
apart from the batch size reaching an output's values.

The verdict has two lists: `coupled`, what the rule shows to mix rows, and `undecided`, what it cannot judge (an
axis given at run time, a negative axis of unknown rank, an operator it does not know). Nothing is guessed: an
undecided graph is left to the empirical check at load (`tritonnx.backend.runner`).
"""

from __future__ import annotations

import math
from collections import ChainMap
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field

Ints = tuple[int, ...]
Dims = tuple[int | None, ...]  # a tensor's dims where its rank is known; None for a dim not known
# An element of a small integer tensor followed symbolically: a constant, BATCH (the batch size itself), BATCH_TIMES
# (the batch size times a number that does not depend on it), FREE (not known, independent of the batch), or
# BATCH_DATA (depends on the batch size otherwise).
Sym = int | str
BATCH, BATCH_TIMES, FREE, BATCH_DATA = "N", "N*", "?", "N?"
_HUGE = 1 << 30  # a Slice end at least this large runs to the end of its axis
Axes = list[int | None]  # the batch axis of each output of a node, None where it holds no batch

REDUCTIONS = frozenset(
    {
        "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
        "ReduceLogSumExp", "ReduceSumSquare",
    }
)  # fmt: skip
# Operators over one axis, with its default (Softmax's was 1 before opset 13, -1 since: neither is the batch).
_ONE_AXIS = {
    "Softmax": -1, "LogSoftmax": -1, "Hardmax": -1, "ArgMax": 0, "ArgMin": 0, "TopK": -1, "LpNormalization": -1,
    "CumSum": None,  # its axis is its second input
}  # fmt: skip
# Quantizers that take one scale over the whole tensor they quantize: stacked rows share it.
DYNAMIC_QUANTIZERS = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"})
_ELEMENTWISE = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Greater", "Less", "GreaterOrEqual",
        "LessOrEqual", "Where", "Max", "Min", "Mean", "Sum", "PRelu", "BitShift", "BitwiseAnd", "BitwiseOr",
        "BitwiseXor", "Clip", "QuantizeLinear", "DequantizeLinear", "BiasAdd", "BiasGelu", "FastGelu",
        "Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round",
        "Sign", "Erf", "Not", "Cast", "CastLike", "Identity", "Dropout", "LeakyRelu", "Elu", "Selu", "Celu",
        "HardSigmoid", "HardSwish", "Gelu", "QuickGelu", "Mish", "Softplus", "Softsign", "ThresholdedRelu", "Sin",
        "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "IsNaN", "IsInf",
        "BitwiseNot", "Shrink",
    }
)  # fmt: skip
# Operators over each sample of the first axis (images, sequences): they mix whatever lies on the other axes.
_PER_SAMPLE = frozenset(
    {
        "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool",
        "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "InstanceNormalization", "GroupNormalization", "LRN",
        "DepthToSpace", "SpaceToDepth", "Resize", "Upsample", "EmbedLayerNormalization", "Attention",
        "MultiHeadAttention",
    }
)  # fmt: skip
_RECURRENT = frozenset({"RNN", "GRU", "LSTM"})
# Operators whose output has their input's shape.
_SAME_SHAPE = frozenset(
    {"Softmax", "LogSoftmax", "Hardmax", "CumSum", "LpNormalization", "LayerNormalization", "BatchNormalization",
     "MeanVarianceNormalization", "InstanceNormalization", "GroupNormalization", "LRN", "Trilu"}
)  # fmt: skip
# Inputs that give a shape, axes, a count or a range, not values: the batch size there is not data.
_SHAPE_INPUTS = {
    "Reshape": {1}, "Expand": {1}, "ConstantOfShape": {0}, "Tile": {1}, "Slice": {1, 2, 3, 4}, "Pad": {1, 3},
    "Resize": {1, 2, 3}, "Upsample": {1}, "Split": {1}, "Squeeze": {1}, "Unsqueeze": {1}, "TopK": {1},
    "CumSum": {1}, **{op: {1} for op in REDUCTIONS},
}  # fmt: skip
# Operators evaluated on symbolic shapes.
_SYMBOLIC = frozenset(
    {"Shape", "Size", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Identity", "Cast", "Reshape", "Add",
     "Sub", "Mul", "Div", "Max", "Min", "ReduceProd", "Equal", "Where"}
)  # fmt: skip


@dataclass(frozen=True)
class Graph:
    """A graph (the model's, a subgraph, or a local function's body): its nodes and what is known of its tensors.

    `inputs` and `outputs` are the formal ones of a subgraph or function; `constants` the small integer tensors
    (initializers and Constant nodes) by name; `dims` the dims of the graph inputs and initializers whose rank is
    known.
    """

    nodes: tuple[Node, ...]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    constants: Mapping[str, Ints] = field(default_factory=dict)
    dims: Mapping[str, Dims] = field(default_factory=dict)


@dataclass(frozen=True)
class Node:
    """An operator as the graph writes it: its inputs and outputs by name, and its attributes.

    Integer and string attributes, subgraphs (If's branches, Loop's and Scan's bodies), and in a function body the
    attributes it takes from the call (`refs`: its attribute name -> the caller's).
    """

    op_type: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ints: Mapping[str, Ints] = field(default_factory=dict)  # `i` and `ints` attributes, and small int tensors
    domain: str = ""
    strings: Mapping[str, str] = field(default_factory=dict)
    graphs: Mapping[str, Graph] = field(default_factory=dict)
    refs: Mapping[str, str] = field(default_factory=dict)
    value_dims: Dims | None = None  # a Constant's value, where its dims are known

    def axes(self, constants: Mapping[str, Ints], attribute: str, position: int) -> Ints | None:
        """An axes argument: the attribute (older opsets) or the constant input at `position` (newer ones)."""
        if attribute in self.ints:
            return self.ints[attribute]
        if len(self.inputs) > position and self.inputs[position]:
            return constants.get(self.inputs[position])
        return ()

    def attr(self, name: str, default: int) -> int:
        return self.ints.get(name, (default,))[0]


@dataclass(frozen=True)
class Verdict:
    """What the rule shows to mix rows (`coupled`) and what it cannot judge (`undecided`), one phrase per node."""

    coupled: tuple[str, ...] = ()
    undecided: tuple[str, ...] = ()


def judge(graph: Graph, batched_inputs: Iterable[str], functions: Mapping[tuple[str, str], Graph]) -> Verdict:
    """The verdict on `graph` whose `batched_inputs` carry the batch on axis 0; `functions` by (domain, name)."""
    flow = _Flow(functions)
    for name in graph.inputs:
        if name in graph.dims:
            flow.dims[name] = graph.dims[name]
    flow.axis.update(dict.fromkeys(batched_inputs, 0))
    flow.run(graph, "")
    for name in graph.outputs:
        if name in flow.tainted:
            flow.coupled.append(f"the batch size reaches output '{name}' as data ({flow.tainted[name]})")
    return Verdict(tuple(dict.fromkeys(flow.coupled)), tuple(dict.fromkeys(flow.undecided)))


def coupled_nodes(nodes: Iterable[Node], batched_inputs: Iterable[str], constants: Mapping[str, Ints]) -> list[str]:
    """What in the graph makes a row's answer depend on other rows: one phrase per node, in graph order."""
    return list(judge(Graph(tuple(nodes), constants=constants), batched_inputs, {}).coupled)


def _resolve(axis: int | None, rank: int | None) -> int | None:
    """A non-negative axis, or None when it is negative and the rank is not known."""
    if axis is None or axis >= 0:
        return axis
    return axis + rank if rank is not None else None


def _has_batch(values: tuple[Sym, ...] | None) -> bool:
    return values is None or any(isinstance(v, str) and v.startswith(BATCH) for v in values)


def _widen(values: tuple[Sym, ...], width: int) -> tuple[Sym, ...]:
    return values * width if len(values) == 1 else values


def _combine(op: str, a: Sym, b: Sym) -> Sym:
    if isinstance(a, int) and isinstance(b, int):
        if op == "Div":
            return int(a / b) if b else FREE
        if op == "Equal":
            return int(a == b)
        return {"Add": a + b, "Sub": a - b, "Mul": a * b, "Max": max(a, b), "Min": min(a, b)}[op]
    batched = [v for v in (a, b) if isinstance(v, str) and v.startswith(BATCH)]
    if not batched:
        return FREE
    if op == "Equal" and any(isinstance(v, int) and v < 0 for v in (a, b)):
        return 0  # a size is never negative: exporters compare with -1 before an Expand
    if op == "Mul" and len(batched) == 1 and batched[0] in (BATCH, BATCH_TIMES):
        return BATCH_TIMES
    if op in ("Max", "Min") and a == b:
        return a
    return BATCH_DATA


class _Flow:
    """The walk over one graph and the subgraphs and functions it reaches; findings collect in shared lists."""

    def __init__(self, functions: Mapping[tuple[str, str], Graph]) -> None:
        self.functions = functions
        self.axis: MutableMapping[str, int] = {}  # tensor -> the axis its batch is on
        self.dims: MutableMapping[str, Dims] = {}
        self.sym: MutableMapping[str, tuple[Sym, ...] | None] = {}  # None: a shape holding the batch, not followed
        self.tainted: MutableMapping[str, str] = {}  # tensor -> where the batch size became its data
        self.constants: MutableMapping[str, Ints] = {}
        self.coupled: list[str] = []
        self.undecided: list[str] = []
        self.depth = 0

    def child(self) -> _Flow:
        """A scope for a subgraph: it sees this one's tensors, and its own stay its own."""
        flow = _Flow(self.functions)
        flow.axis, flow.dims = ChainMap({}, self.axis), ChainMap({}, self.dims)
        flow.sym, flow.tainted = ChainMap({}, self.sym), ChainMap({}, self.tainted)
        flow.constants = ChainMap({}, self.constants)
        flow.coupled, flow.undecided, flow.depth = self.coupled, self.undecided, self.depth + 1
        return flow

    def run(self, graph: Graph, where: str) -> None:
        self.constants.update(graph.constants)
        for name, values in graph.constants.items():
            self.sym.setdefault(name, values)
        for name, dims in graph.dims.items():
            self.dims.setdefault(name, dims)
        for node in graph.nodes:
            self.visit(node, where)

    # --- findings -------------------------------------------------------------------------------------------------

    def couple(self, node: Node, why: str, where: str) -> None:
        self.coupled.append(f"{node.op_type} {why} (node '{node.name or node.outputs[0]}'{where})")

    def unsure(self, node: Node, why: str, where: str) -> None:
        self.undecided.append(f"{node.op_type} {why} (node '{node.name or node.outputs[0]}'{where})")

    def rank(self, name: str) -> int | None:
        dims = self.dims.get(name)
        return len(dims) if dims is not None else None

    def ints_of(self, node: Node, position: int) -> Ints | None:
        if len(node.inputs) > position and node.inputs[position]:
            return self.constants.get(node.inputs[position])
        return None

    # --- the walk -------------------------------------------------------------------------------------------------

    def visit(self, node: Node, where: str) -> None:
        op = node.op_type
        if op == "Constant" and node.outputs:
            if node.value_dims is not None:
                self.dims[node.outputs[0]] = node.value_dims
            if len(node.ints) == 1:
                self.constants[node.outputs[0]] = self.sym[node.outputs[0]] = next(iter(node.ints.values()))
            return
        function = self.functions.get((node.domain, op))
        if function is not None and node.domain not in ("", "ai.onnx"):
            self.call(node, function, where)
            return
        if node.graphs:
            self.control_flow(node, where)
            return
        if self.symbolic(node):
            return
        self.taint(node, where)
        self.dims_after(node)
        batched = {i: self.axis[n] for i, n in enumerate(node.inputs) if n and n in self.axis}
        if op in DYNAMIC_QUANTIZERS:
            if 0 in batched:
                self.couple(node, "quantizes its input with one scale over the whole batch", where)
            return
        if not batched:
            self.unbatched(node, where)
            return
        axes = self.judge_node(node, batched, where)
        for name, axis in zip(node.outputs, axes, strict=False):
            if name and axis is not None:
                self.axis[name] = axis

    def taint(self, node: Node, where: str) -> None:
        """Outputs whose values depend on the batch size: a shape holding it fed as data, or a tainted input."""
        shapes = _SHAPE_INPUTS.get(node.op_type, set())
        origin = next((self.tainted[n] for n in node.inputs if n in self.tainted), None)
        if origin is None:
            fed = [
                n for i, n in enumerate(node.inputs) if i not in shapes and n in self.sym and _has_batch(self.sym[n])
            ]
            if fed:
                origin = f"{node.op_type} takes the batch size as data, node '{node.name or node.outputs[0]}'{where}"
        if origin is not None:
            self.tainted.update(dict.fromkeys((n for n in node.outputs if n), origin))

    def symbolic(self, node: Node) -> bool:
        """Follow a small integer tensor (a shape, a size) through the operators exporters compute shapes with."""
        op, ins = node.op_type, node.inputs
        if op not in _SYMBOLIC or not ins or not node.outputs or any(n in self.tainted for n in ins):
            return False
        if op in ("Shape", "Size"):
            source = ins[0]
            dims = self.dims.get(source)
            axis = self.axis.get(source)
            if op == "Size":
                value: tuple[Sym, ...] | None = (BATCH_TIMES if axis is not None else FREE,)
            elif dims is None:
                value = None if axis is not None else (FREE,)  # its length unknown: only its head is relied on
            else:
                whole: list[Sym] = [d if d is not None else FREE for d in dims]
                if axis is not None:
                    whole[axis] = BATCH
                rank = len(dims)
                start = _resolve(node.attr("start", 0), rank) or 0
                end = _resolve(node.ints.get("end", (rank,))[0], rank)
                value = tuple(whole[start:end])
            self.sym[node.outputs[0]] = value
            self.dims[node.outputs[0]] = (len(value),) if value is not None else (None,)
            return True
        values = [self.sym.get(n) if n else () for n in ins]
        if not all(n in self.sym for n in ins if n):
            return False  # a value that is not a shape or a constant: the main walk's business
        result: tuple[Sym, ...] | None = None
        first = values[0]
        if op in ("Identity", "Cast", "Unsqueeze", "Squeeze", "Reshape"):
            result = first
        elif op == "Concat":
            parts = [v for v in values if v is not None]
            result = tuple(e for v in parts for e in v) if len(parts) == len(values) else None
        elif op == "Gather" and first is not None:
            index = self.constants.get(ins[1]) if len(ins) > 1 else None
            if index is None or not all(-len(first) <= i < len(first) for i in index):
                return False
            result = tuple(first[i] for i in index)
        elif op == "Slice" and first is not None:
            starts, ends = self.constants.get(ins[1]), self.constants.get(ins[2]) if len(ins) > 2 else None
            steps = self.ints_of(node, 4) or (1,)
            if starts is None or ends is None or len(starts) != 1:
                return False
            result = first[starts[0] : min(ends[0], _HUGE) : steps[0]]
        elif op == "ReduceProd" and first is not None:
            result = (BATCH_TIMES if _has_batch(first) else FREE,)
        elif op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal") and len(values) == 2:
            a, b = values
            if a is not None and b is not None and (len(a) == len(b) or 1 in (len(a), len(b))):
                width = max(len(a), len(b))
                result = tuple(_combine(op, x, y) for x, y in zip(_widen(a, width), _widen(b, width), strict=True))
        elif op == "Where" and len(values) == 3:
            given = [v for v in values if v is not None]
            width = max(len(v) for v in given) if given else 0
            if len(given) == 3 and all(len(v) in (1, width) for v in given):
                cond, a, b = (_widen(v, width) for v in given)
                result = tuple(
                    (x if c else y) if isinstance(c, int) else (x if x == y else BATCH_DATA)
                    for c, x, y in zip(cond, a, b, strict=True)
                )
        else:
            return False
        self.sym[node.outputs[0]] = result
        self.dims_after(node)
        return True

    def unbatched(self, node: Node, where: str) -> None:
        """A node no batched tensor reaches: it may make one from a shape holding the batch size."""
        op, ins = node.op_type, node.inputs
        shape_at = {"Expand": 1, "ConstantOfShape": 0, "Tile": 1}.get(op)
        if shape_at is None or len(ins) <= shape_at or ins[shape_at] not in self.sym:
            return
        shape = self.sym[ins[shape_at]]
        if shape is None:
            self.unsure(node, "takes a shape holding the batch size that is not followed", where)
            return
        found = [i for i, v in enumerate(shape) if v in (BATCH, BATCH_TIMES)]
        if len(found) == 1:
            rank = self.rank(ins[0]) if op != "ConstantOfShape" else len(shape)
            offset = max(0, (rank or 0) - len(shape)) if op == "Expand" else 0
            self.axis[node.outputs[0]] = found[0] + offset
        elif _has_batch(shape):
            self.unsure(node, "takes a shape that depends on the batch size", where)

    # --- operators that meet the batch ----------------------------------------------------------------------------

    def judge_node(self, node: Node, batched: dict[int, int], where: str) -> Axes:
        """Record what `node` does to the rows; the batch axis of each of its outputs."""
        op = node.op_type
        first = next(iter(batched.values()))
        data = batched.get(0)
        rank = self.rank(node.inputs[0])
        keep: Axes = [first] * len(node.outputs)
        if op in _ELEMENTWISE:
            return self.elementwise(node, batched, where)
        if op in REDUCTIONS or op in _ONE_AXIS:
            return self.reduce(node, data, rank, where) if data is not None else keep
        if op in _PER_SAMPLE:
            if data is not None and data != 0:
                self.couple(
                    node, f"works across axis {data}, where the batch is (it holds one sample per row of axis 0)", where
                )
            return [data] * len(node.outputs)
        if op in ("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization"):
            return self.layer_norm(node, data, rank, where) if data is not None else keep
        if op == "BatchNormalization":
            training = node.attr("training_mode", 0) or len([o for o in node.outputs if o]) > 1
            if data is not None and (data != 1 if training else data == 1):
                why = (
                    "in training mode normalises over the batch axis" if training else "scales each row by its channel"
                )
                self.couple(node, why, where)
            return [data] + [None] * (len(node.outputs) - 1)
        if op == "MeanVarianceNormalization":
            axes = [_resolve(a, rank) for a in node.ints.get("axes", (0, 2, 3))]
            if None in axes and data is not None:
                self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
            elif data in axes:
                self.couple(node, f"over axis {data}, the batch axis", where)
            return keep
        if op in _RECURRENT:
            return self.recurrent(node, data, where)
        if op in ("MatMul", "MatMulInteger", "QLinearMatMul", "MatMulNBits", "MatMulIntegerToFloat"):
            b_at = 3 if op == "QLinearMatMul" else 1
            return [self.matmul(node, 0, b_at, batched, where)]
        if op == "Gemm":
            return [self.gemm(node, batched, where)]
        if op == "Einsum":
            return [self.einsum(node, batched, where)]
        if op == "Transpose":
            perm = node.ints.get("perm") or (tuple(range(rank))[::-1] if rank is not None else None)
            if perm is None:
                self.unsure(node, "reverses the axes of a tensor of unknown rank", where)
                return keep
            return [perm.index(first) if first in perm else None]
        if op in ("Unsqueeze", "Squeeze"):
            return [self.squeeze(node, first, rank, where)]
        if op == "Flatten":
            axis = _resolve(node.attr("axis", 1), rank)
            if axis is None:
                self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
            elif axis <= first:
                self.couple(node, f"at axis {axis} merges the rows of the batch into one", where)
            elif first != 0:
                self.unsure(node, f"merges the batch on axis {first} with the axes before it", where)
            return [0 if first == 0 else None]
        if op == "Reshape":
            return [self.reshape(node, first, where)] if data is not None else keep
        if op in ("Gather", "GatherElements", "GatherND"):
            return [self.gather(node, batched, rank, where)]
        if op in ("ScatterND", "ScatterElements", "Scatter"):
            return [self.scatter(node, batched, rank, where)]
        if op in ("Slice", "Pad", "Tile", "Concat", "Split", "Compress"):
            return self.positional(node, batched, rank, where)
        if op == "Expand":
            return [data + max(0, len(self.sym.get(node.inputs[1]) or ()) - (rank or 0)) if data is not None else None]
        if op == "OneHot" and data is not None:
            added = _resolve(node.attr("axis", -1), rank + 1 if rank is not None else None)
            if added is None:
                self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
                return keep
            return [data + (added <= data)]
        if op in ("NonZero", "Unique"):
            self.couple(node, "lists values across the whole batch", where)
            return [None] * len(node.outputs)
        if op in ("Shape", "Size"):
            return [None]  # a shape of unknown rank: followed in `symbolic`
        self.unsure(node, f"is an operator the rule does not know (domain '{node.domain or 'ai.onnx'}')", where)
        return keep

    def elementwise(self, node: Node, batched: dict[int, int], where: str) -> Axes:
        ranks = [self.rank(n) if n else 0 for n in node.inputs]
        if None in ranks:
            axes = set(batched.values())
            if len(axes) > 1:
                self.unsure(node, "meets batches on different axes", where)
            return [min(axes)] * len(node.outputs)
        out = max(r for r in ranks if r is not None)
        aligned = {a + out - ranks[i] for i, a in batched.items()}  # type: ignore[operator]
        if len(aligned) > 1:
            self.couple(node, "pairs the rows of one batch with those of another axis", where)
        axis = min(aligned)
        for i, name in enumerate(node.inputs):
            dims = self.dims.get(name) if name else None
            at = axis - (out - len(dims)) if dims is not None else -1
            if i not in batched and dims is not None and at >= 0 and dims[at] not in (1, None):
                self.couple(node, f"gives each row of the batch another element of '{name}'", where)
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and batched.get(0) is not None:
            scale = self.dims.get(node.inputs[1]) if len(node.inputs) > 1 else None
            per_axis = _resolve(node.attr("axis", 1), ranks[0])
            if scale and scale != (1,) and per_axis == batched[0]:
                self.couple(node, "scales each row of the batch by another element", where)
        return [axis] * len(node.outputs)

    def reduce(self, node: Node, axis: int, rank: int | None, where: str) -> Axes:
        op = node.op_type
        on_batch = f"over axis {axis}, the batch axis"
        keep: Axes = [axis] * len(node.outputs)
        if op in REDUCTIONS:
            axes = node.axes(self.constants, "axes", 1)
            if axes is None:
                self.unsure(node, "takes its axes at run time", where)
                return keep
            if not axes:
                if node.attr("noop_with_empty_axes", 0):
                    return keep
                self.couple(node, "over every axis, the batch axis too", where)
                return [None]
            resolved = [_resolve(a, rank) for a in axes]
            if None in resolved:
                self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
                return keep
            if axis in resolved:
                self.couple(node, on_batch, where)
            if node.attr("keepdims", 1):
                return keep
            return [axis - sum(a < axis for a in resolved if a is not None)]
        default = _ONE_AXIS[op]
        if default is None:
            chosen = node.axes(self.constants, "axis", 1)
            along = chosen[0] if chosen and len(chosen) == 1 else None
            if along is None:
                self.unsure(node, "takes its axis at run time", where)
                return keep
        else:
            along = node.attr("axis", default)
        resolved_along = _resolve(along, rank)
        if resolved_along is None:
            self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
        elif resolved_along == axis:
            self.couple(node, on_batch, where)
        if op in ("ArgMax", "ArgMin") and not node.attr("keepdims", 1) and resolved_along is not None:
            return [axis - (resolved_along < axis)]
        return keep

    def layer_norm(self, node: Node, axis: int, rank: int | None, where: str) -> Axes:
        start = _resolve(node.attr("axis", -1), rank)
        if start is None:
            self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
        elif start <= axis:
            self.couple(node, f"normalises over axes {start} and after, the batch axis {axis} among them", where)
        return [axis] + [None] * (len(node.outputs) - 1)

    def recurrent(self, node: Node, axis: int | None, where: str) -> Axes:
        batch_first = bool(node.attr("layout", 0))
        expected = 0 if batch_first else 1
        if axis is not None and axis != expected:
            self.couple(node, f"runs its recurrence over axis {axis}, the batch axis", where)
        return [0, 0, 0] if batch_first else [2, 1, 1]

    def matmul(self, node: Node, a_at: int, b_at: int, batched: dict[int, int], where: str) -> int | None:
        ranks = (self.rank(node.inputs[a_at]), self.rank(node.inputs[b_at]) if len(node.inputs) > b_at else None)
        if None in ranks:
            self.unsure(node, "multiplies tensors of unknown rank", where)
            return next(iter(batched.values()))
        ra, rb = (r or 0 for r in ranks)
        out = max(ra, rb, 2) - (ra == 1) - (rb == 1)
        found: set[int] = set()
        for position, r, contracted, kept in ((a_at, ra, ra - 1, ra - 2), (b_at, rb, max(rb - 2, 0), rb - 1)):
            axis = batched.get(position)
            if axis is None:
                continue
            if axis == contracted:
                self.couple(node, f"contracts axis {axis}, the batch axis, of input '{node.inputs[position]}'", where)
            elif axis == kept:
                found.add(out - 2 if position == a_at else out - 1)
            else:
                found.add(axis + out - r)
        if len(found) > 1:
            self.couple(node, "pairs the rows of one batch with those of another", where)
        return min(found) if found else None

    def gemm(self, node: Node, batched: dict[int, int], where: str) -> int | None:
        contracted = {0: 0 if node.attr("transA", 0) else 1, 1: 1 if node.attr("transB", 0) else 0}
        found: set[int] = set()
        for position, axis in batched.items():
            if position == 2:
                found.add(axis)
            elif axis == contracted[position]:
                self.couple(node, f"contracts axis {axis}, the batch axis, of input '{node.inputs[position]}'", where)
            else:
                found.add(position)
        if len(found) > 1:
            self.couple(node, "pairs the rows of one batch with those of another", where)
        return min(found) if found else None

    def einsum(self, node: Node, batched: dict[int, int], where: str) -> int | None:
        equation = node.strings.get("equation", "").replace(" ", "")
        terms, arrow, output = equation.partition("->")
        inputs = terms.split(",")
        if not arrow:
            letters = [c for c in terms if c.isalpha()]
            output = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
        batch_letters: set[str] = set()
        for position, axis in batched.items():
            term = inputs[position] if position < len(inputs) else ""
            if "..." in term:
                before = term.index("...")
                if axis < before:
                    batch_letters.add(term[axis])
                elif before == 0 and axis == 0 and output.startswith("..."):
                    batch_letters.add("...")
                else:
                    self.unsure(node, "has its batch axis inside an ellipsis", where)
                    return axis
            elif axis < len(term):
                batch_letters.add(term[axis])
        if len(batch_letters) > 1:
            self.couple(node, "pairs the rows of one batch with those of another", where)
        for letter in batch_letters:
            if letter not in output:
                self.couple(node, f"sums over '{letter}', the batch axis", where)
                return None
        letter = min(batch_letters)
        if letter == "...":
            return 0
        if "..." in output and output.index("...") < output.index(letter):
            self.unsure(node, "puts the batch axis after an ellipsis", where)
            return None
        return output.index(letter)

    def squeeze(self, node: Node, axis: int, rank: int | None, where: str) -> int | None:
        axes = node.axes(self.constants, "axes", 1)
        if axes is None:
            self.unsure(node, "takes its axes at run time", where)
            return axis
        if not axes:
            if node.op_type == "Squeeze":
                self.unsure(node, "with no axes drops the batch axis of a batch of one", where)
            return axis
        if node.op_type == "Unsqueeze":
            resolved = [_resolve(a, rank + len(axes) if rank is not None else None) for a in axes]
            if None in resolved:
                self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
                return axis
            for position in sorted(resolved):  # type: ignore[type-var]
                axis += position <= axis  # type: ignore[operator]
            return axis
        removed = [_resolve(a, rank) for a in axes]
        if None in removed:
            self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
            return axis
        if axis in removed:
            self.unsure(node, "squeezes the batch axis away, as only a batch of one allows", where)
            return None
        return axis - sum(a < axis for a in removed)  # type: ignore[operator]

    def reshape(self, node: Node, axis: int, where: str) -> int | None:
        target = self.sym.get(node.inputs[1]) if node.inputs[1] in self.sym else None
        if node.inputs[1] not in self.sym:
            self.unsure(node, "takes a shape computed at run time", where)
            return axis
        if target is None:
            self.unsure(node, "takes a shape holding the batch size that is not followed", where)
            return axis
        dims = self.dims.get(node.inputs[0])
        if axis != 0:
            found = [i for i, v in enumerate(target) if v in (BATCH, BATCH_TIMES)]
            if len(found) == 1:
                return found[0]
            self.unsure(node, f"reshapes a tensor whose batch is on axis {axis}", where)
            return None
        head = target[0] if target else None
        if head in (BATCH, BATCH_TIMES, 0):
            if any(v == BATCH_DATA for v in target):
                self.unsure(node, "takes a shape that depends on the batch size", where)
            return 0
        row = math.prod(dims[1:]) if dims is not None and None not in dims[1:] else None  # type: ignore[arg-type]
        rest = target[1:]
        if head == -1 and all(isinstance(v, int) and v > 0 for v in rest):
            wanted = math.prod(v for v in rest if isinstance(v, int))
            if row == wanted:
                return 0
            if row is None:
                self.unsure(node, f"to {list(target)} keeps the rows apart only if each holds {wanted} elements", where)
                return 0
        if head == -1 and row is None and any(v == -1 or not isinstance(v, int) for v in rest):
            self.unsure(node, f"to {list(target)} may move the batch off the first axis", where)
            return 0
        self.couple(node, f"to {list(target)} merges the rows of the batch", where)
        return 0

    def gather(self, node: Node, batched: dict[int, int], rank: int | None, where: str) -> int | None:
        op, data, indices = node.op_type, batched.get(0), batched.get(1)
        if op == "GatherND":
            dims = node.attr("batch_dims", 0)
            if data is not None and data >= dims:
                self.couple(node, "picks rows of the batch by index", where)
            if data is not None:
                return data
            index_rank = self.rank(node.inputs[1])
            return indices if index_rank is not None and indices is not None and indices < index_rank - 1 else None
        axis = _resolve(node.attr("axis", 0), rank)
        if axis is None:
            self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
            return data if data is not None else indices
        if data is not None and data == axis:
            self.couple(node, "picking rows of the batch", where)
            return indices if op == "GatherElements" else None
        if op == "GatherElements":
            return data if data is not None else indices
        if data is not None and indices is not None:
            self.couple(node, "indexes a batch with a batched tensor along another axis", where)
        if data is None:
            return axis + indices if indices is not None else None
        index_rank = self.rank(node.inputs[1])
        if data < axis:
            return data
        if index_rank is None:
            self.unsure(node, "takes indices of unknown rank", where)
        return data - 1 + index_rank if index_rank is not None else None

    def scatter(self, node: Node, batched: dict[int, int], rank: int | None, where: str) -> int | None:
        data = batched.get(0)
        if data is None:
            self.couple(node, "writes the rows of a batch into one tensor", where)
            return None
        if node.op_type == "ScatterND":
            self.couple(node, "writes at indices that start with the batch axis", where)
            return data
        axis = _resolve(node.attr("axis", 0), rank)
        if axis is None:
            self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
        elif axis == data:
            self.couple(node, "writes across the rows of the batch", where)
        elif len(batched) < 3:
            self.couple(node, "writes the same indices or updates into every row", where)
        return data

    def positional(self, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
        """Slice, Pad, Tile, Concat, Split, Compress: fine unless they cut, add or reorder rows of the batch."""
        op, data = node.op_type, batched.get(0)
        keep: Axes = [data] * len(node.outputs)
        if op == "Concat":
            axes = set(batched.values())
            along = _resolve(node.attr("axis", 0), rank)
            if along is None:
                self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
            elif along in axes:
                self.couple(node, "joins tensors along the batch axis", where)
            if len(axes) > 1:
                self.unsure(node, "joins batches on different axes", where)
            return [min(axes)]
        if data is None:
            return keep
        if op in ("Split", "Compress"):
            along = _resolve(node.attr("axis", 0), rank)
            if op == "Compress" and "axis" not in node.ints:
                self.couple(node, "flattens the batch", where)
            elif along is None:
                self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
            elif along == data:
                self.couple(node, f"{'picks' if op == 'Compress' else 'cuts'} rows of the batch", where)
            return keep
        if op == "Tile":
            repeats = self.sym.get(node.inputs[1])
            if repeats is None or data >= len(repeats):
                self.unsure(node, "takes its repeats at run time", where)
            elif repeats[data] != 1:
                self.couple(node, "repeats rows of the batch", where)
            return keep
        if op == "Pad":
            pads = node.ints.get("pads") or self.ints_of(node, 1)
            pad_axes = self.ints_of(node, 3) if len(node.inputs) > 3 and node.inputs[3] else None
            if pads is None or (len(node.inputs) > 3 and node.inputs[3] and pad_axes is None):
                self.unsure(node, "takes its pads at run time", where)
                return keep
            order = [_resolve(a, rank) for a in pad_axes] if pad_axes is not None else list(range(len(pads) // 2))
            if None in order:
                self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
            elif data in order:
                at = order.index(data)
                if pads[at] or pads[at + len(order)]:
                    self.couple(node, "adds rows to the batch", where)
            return keep
        return [self.slice(node, data, rank, where)]

    def slice(self, node: Node, axis: int, rank: int | None, where: str) -> int | None:
        axes: Ints | None
        starts: Ints | None
        steps: Ints | None
        if "starts" in node.ints:  # before opset 10: attributes
            starts, ends = node.ints["starts"], node.ints.get("ends")
            axes, steps = node.ints.get("axes"), None
            sym_ends: tuple[Sym, ...] | None = ends
        else:
            starts, ends = self.ints_of(node, 1), self.ints_of(node, 2)
            axes = self.ints_of(node, 3) if len(node.inputs) > 3 and node.inputs[3] else None
            steps = self.ints_of(node, 4) if len(node.inputs) > 4 and node.inputs[4] else None
            sym_ends = self.sym.get(node.inputs[2]) if ends is None else ends
            runtime = [p for p in (3, 4) if len(node.inputs) > p and node.inputs[p] and self.ints_of(node, p) is None]
            if runtime:
                self.unsure(node, "takes its axes or steps at run time", where)
                return axis
        count = len(starts) if starts is not None else len(sym_ends) if sym_ends is not None else None
        if axes is None and count is None:
            self.unsure(node, "slices axes not known until run time", where)
            return axis
        order = [_resolve(a, rank) for a in axes] if axes is not None else list(range(count or 0))
        if None in order:
            self.unsure(node, "has a negative axis of a tensor of unknown rank", where)
            return axis
        if axis not in order:
            return axis
        at = order.index(axis)
        if steps is not None and steps[at] < 0:
            self.couple(node, "reverses the rows of the batch", where)
            return axis
        end = sym_ends[at] if sym_ends is not None and at < len(sym_ends) else None
        if starts is None or end is None:
            self.unsure(node, "slices the batch axis at run time", where)
        elif starts[at] != 0 or not (end == BATCH or (isinstance(end, int) and end >= _HUGE)):
            self.couple(node, "keeps only some rows of the batch", where)
        elif steps is not None and steps[at] != 1:
            self.couple(node, "skips rows of the batch", where)
        return axis

    # --- dims, control flow and functions -------------------------------------------------------------------------

    def dims_after(self, node: Node) -> None:
        """The dims of the node's first output, where the rank follows simply from its inputs."""
        op, ins = node.op_type, node.inputs
        given = [self.dims.get(n) if n else None for n in ins]
        first = given[0] if given else None
        if op == "Concat":
            first = next((d for d in given if d is not None), None)
        out: Dims | None = None
        if op in _ELEMENTWISE and all(d is not None for d, n in zip(given, ins, strict=True) if n):
            width = max((len(d) for d in given if d is not None), default=0)
            padded = [(1,) * (width - len(d)) + d for d in given if d is not None]
            out = tuple(
                next((v for v in column if v not in (1, None)), None if None in column else 1)
                for column in zip(*padded, strict=True)
            )
        elif op == "Range":
            out = (None,)
        elif op in ("ConstantOfShape", "Expand") and ins[-1] in self.sym and self.sym[ins[-1]] is not None:
            width = max(len(self.sym[ins[-1]] or ()), len(first) if first is not None and op == "Expand" else 0)
            out = (None,) * width
        elif first is None:
            return
        elif op in _SAME_SHAPE:
            out = first
        elif op in _PER_SAMPLE or op in _ONE_AXIS or op in ("Slice", "Pad", "Tile", "Split", "Concat"):
            out = (None,) * len(first)
            if op in ("ArgMax", "ArgMin") and not node.attr("keepdims", 1):
                out = out[:-1]
        elif op == "Transpose":
            perm = node.ints.get("perm") or tuple(range(len(first)))[::-1]
            out = tuple(first[p] for p in perm) if len(perm) == len(first) else None
        elif op == "Flatten":
            axis = _resolve(node.attr("axis", 1), len(first)) or 0
            head, tail = first[:axis], first[axis:]
            out = tuple(math.prod(p) if None not in p else None for p in (head, tail))  # type: ignore[arg-type]
        elif op in REDUCTIONS:
            axes = node.axes(self.constants, "axes", 1)
            if axes is None:
                return
            resolved = {_resolve(a, len(first)) for a in axes} if axes else set(range(len(first)))
            if node.attr("keepdims", 1):
                out = tuple(1 if i in resolved else d for i, d in enumerate(first))
            else:
                out = tuple(d for i, d in enumerate(first) if i not in resolved)
        elif op in ("Unsqueeze", "Squeeze"):
            axes = node.axes(self.constants, "axes", 1)
            if not axes:
                return
            if op == "Squeeze":
                removed = {_resolve(a, len(first)) for a in axes}
                out = tuple(d for i, d in enumerate(first) if i not in removed)
            else:
                width = len(first) + len(axes)
                added = {_resolve(a, width) for a in axes}
                rest = iter(first)
                out = tuple(1 if i in added else next(rest, None) for i in range(width))
        elif op == "Reshape" and len(ins) > 1 and self.sym.get(ins[1]) is not None:
            target = self.sym[ins[1]] or ()
            out = tuple(v if isinstance(v, int) and v > 0 else None for v in target)
        elif op in ("MatMul", "MatMulInteger") and given[1] is not None:
            a, b = first, given[1]
            out = (None,) * (max(len(a), len(b), 2) - (len(a) == 1) - (len(b) == 1))
        elif op == "Gemm":
            out = (None, None)
        elif op == "OneHot":
            out = (None,) * (len(first) + 1)
        elif op == "Gather" and len(given) > 1 and given[1] is not None:
            axis = _resolve(node.attr("axis", 0), len(first)) or 0
            out = first[:axis] + given[1] + first[axis + 1 :]
        elif op in ("Cast", "Identity"):
            out = first
        elif op == "DynamicQuantizeLinear":
            self.dims.update({name: () for name in node.outputs[1:] if name})  # the scale and zero point
            out = first
        if out is not None and node.outputs and node.outputs[0]:
            self.dims[node.outputs[0]] = out

    def control_flow(self, node: Node, where: str) -> None:
        op, name = node.op_type, node.name or node.outputs[0]
        inner = f" in {op} '{name}'{where}"
        if op == "If":
            if node.inputs and (node.inputs[0] in self.tainted or node.inputs[0] in self.axis):
                self.couple(node, "chooses its branch by a value that depends on the batch", where)
            found: dict[int, set[int | None]] = {}
            for branch in node.graphs.values():
                child = self.child()
                child.run(branch, inner)
                for i, out in enumerate(branch.outputs):
                    found.setdefault(i, set()).add(child.axis.get(out))
                    if out in child.tainted:
                        self.tainted[node.outputs[i]] = child.tainted[out]
            for i, axes in found.items():
                axis = next(iter(axes)) if len(axes) == 1 else min(a for a in axes if a is not None)
                if len(axes) > 1:
                    self.unsure(node, "has branches whose outputs carry the batch differently", where)
                if axis is not None and i < len(node.outputs):
                    self.axis[node.outputs[i]] = axis
            return
        body = next(iter(node.graphs.values()))
        if op == "Loop":
            self.loop(node, body, inner, where)
        elif op == "Scan":
            self.scan(node, body, inner, where)
        else:
            self.unsure(node, "has subgraphs the rule does not follow", where)

    def loop(self, node: Node, body: Graph, inner: str, where: str) -> None:
        if any(n in self.tainted or (n in self.sym and _has_batch(self.sym[n])) for n in node.inputs[:2] if n):
            self.couple(node, "runs a number of iterations that depends on the batch", where)
        carried = len(node.inputs) - 2
        axes: list[int | None] = [self.axis.get(n) for n in node.inputs[2:]]
        child = self
        for _ in range(2):  # a value carried round may take the batch on the first iteration
            child = self.child()
            for formal, axis in zip(body.inputs[2:], axes, strict=False):
                if axis is not None:
                    child.axis[formal] = axis
            child.run(body, inner)
            after = [child.axis.get(n) for n in body.outputs[1 : 1 + carried]]
            if after == axes:
                break
            axes = [a if a is not None else b for a, b in zip(after, axes, strict=True)]
        for i, out in enumerate(body.outputs[1:]):
            if i >= len(node.outputs):
                break
            axis = child.axis.get(out)
            if out in child.tainted:
                self.tainted[node.outputs[i]] = child.tainted[out]
            if axis is not None:
                self.axis[node.outputs[i]] = axis + (i >= carried)  # scan outputs are stacked on a new axis 0

    def scan(self, node: Node, body: Graph, inner: str, where: str) -> None:
        scanned = node.attr("num_scan_inputs", 0)
        states = len(node.inputs) - scanned
        input_axes = node.ints.get("scan_input_axes", (0,) * scanned)
        output_axes = node.ints.get("scan_output_axes", (0,) * (len(node.outputs) - states))
        child = self.child()
        for i, (actual, formal) in enumerate(zip(node.inputs, body.inputs, strict=False)):
            axis = self.axis.get(actual)
            if axis is None:
                continue
            if i >= states:
                along = _resolve(input_axes[i - states], self.rank(actual))
                if along is None or along == axis:
                    self.couple(node, f"iterates over axis {axis}, the batch axis", where)
                    continue
                axis -= along < axis
            child.axis[formal] = axis
        child.run(body, inner)
        for i, out in enumerate(body.outputs):
            if i >= len(node.outputs):
                break
            if out in child.tainted:
                self.tainted[node.outputs[i]] = child.tainted[out]
            axis = child.axis.get(out)
            if axis is not None and i >= states:
                axis += _resolve(output_axes[i - states], None) is not None and output_axes[i - states] <= axis
            if axis is not None:
                self.axis[node.outputs[i]] = axis

    def call(self, node: Node, function: Graph, where: str) -> None:
        if self.depth > 8:
            self.unsure(node, "calls functions nested too deep to follow", where)
            return
        child = _Flow(self.functions)
        child.coupled, child.undecided, child.depth = self.coupled, self.undecided, self.depth + 1
        for actual, formal in zip(node.inputs, function.inputs, strict=False):
            _copy(self, actual, child, formal)
            if actual in self.constants:
                child.constants[formal] = self.constants[actual]
        nodes = tuple(
            Node(n.op_type, n.name, n.inputs, n.outputs,
                 {**n.ints, **{k: node.ints[v] for k, v in n.refs.items() if v in node.ints}},
                 n.domain, n.strings, n.graphs, value_dims=n.value_dims)
            for n in function.nodes
        )  # fmt: skip
        child.run(Graph(nodes, function.inputs, function.outputs, function.constants), f" in function '{node.op_type}'")
        for actual, formal in zip(node.outputs, function.outputs, strict=False):
            _copy(child, formal, self, actual)


def _copy(source: _Flow, name: str, target: _Flow, as_name: str) -> None:
    """What `source` knows of tensor `name`, known to `target` as `as_name` (a function's formal and actual)."""
    if name in source.axis:
        target.axis[as_name] = source.axis[name]
    if name in source.dims:
        target.dims[as_name] = source.dims[name]
    if name in source.sym:
        target.sym[as_name] = source.sym[name]
    if name in source.tainted:
        target.tainted[as_name] = source.tainted[name]
