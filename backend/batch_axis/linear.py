"""MatMul, Gemm and Einsum: fine while the batch is on an axis they keep, coupled where they contract it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tritonnx.backend.batch_axis.entry import Operator, entries
from tritonnx.backend.batch_axis.graph import Axes, Dims, Node

if TYPE_CHECKING:
    from tritonnx.backend.batch_axis.flow import Flow

_MATMULS = ("MatMul", "MatMulInteger", "QLinearMatMul", "MatMulNBits", "MatMulIntegerToFloat")


def _matmul_dims(flow: Flow, node: Node) -> Dims | None:
    a, b = flow.dims.get(node.inputs[0]), flow.dims.get(node.input(1))
    if a is None or b is None:
        return None
    return (None,) * (max(len(a), len(b), 2) - (len(a) == 1) - (len(b) == 1))


def _matmul(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    a_at, b_at = 0, 3 if node.op_type == "QLinearMatMul" else 1
    ranks = (flow.rank(node.inputs[a_at]), flow.rank(node.input(b_at)) if node.input(b_at) else None)
    if None in ranks:
        flow.unsure(node, "multiplies tensors of unknown rank", where)
        return [next(iter(batched.values()))]
    ra, rb = (r or 0 for r in ranks)
    out = max(ra, rb, 2) - (ra == 1) - (rb == 1)
    found: set[int] = set()
    for position, r, contracted, kept in ((a_at, ra, ra - 1, ra - 2), (b_at, rb, max(rb - 2, 0), rb - 1)):
        axis = batched.get(position)
        if axis is None:
            continue
        if axis == contracted:
            flow.couple(node, f"contracts axis {axis}, the batch axis, of input '{node.inputs[position]}'", where)
        elif axis == kept:
            found.add(out - 2 if position == a_at else out - 1)
        else:
            found.add(axis + out - r)
    if len(found) > 1:
        flow.couple(node, "pairs the rows of one batch with those of another", where)
    return [min(found) if found else None]


def _gemm(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    contracted = {0: 0 if node.attr("transA", 0) else 1, 1: 1 if node.attr("transB", 0) else 0}
    found: set[int] = set()
    for position, axis in batched.items():
        if position == 2:
            found.add(axis)
        elif axis == contracted[position]:
            flow.couple(node, f"contracts axis {axis}, the batch axis, of input '{node.inputs[position]}'", where)
        else:
            found.add(position)
    if len(found) > 1:
        flow.couple(node, "pairs the rows of one batch with those of another", where)
    return [min(found) if found else None]


def _einsum(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
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
                flow.unsure(node, "has its batch axis inside an ellipsis", where)
                return [axis]
        elif axis < len(term):
            batch_letters.add(term[axis])
    if len(batch_letters) > 1:
        flow.couple(node, "pairs the rows of one batch with those of another", where)
    for letter in batch_letters:
        if letter not in output:
            flow.couple(node, f"sums over '{letter}', the batch axis", where)
            return [None]
    letter = min(batch_letters)
    if letter == "...":
        return [0]
    if "..." in output and output.index("...") < output.index(letter):
        flow.unsure(node, "puts the batch axis after an ellipsis", where)
        return [None]
    return [output.index(letter)]


LINEAR: dict[str, Operator] = {
    **entries(_MATMULS, axis=_matmul, arithmetic=True),
    **entries(("MatMul", "MatMulInteger"), axis=_matmul, dims=_matmul_dims, arithmetic=True),
    "Gemm": Operator(axis=_gemm, dims=lambda flow, node: (None, None), arithmetic=True),
    "Einsum": Operator(axis=_einsum, arithmetic=True),
}
