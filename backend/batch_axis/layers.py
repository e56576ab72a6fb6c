"""Operators over each sample of their first axis (convolutions, pools, per-sample norms) and recurrences."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tritonnx.backend.batch_axis.entry import Operator, entries
from tritonnx.backend.batch_axis.graph import Axes, Dims, Node
from tritonnx.backend.batch_axis.reducing import same_dims

if TYPE_CHECKING:
    from tritonnx.backend.batch_axis.flow import Flow

# They mix whatever lies on the other axes of a sample (images, sequences), never two samples.
_PER_SAMPLE = (
    "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
    "GlobalMaxPool", "GlobalLpPool", "DepthToSpace", "SpaceToDepth", "Resize", "Upsample", "EmbedLayerNormalization",
    "Attention", "MultiHeadAttention",
)  # fmt: skip
_PER_SAMPLE_SAME_SHAPE = ("InstanceNormalization", "GroupNormalization", "LRN")


def _rank_kept(flow: Flow, node: Node) -> Dims | None:
    first = flow.dims.get(node.inputs[0])
    return (None,) * len(first) if first is not None else None


def _per_sample(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    data = batched.get(0)
    if data is not None and data != 0:
        flow.couple(
            node, f"works across axis {data}, where the batch is (it holds one sample per row of axis 0)", where
        )
    return [data] * len(node.outputs)


def _recurrent(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    axis = batched.get(0)
    batch_first = bool(node.attr("layout", 0))
    if axis is not None and axis != (0 if batch_first else 1):
        flow.couple(node, f"runs its recurrence over axis {axis}, the batch axis", where)
    return [0, 0, 0] if batch_first else [2, 1, 1]


LAYERS: dict[str, Operator] = {
    **entries(_PER_SAMPLE, axis=_per_sample, dims=_rank_kept, arithmetic=True),
    **entries(("Resize", "Upsample"), axis=_per_sample, dims=_rank_kept, shapes=frozenset({1, 2, 3})),
    **entries(_PER_SAMPLE_SAME_SHAPE, axis=_per_sample, dims=same_dims, arithmetic=True),
    **entries(("RNN", "GRU", "LSTM"), axis=_recurrent, arithmetic=True),
    "Trilu": Operator(dims=same_dims),  # known for its dims only: the check at load judges it
}
