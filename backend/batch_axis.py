"""Which nodes of a graph mix the rows of a batch: the batch axis followed from the inputs to every operator.

Triton's batcher stacks requests along the first axis, and each request should get what it would get alone. A
graph breaks that when an operator reduces or normalises over the batch axis (a sum or softmax over axis 0, a
MeanVarianceNormalization at its default axes, an ArgMax left at its default axis 0), or picks rows of the batch (a Gather over
it). The batch axis starts at 0 on every input with a dynamic first dim and is followed through the graph: moved by
Transpose, Unsqueeze, Squeeze and reductions that drop axes, dropped by Shape and Size (their outputs describe a
tensor, they hold no rows), kept by everything else (element-wise ops, convolutions, Reshape, which exporters
write to keep the batch first). Axes given as a non-constant input, or as a negative index (the rank is not
followed), are not judged: the rule names what it can show, never guesses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Ints = tuple[int, ...]

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
_NO_ROWS = frozenset({"Shape", "Size", "NonZero", "Range", "ConstantOfShape", "If", "Loop", "Scan"})


@dataclass(frozen=True)
class Node:
    """An operator as the graph writes it: its inputs and outputs by name, its integer attributes."""

    op_type: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ints: Mapping[str, Ints] = field(default_factory=dict)  # `i` and `ints` attributes, and small int tensors

    def axes(self, constants: Mapping[str, Ints], attribute: str, position: int) -> Ints | None:
        """An axes argument: the attribute (older opsets) or the constant input at `position` (newer ones)."""
        if attribute in self.ints:
            return self.ints[attribute]
        if len(self.inputs) > position and self.inputs[position]:
            return constants.get(self.inputs[position])
        return ()


def coupled_nodes(nodes: Iterable[Node], batched_inputs: Iterable[str], constants: Mapping[str, Ints]) -> list[str]:
    """What in the graph makes a row's answer depend on other rows: one phrase per node, in graph order."""
    batch = dict.fromkeys(batched_inputs, 0)  # tensor name -> the axis its batch is on
    found = []
    for node in nodes:
        data = batch.get(node.inputs[0]) if node.inputs else None
        if data is not None:
            why = _mixes_rows(node, data, constants)
            if why:
                found.append(f"{node.op_type} {why} (node '{node.name or node.outputs[0]}')")
        axis = _axis_after(node, batch, constants)
        if axis is not None:
            batch.update(dict.fromkeys(node.outputs, axis))
    return found


def _mixes_rows(node: Node, axis: int, constants: Mapping[str, Ints]) -> str | None:
    op = node.op_type
    on_batch = f"over axis {axis}, the batch axis"
    if op in REDUCTIONS:
        axes = node.axes(constants, "axes", 1)
        if axes is None:
            return None
        if not axes:
            return None if node.ints.get("noop_with_empty_axes", (0,))[0] else "over every axis, the batch axis too"
        return on_batch if axis in axes else None
    if op in _ONE_AXIS:
        default = _ONE_AXIS[op]
        if default is None:
            chosen = node.axes(constants, "axis", 1)
            along = chosen[0] if chosen and len(chosen) == 1 else None
        else:
            along = node.ints.get("axis", (default,))[0]
        return on_batch if along == axis else None
    if op == "MeanVarianceNormalization":
        return on_batch if axis in node.ints.get("axes", (0, 2, 3)) else None
    if op == "Gather" and node.ints.get("axis", (0,))[0] == axis:
        return "picking rows of the batch"
    return None


def _axis_after(node: Node, batch: Mapping[str, int], constants: Mapping[str, Ints]) -> int | None:
    """The batch axis of the node's outputs, or None when they hold no batch (or it is lost track of)."""
    op = node.op_type
    if op in _NO_ROWS:
        return None
    if op == "Gather":
        # Rows of a table looked up by batched indices: the indices' axes replace the table's gathered axis.
        data, indices = (batch.get(name) for name in (*node.inputs, "", "")[:2])
        gathered = node.ints.get("axis", (0,))[0]
        if data is None and indices is not None and gathered >= 0:
            return gathered + indices
        return data if data is not None and data < gathered else None
    axis = next((batch[name] for name in node.inputs if name in batch), None)
    if axis is None:
        return None
    if op == "Transpose":
        perm = node.ints.get("perm")
        return perm.index(axis) if perm and axis in perm else None
    if op == "Unsqueeze":
        added = node.axes(constants, "axes", 1)
        if not added or min(added) < 0:
            return None
        for position in sorted(added):
            axis += position <= axis
        return axis
    if op == "Squeeze" or (op in REDUCTIONS and not node.ints.get("keepdims", (1,))[0]):
        removed = node.axes(constants, "axes", 1)
        every = op in REDUCTIONS and not removed and not node.ints.get("noop_with_empty_axes", (0,))[0]
        if removed is None or every or axis in removed:
            return None
        return axis - sum(0 <= a < axis for a in removed)
    return axis
