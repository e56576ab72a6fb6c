"""Operators that pick, write, cut or join by position: Gather, Scatter, Slice, Pad, Tile, Concat, Split, Compress."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tritonnx.backend.batch_axis.entry import Operator, entries
from tritonnx.backend.batch_axis.graph import HUGE, Axes, Dims, Ints, Node, resolve
from tritonnx.backend.batch_axis.symbolic import BATCH, CONCAT, GATHER, SLICE, Sym

if TYPE_CHECKING:
    from tritonnx.backend.batch_axis.flow import Flow


def _rank_kept(flow: Flow, node: Node) -> Dims | None:
    given = (
        [flow.dims.get(n) for n in node.inputs if n] if node.op_type == "Concat" else [flow.dims.get(node.inputs[0])]
    )
    first = next((d for d in given if d is not None), None)
    return (None,) * len(first) if first is not None else None


def _gather_dims(flow: Flow, node: Node) -> Dims | None:
    first, indices = flow.dims.get(node.inputs[0]), flow.dims.get(node.input(1))
    if first is None or indices is None or node.op_type != "Gather":
        return None
    axis = resolve(node.attr("axis", 0), len(first)) or 0
    return first[:axis] + indices + first[axis + 1 :]


def _gather(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    op, data, indices = node.op_type, batched.get(0), batched.get(1)
    if op == "GatherND":
        dims = node.attr("batch_dims", 0)
        if data is not None and data >= dims:
            flow.couple(node, "picks rows of the batch by index", where)
        if data is not None:
            return [data]
        index_rank = flow.rank(node.inputs[1])
        return [indices if index_rank is not None and indices is not None and indices < index_rank - 1 else None]
    axis = resolve(node.attr("axis", 0), rank)
    if axis is None:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
        return [data if data is not None else indices]
    if data is not None and data == axis:
        flow.couple(node, "picking rows of the batch", where)
        return [indices if op == "GatherElements" else None]
    if op == "GatherElements":
        return [data if data is not None else indices]
    if data is not None and indices is not None:
        flow.couple(node, "indexes a batch with a batched tensor along another axis", where)
    if data is None:
        return [axis + indices if indices is not None else None]
    index_rank = flow.rank(node.inputs[1])
    if data < axis:
        return [data]
    if index_rank is None:
        flow.unsure(node, "takes indices of unknown rank", where)
    return [data - 1 + index_rank if index_rank is not None else None]


def _scatter(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    data = batched.get(0)
    if data is None:
        flow.couple(node, "writes the rows of a batch into one tensor", where)
        return [None]
    if node.op_type == "ScatterND":
        flow.couple(node, "writes at indices that start with the batch axis", where)
        return [data]
    axis = resolve(node.attr("axis", 0), rank)
    if axis is None:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
    elif axis == data:
        flow.couple(node, "writes across the rows of the batch", where)
    elif len(batched) < 3:
        flow.couple(node, "writes the same indices or updates into every row", where)
    return [data]


def _concat(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    axes = set(batched.values())
    along = resolve(node.attr("axis", 0), rank)
    if along is None:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
    elif along in axes:
        flow.couple(node, "joins tensors along the batch axis", where)
    if len(axes) > 1:
        flow.unsure(node, "joins batches on different axes", where)
    return [min(axes)]


def _split(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    op, data = node.op_type, batched.get(0)
    if data is not None:
        along = resolve(node.attr("axis", 0), rank)
        if op == "Compress" and "axis" not in node.ints:
            flow.couple(node, "flattens the batch", where)
        elif along is None:
            flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
        elif along == data:
            flow.couple(node, f"{'picks' if op == 'Compress' else 'cuts'} rows of the batch", where)
    return [data] * len(node.outputs)


def _tile(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    data = batched.get(0)
    if data is not None:
        repeats = flow.sym.get(node.inputs[1])
        if repeats is None or data >= len(repeats):
            flow.unsure(node, "takes its repeats at run time", where)
        elif repeats[data] != 1:
            flow.couple(node, "repeats rows of the batch", where)
    return [data]


def _pad(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    data = batched.get(0)
    if data is None:
        return [None]
    pads = node.ints.get("pads") or flow.ints_of(node, 1)
    pad_axes = flow.ints_of(node, 3) if node.input(3) else None
    if pads is None or (node.input(3) and pad_axes is None):
        if not _pads_spare_the_batch(flow, node, data):
            flow.unsure(node, "takes its pads at run time", where)
        return [data]
    order = [resolve(a, rank) for a in pad_axes] if pad_axes is not None else list(range(len(pads) // 2))
    if None in order:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
    elif data in order:
        at = order.index(data)
        if pads[at] or pads[at + len(order)]:
            flow.couple(node, "adds rows to the batch", where)
    return [data]


def _pads_spare_the_batch(flow: Flow, node: Node, data: int) -> bool:
    """Pads computed at run time whose two entries for the batch axis are known zeros (Swin pads its windows so)."""
    pads = flow.sym.get(node.input(1))
    if pads is None or node.input(3) or len(pads) % 2:
        return False
    half = len(pads) // 2
    return data < half and pads[data] == 0 and pads[data + half] == 0


def _slice(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    axis = batched.get(0)
    if axis is None:
        return [None]
    axes: Ints | None
    starts: Ints | None
    steps: Ints | None
    if "starts" in node.ints:  # before opset 10: attributes
        starts, ends = node.ints["starts"], node.ints.get("ends")
        axes, steps = node.ints.get("axes"), None
        sym_ends: tuple[Sym, ...] | None = ends
    else:
        starts, ends = flow.ints_of(node, 1), flow.ints_of(node, 2)
        axes = flow.ints_of(node, 3) if node.input(3) else None
        steps = flow.ints_of(node, 4) if node.input(4) else None
        sym_ends = flow.sym.get(node.inputs[2]) if ends is None else ends
        if any(node.input(p) and flow.ints_of(node, p) is None for p in (3, 4)):
            flow.unsure(node, "takes its axes or steps at run time", where)
            return [axis]
    count = len(starts) if starts is not None else len(sym_ends) if sym_ends is not None else None
    if axes is None and count is None:
        flow.unsure(node, "slices axes not known until run time", where)
        return [axis]
    order = [resolve(a, rank) for a in axes] if axes is not None else list(range(count or 0))
    if None in order:
        flow.unsure(node, "has a negative axis of a tensor of unknown rank", where)
        return [axis]
    if axis not in order:
        return [axis]
    at = order.index(axis)
    if steps is not None and steps[at] < 0:
        flow.couple(node, "reverses the rows of the batch", where)
        return [axis]
    end = sym_ends[at] if sym_ends is not None and at < len(sym_ends) else None
    if starts is None or end is None:
        flow.unsure(node, "slices the batch axis at run time", where)
    elif starts[at] != 0 or not (end == BATCH or (isinstance(end, int) and end >= HUGE)):
        flow.couple(node, "keeps only some rows of the batch", where)
    elif steps is not None and steps[at] != 1:
        flow.couple(node, "skips rows of the batch", where)
    return [axis]


def _lists_values(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    flow.couple(node, "lists values across the whole batch", where)
    return [None] * len(node.outputs)


INDEXING: dict[str, Operator] = {
    "Gather": Operator(axis=_gather, dims=_gather_dims, symbolic=GATHER),
    **entries(("GatherElements", "GatherND"), axis=_gather),
    **entries(("ScatterND", "ScatterElements", "Scatter"), axis=_scatter),
    "Concat": Operator(axis=_concat, dims=_rank_kept, symbolic=CONCAT),
    **entries(("Split", "Compress"), axis=_split, dims=_rank_kept, shapes=frozenset({1})),
    "Tile": Operator(axis=_tile, dims=_rank_kept, shapes=frozenset({1})),
    "Pad": Operator(axis=_pad, dims=_rank_kept, shapes=frozenset({1, 3})),
    "Slice": Operator(axis=_slice, dims=_rank_kept, symbolic=SLICE, shapes=frozenset({1, 2, 3, 4})),
    **entries(("NonZero", "Unique"), axis=_lists_values),
}
