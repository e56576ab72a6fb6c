"""Operators over axes: reductions, Softmax and the like, normalisations. Fine unless the axis is the batch's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tritonnx.backend.batch_axis.entry import Operator, entries
from tritonnx.backend.batch_axis.graph import Axes, Dims, Node, resolve
from tritonnx.backend.batch_axis.symbolic import REDUCE

if TYPE_CHECKING:
    from tritonnx.backend.batch_axis.flow import Flow

REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")  # fmt: skip
# Operators over one axis, with its default (Softmax's was 1 before opset 13, -1 since: neither is the batch).
_ONE_AXIS = {
    "Softmax": -1, "LogSoftmax": -1, "Hardmax": -1, "ArgMax": 0, "ArgMin": 0, "TopK": -1, "LpNormalization": -1,
    "CumSum": None,  # its axis is its second input
}  # fmt: skip
_LAYER_NORMS = ("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization")


def same_dims(flow: Flow, node: Node) -> Dims | None:
    return flow.dims.get(node.inputs[0])


def _reduced_dims(flow: Flow, node: Node) -> Dims | None:
    first = flow.dims.get(node.inputs[0])
    axes = node.axes(flow.constants, "axes", 1)
    if first is None or axes is None:
        return None
    resolved = {resolve(a, len(first)) for a in axes} if axes else set(range(len(first)))
    if node.attr("keepdims", 1):
        return tuple(1 if i in resolved else d for i, d in enumerate(first))
    return tuple(d for i, d in enumerate(first) if i not in resolved)


def _one_axis_dims(flow: Flow, node: Node) -> Dims | None:
    first = flow.dims.get(node.inputs[0])
    if first is None:
        return None
    if node.op_type in ("Softmax", "LogSoftmax", "Hardmax", "CumSum", "LpNormalization"):
        return first
    out = (None,) * len(first)
    return out[:-1] if node.op_type in ("ArgMax", "ArgMin") and not node.attr("keepdims", 1) else out


def _reduce(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    axis = batched.get(0)
    keep: Axes = [axis] * len(node.outputs)
    if axis is None:
        return [next(iter(batched.values()))] * len(node.outputs)
    axes = node.axes(flow.constants, "axes", 1)
    if axes is None:
        flow.unsure(node, "takes its axes at run time", where)
        return keep
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return keep
        flow.couple(node, "over every axis, the batch axis too", where)
        return [None]
    resolved = [resolve(a, rank) for a in axes]
    if None in resolved:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
        return keep
    if axis in resolved:
        flow.couple(node, f"over axis {axis}, the batch axis", where)
    if node.attr("keepdims", 1):
        return keep
    return [axis - sum(a < axis for a in resolved if a is not None)]


def _one_axis(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    op, axis = node.op_type, batched.get(0)
    if axis is None:
        return [next(iter(batched.values()))] * len(node.outputs)
    keep: Axes = [axis] * len(node.outputs)
    default = _ONE_AXIS[op]
    if default is None:
        chosen = node.axes(flow.constants, "axis", 1)
        along = chosen[0] if chosen and len(chosen) == 1 else None
        if along is None:
            flow.unsure(node, "takes its axis at run time", where)
            return keep
    else:
        along = node.attr("axis", default)
    resolved = resolve(along, rank)
    if resolved is None:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
    elif resolved == axis:
        flow.couple(node, f"over axis {axis}, the batch axis", where)
    if op in ("ArgMax", "ArgMin") and not node.attr("keepdims", 1) and resolved is not None:
        return [axis - (resolved < axis)]
    return keep


def _layer_norm(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    axis = batched.get(0)
    if axis is None:
        return [next(iter(batched.values()))] * len(node.outputs)
    start = resolve(node.attr("axis", -1), rank)
    if start is None:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
    elif start <= axis:
        flow.couple(node, f"normalises over axes {start} and after, the batch axis {axis} among them", where)
    return [axis] + [None] * (len(node.outputs) - 1)


def _batch_norm(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    data = batched.get(0)
    training = node.attr("training_mode", 0) or len([o for o in node.outputs if o]) > 1
    if data is not None and (data != 1 if training else data == 1):
        why = "in training mode normalises over the batch axis" if training else "scales each row by its channel"
        flow.couple(node, why, where)
    return [data] + [None] * (len(node.outputs) - 1)


def _mean_variance(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    data = batched.get(0)
    axes = [resolve(a, rank) for a in node.ints.get("axes", (0, 2, 3))]
    if None in axes and data is not None:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
    elif data in axes:
        flow.couple(node, f"over axis {data}, the batch axis", where)
    return [next(iter(batched.values()))] * len(node.outputs)


REDUCING: dict[str, Operator] = {
    **entries(REDUCTIONS, axis=_reduce, dims=_reduced_dims, shapes=frozenset({1}), arithmetic=True),
    **entries(
        ("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin"),
        axis=_reduce,
        dims=_reduced_dims,
        symbolic=REDUCE,
        shapes=frozenset({1}),
        arithmetic=True,
    ),  # fmt: skip
    **entries(_ONE_AXIS, axis=_one_axis, dims=_one_axis_dims),
    "TopK": Operator(axis=_one_axis, dims=_one_axis_dims, shapes=frozenset({1})),
    "CumSum": Operator(axis=_one_axis, dims=_one_axis_dims, shapes=frozenset({1}), arithmetic=True),
    **entries(_LAYER_NORMS, axis=_layer_norm, dims=same_dims),
    "BatchNormalization": Operator(axis=_batch_norm, dims=same_dims),
    "MeanVarianceNormalization": Operator(axis=_mean_variance, dims=same_dims),
}
