"""The walk: the batch axis followed from the batched inputs through every node, its subgraphs and functions.

Each operator's part (how the batch axis, the dims and the symbolic shape values pass through it, which inputs are
shapes) is its entry in `tritonnx.backend.batch_axis.operators.OPERATORS`; this module does what is common to all:
the order of the walk, the batch size followed as data, nodes no batched tensor reaches, If/Loop/Scan bodies and
local functions.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from tritonnx.backend.batch_axis.graph import Axes, Dims, Graph, Ints, Node
from tritonnx.backend.batch_axis.operators import OPERATORS, Operator
from tritonnx.backend.batch_axis.symbolic import (
    BATCH,
    BATCH_TIMES,
    FREE,
    LONGEST,
    SKIP,
    Value,
    constants,
    has_batch,
)

_UNKNOWN = Operator()


@dataclass(frozen=True)
class Taint:
    """Where the batch size became a tensor's data, and whether it certainly reaches its values."""

    origin: str
    certain: bool


class Flow:
    """The walk over one graph and the subgraphs and functions it reaches; findings collect in shared lists."""

    def __init__(self, functions: Mapping[tuple[str, str], Graph]) -> None:
        self.functions = functions
        self.axis: MutableMapping[str, int] = {}  # tensor -> the axis its batch is on
        self.dims: MutableMapping[str, Dims] = {}
        self.sym: MutableMapping[str, Value] = {}  # None: a shape holding the batch, not followed
        self.tainted: MutableMapping[str, Taint] = {}
        self.merged: set[str] = set()  # tensors whose batch axis holds the batch times other dims
        self.constants: MutableMapping[str, Ints] = {}
        self.coupled: list[str] = []
        self.undecided: list[str] = []
        self.depth = 0

    def child(self) -> Flow:
        """A scope for a subgraph: it sees this one's tensors, and its own stay its own."""
        flow = Flow(self.functions)
        flow.axis, flow.dims = ChainMap({}, self.axis), ChainMap({}, self.dims)
        flow.sym, flow.tainted = ChainMap({}, self.sym), ChainMap({}, self.tainted)
        flow.constants, flow.merged = ChainMap({}, self.constants), self.merged
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

    def outputs(self, graph: Graph) -> None:
        """The graph's outputs the batch size reaches as data: coupled where certain, else undecided."""
        for name in graph.outputs:
            taint = self.tainted.get(name)
            if taint is None:
                continue
            if taint.certain:
                self.coupled.append(f"the batch size reaches output '{name}' as data ({taint.origin})")
            else:
                self.undecided.append(f"the batch size may reach output '{name}' as data ({taint.origin})")

    # --- findings -------------------------------------------------------------------------------------------------

    def couple(self, node: Node, why: str, where: str) -> None:
        self.coupled.append(f"{node.op_type} {why} (node '{node.name or node.outputs[0]}'{where})")

    def unsure(self, node: Node, why: str, where: str) -> None:
        self.undecided.append(f"{node.op_type} {why} (node '{node.name or node.outputs[0]}'{where})")

    def rank(self, name: str) -> int | None:
        dims = self.dims.get(name)
        return len(dims) if dims is not None else None

    def ints_of(self, node: Node, position: int) -> Ints | None:
        return self.constants.get(node.input(position)) if node.input(position) else None

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
            from tritonnx.backend.batch_axis.control import control_flow

            control_flow(self, node, where)
            return
        entry = OPERATORS.get(op, _UNKNOWN) if node.domain in ("", "ai.onnx", "com.microsoft") else _UNKNOWN
        if self.symbolic(node, entry):
            return
        self.taint(node, entry, where)
        if entry.dims is not None and node.outputs and node.outputs[0]:
            out = entry.dims(self, node)
            if out is not None:
                self.dims[node.outputs[0]] = out
        batched = {i: self.axis[n] for i, n in enumerate(node.inputs) if n and n in self.axis}
        if not batched:
            self.unbatched(node, where)
            return
        if entry.axis is None:
            self.unsure(node, f"is an operator the rule does not know (domain '{node.domain or 'ai.onnx'}')", where)
            axes: Axes = [next(iter(batched.values()))] * len(node.outputs)
        else:
            axes = entry.axis(self, node, batched, self.rank(node.inputs[0]), where)
        merged = any(node.inputs[i] in self.merged for i in batched)
        for name, axis in zip(node.outputs, axes, strict=False):
            if name and axis is not None:
                self.axis[name] = axis
                if merged and node.op_type != "Reshape":  # a Reshape says itself (shaping._merge)
                    self.merged.add(name)

    def taint(self, node: Node, entry: Operator, where: str) -> None:
        """Outputs whose values depend on the batch size: a shape holding it fed as data, or a tainted input.

        Certain where arithmetic takes it (a mean over the batch's rows divides by it); where another operator does
        (a comparison, an index, a range), the values may not depend on it, and the check at load decides.
        """
        if node.op_type in ("Shape", "Size"):
            return  # a tensor's shape, not its values
        found = [self.tainted[n] for i, n in enumerate(node.inputs) if i not in entry.shapes and n in self.tainted]
        taint = next((t for t in found if t.certain), found[0] if found else None)
        if taint is None:
            fed = [
                n for i, n in enumerate(node.inputs)
                if n and i not in entry.shapes and n in self.sym and has_batch(self.sym[n])
            ]  # fmt: skip
            if fed:
                name = node.name or node.outputs[0]
                taint = Taint(f"{node.op_type} takes the batch size as data, node '{name}'{where}", entry.arithmetic)
        if taint is not None:
            self.tainted.update(dict.fromkeys((n for n in node.outputs if n), taint))

    def symbolic(self, node: Node, entry: Operator) -> bool:
        """Follow a small integer tensor (a shape, a size) through the operators exporters compute shapes with."""
        ins = node.inputs
        if entry.symbolic is None or not ins or not node.outputs or any(n in self.tainted for n in ins):
            return False
        values = [self.sym.get(n) if n else () for n in ins]
        if node.op_type not in ("Shape", "Size"):
            if not any(n in self.sym for n in ins if n):
                return False  # a value that is not a shape or a constant: the walk's business
            for i, name in enumerate(ins):
                if name and name not in self.sym:
                    unknown = self._unknown_value(name)
                    if unknown is None:
                        return False
                    values[i] = unknown
        result = entry.symbolic(self, node, values)
        if result is SKIP:
            return False
        out = node.outputs[0]
        self.sym[out] = result
        if result is not None:
            self.dims[out] = (len(result),)
            known = constants(result)
            if known is not None:
                self.constants[out] = known
        else:
            self.dims[out] = (None,)
        return True

    def _unknown_value(self, name: str) -> Value:
        """A small vector the rule cannot evaluate (read from a tensor, say) joined to shape values, or None.

        Of known length and free of the batch, it holds sizes that do not depend on the batch; anything else is data.
        """
        dims = self.dims.get(name)
        if name in self.axis or name in self.tainted or dims is None or len(dims) > 1:
            return None
        length = dims[0] if dims else 1
        return (FREE,) * length if length is not None and length <= LONGEST else None

    def unbatched(self, node: Node, where: str) -> None:
        """A node no batched tensor reaches: it may make one from a shape holding the batch size."""
        op, ins = node.op_type, node.inputs
        shape_at = {"Expand": 1, "ConstantOfShape": 0, "Tile": 1, "Range": 1}.get(op)
        if shape_at is None or len(ins) <= shape_at or ins[shape_at] not in self.sym:
            return
        shape = self.sym[ins[shape_at]]
        if shape is None:
            self.unsure(node, "takes a shape holding the batch size that is not followed", where)
            return
        if op == "Range":
            if has_batch(shape):
                self.axis[node.outputs[0]] = 0  # one element per row (its index: data, see taint)
            return
        found = [i for i, v in enumerate(shape) if v in (BATCH, BATCH_TIMES)]
        if len(found) == 1:
            rank = self.rank(ins[0]) if op != "ConstantOfShape" else len(shape)
            offset = max(0, (rank or 0) - len(shape)) if op == "Expand" else 0
            self.axis[node.outputs[0]] = found[0] + offset
        elif has_batch(shape):
            self.unsure(node, "takes a shape that depends on the batch size", where)

    def call(self, node: Node, function: Graph, where: str) -> None:
        if self.depth > 8:
            self.unsure(node, "calls functions nested too deep to follow", where)
            return
        child = Flow(self.functions)
        child.coupled, child.undecided, child.depth = self.coupled, self.undecided, self.depth + 1
        for actual, formal in zip(node.inputs, function.inputs, strict=False):
            copy(self, actual, child, formal)
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
            copy(child, formal, self, actual)


def copy(source: Flow, name: str, target: Flow, as_name: str) -> None:
    """What `source` knows of tensor `name`, known to `target` as `as_name` (a function's formal and actual)."""
    if name in source.axis:
        target.axis[as_name] = source.axis[name]
    if name in source.dims:
        target.dims[as_name] = source.dims[name]
    if name in source.sym:
        target.sym[as_name] = source.sym[name]
    if name in source.tainted:
        target.tainted[as_name] = source.tainted[name]


def judge_graph(graph: Graph, batched_inputs: list[str], functions: Mapping[tuple[str, str], Graph]) -> Flow:
    """The walk over `graph` whose `batched_inputs` carry the batch on axis 0; its findings in the result."""
    flow = Flow(functions)
    for name in graph.inputs:
        if name in graph.dims:
            flow.dims[name] = graph.dims[name]
    flow.axis.update(dict.fromkeys(batched_inputs, 0))
    flow.run(graph, "")
    flow.outputs(graph)
    return flow
