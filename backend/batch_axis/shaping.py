"""Operators that move axes or make tensors from shapes: Reshape, Flatten, Transpose, Squeeze, Expand and the like.

Their shape inputs are followed symbolically (`symbolic.py`), so that the Shape -> Gather -> Concat -> Reshape that
exporters write to keep the batch first, or to split heads off it, is told apart from rows merged into one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tritonnx.backend.batch_axis.entry import Operator, entries
from tritonnx.backend.batch_axis.graph import Axes, Dims, Node, resolve
from tritonnx.backend.batch_axis.symbolic import (
    BATCH,
    BATCH_DATA,
    BATCH_TIMES,
    CONSTANT_OF_SHAPE,
    EXPAND,
    FIRST,
    RANGE,
    SHAPE,
)

if TYPE_CHECKING:
    from tritonnx.backend.batch_axis.flow import Flow


def _transpose_dims(flow: Flow, node: Node) -> Dims | None:
    first = flow.dims.get(node.inputs[0])
    if first is None:
        return None
    perm = node.ints.get("perm") or tuple(range(len(first)))[::-1]
    return tuple(first[p] for p in perm) if len(perm) == len(first) else None


def _transpose(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    first = next(iter(batched.values()))
    perm = node.ints.get("perm") or (tuple(range(rank))[::-1] if rank is not None else None)
    if perm is None:
        flow.unsure(node, "reverses the axes of a tensor of unknown rank", where)
        return [first]
    return [perm.index(first) if first in perm else None]


def _flatten_dims(flow: Flow, node: Node) -> Dims | None:
    first = flow.dims.get(node.inputs[0])
    if first is None:
        return None
    axis = resolve(node.attr("axis", 1), len(first)) or 0
    head, tail = first[:axis], first[axis:]
    return tuple(math.prod(p) if None not in p else None for p in (head, tail))  # type: ignore[arg-type]


def _flatten(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    first = next(iter(batched.values()))
    axis = resolve(node.attr("axis", 1), rank)
    if axis is None:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
    elif axis <= first:
        flow.couple(node, f"at axis {axis} merges the rows of the batch into one", where)
    elif first != 0:
        flow.unsure(node, f"merges the batch on axis {first} with the axes before it", where)
    return [0 if first == 0 else None]


def _squeeze_dims(flow: Flow, node: Node) -> Dims | None:
    first = flow.dims.get(node.inputs[0])
    axes = node.axes(flow.constants, "axes", 1)
    if first is None or not axes:
        return None
    if node.op_type == "Squeeze":
        removed = {resolve(a, len(first)) for a in axes}
        return tuple(d for i, d in enumerate(first) if i not in removed)
    width = len(first) + len(axes)
    added = {resolve(a, width) for a in axes}
    rest = iter(first)
    return tuple(1 if i in added else next(rest, None) for i in range(width))


def _squeeze(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    axis = next(iter(batched.values()))
    axes = node.axes(flow.constants, "axes", 1)
    if axes is None:
        flow.unsure(node, "takes its axes at run time", where)
        return [axis]
    if not axes:
        if node.op_type == "Squeeze":
            flow.unsure(node, "with no axes drops the batch axis of a batch of one", where)
        return [axis]
    if node.op_type == "Unsqueeze":
        added = [resolve(a, rank + len(axes) if rank is not None else None) for a in axes]
        if None in added:
            flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
            return [axis]
        for position in sorted(a for a in added if a is not None):
            axis += position <= axis
        return [axis]
    removed = [resolve(a, rank) for a in axes]
    if None in removed:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
        return [axis]
    if axis in removed:
        flow.unsure(node, "squeezes the batch axis away, as only a batch of one allows", where)
        return [None]
    return [axis - sum(a < axis for a in removed if a is not None)]


def _reshape_dims(flow: Flow, node: Node) -> Dims | None:
    target = flow.sym.get(node.input(1)) if node.input(1) in flow.sym else None
    return tuple(v if isinstance(v, int) and v > 0 else None for v in target) if target is not None else None


def _reshape(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    axis = batched.get(0)
    if axis is None:
        return [next(iter(batched.values()))]
    if node.inputs[1] not in flow.sym:
        flow.unsure(node, "takes a shape computed at run time", where)
        return [axis]
    target = flow.sym[node.inputs[1]]
    if target is None:
        flow.unsure(node, "takes a shape holding the batch size that is not followed", where)
        return [axis]
    if axis != 0:
        # The batch moved off the first axis (attention's (length, batch, ...) layout): one place keeps it.
        found = [i for i, v in enumerate(target) if v in (BATCH, BATCH_TIMES)]
        if len(found) == 1:
            _merge(flow, node, target[found[0]])
            return [found[0]]
        flow.unsure(node, f"reshapes a tensor whose batch is on axis {axis}", where)
        return [None]
    head = target[0] if target else None
    moved = [i for i, v in enumerate(target) if v in (BATCH, BATCH_TIMES)]
    if head not in (BATCH, BATCH_TIMES, 0) and len(moved) == 1:
        # Attention's out-projection works on (length * batch, hidden) rows, then splits the batch out again.
        if node.inputs[0] in flow.merged or not all(v == 1 for v in target[: moved[0]]):
            flow.unsure(node, f"to {list(target)} splits the batch out of axis 0, merged there with other dims", where)
        return [moved[0]]
    if head in (BATCH, BATCH_TIMES, 0):
        if any(v == BATCH_DATA for v in target):
            flow.unsure(node, "takes a shape that depends on the batch size", where)
        _merge(flow, node, head if head != 0 else BATCH_TIMES if node.inputs[0] in flow.merged else BATCH)
        return [0]
    dims = flow.dims.get(node.inputs[0])
    row = math.prod(dims[1:]) if dims is not None and None not in dims[1:] else None  # type: ignore[arg-type]
    rest = target[1:]
    if head == -1 and all(isinstance(v, int) and v > 0 for v in rest):
        wanted = math.prod(v for v in rest if isinstance(v, int))
        if row == wanted:
            return [0]
        if row is None:
            flow.unsure(node, f"to {list(target)} keeps the rows apart only if each holds {wanted} elements", where)
            return [0]
    if head == -1 and row is None and any(v == -1 or not isinstance(v, int) for v in rest):
        flow.unsure(node, f"to {list(target)} may move the batch off the first axis", where)
        return [0]
    if head == BATCH_DATA or (head == -1 and any(v == BATCH_DATA for v in rest)):
        flow.unsure(node, f"to {list(target)} takes a first dim that depends on the batch size", where)
        return [0]
    flow.couple(node, f"to {list(target)} merges the rows of the batch", where)
    return [0]


def _merge(flow: Flow, node: Node, size: object) -> None:
    """Mark the output whose batch axis holds the batch times other dims (a Reshape's BATCH_TIMES), or clear it."""
    if size == BATCH_TIMES:
        flow.merged.add(node.outputs[0])
    else:
        flow.merged.discard(node.outputs[0])


def _from_shape_dims(flow: Flow, node: Node) -> Dims | None:
    shape = flow.sym.get(node.inputs[-1]) if node.inputs[-1] in flow.sym else None
    if shape is None:
        return None
    first = flow.dims.get(node.inputs[0]) if node.op_type == "Expand" else None
    return (None,) * max(len(shape), len(first) if first is not None else 0)


def _expand(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    data = batched.get(0)
    if data is None:
        return [None]
    return [data + max(0, len(flow.sym.get(node.inputs[1]) or ()) - (rank or 0))]


def _one_hot(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    data = batched.get(0)
    if data is None:
        return [next(iter(batched.values()))]
    added = resolve(node.attr("axis", -1), rank + 1 if rank is not None else None)
    if added is None:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
        return [data]
    return [data + (added <= data)]


def _one_hot_dims(flow: Flow, node: Node) -> Dims | None:
    first = flow.dims.get(node.inputs[0])
    return (None,) * (len(first) + 1) if first is not None else None


def _shape_of_unknown_rank(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    return [None]  # followed as a value in `symbolic`


def _range(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    return [0]  # a count taken from a batched tensor: one element per row


SHAPING: dict[str, Operator] = {
    "Transpose": Operator(axis=_transpose, dims=_transpose_dims),
    "Flatten": Operator(axis=_flatten, dims=_flatten_dims, symbolic=FIRST),
    **entries(("Squeeze", "Unsqueeze"), axis=_squeeze, dims=_squeeze_dims, symbolic=FIRST, shapes=frozenset({1})),
    "Reshape": Operator(axis=_reshape, dims=_reshape_dims, symbolic=FIRST, shapes=frozenset({1})),
    "Expand": Operator(axis=_expand, dims=_from_shape_dims, symbolic=EXPAND, shapes=frozenset({1})),
    "ConstantOfShape": Operator(dims=_from_shape_dims, symbolic=CONSTANT_OF_SHAPE, shapes=frozenset({0})),
    "OneHot": Operator(axis=_one_hot, dims=_one_hot_dims),
    **entries(("Shape", "Size"), axis=_shape_of_unknown_rank, symbolic=SHAPE),
    "Range": Operator(axis=_range, dims=lambda flow, node: (None,), symbolic=RANGE),
}
