"""Small integer tensors followed symbolically: shapes, sizes and the arithmetic exporters build shapes with.

An element is a constant, BATCH (the batch size itself), BATCH_TIMES (the batch size times a number that does not
depend on it), FREE (not known, independent of the batch) or BATCH_DATA (depends on the batch size otherwise). A
value of None is a shape that holds the batch but is not followed element by element. Each evaluator takes the
values of the node's inputs and gives its output's, or SKIP where the node is not a shape computation (the walk then
treats it as data).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tritonnx.backend.batch_axis.graph import HUGE, Node, resolve

if TYPE_CHECKING:
    from tritonnx.backend.batch_axis.flow import Flow

Sym = int | str
Value = tuple[Sym, ...] | None
BATCH, BATCH_TIMES, FREE, BATCH_DATA = "N", "N*", "?", "N?"
SKIP = ("skip",)  # not evaluated: the node is data to the walk
LONGEST = 64  # a computed vector longer than this (a Range, a ConstantOfShape) is data, not a shape
Evaluator = Callable[["Flow", Node, list[Value]], Value]


def has_batch(values: Value) -> bool:
    return values is None or any(isinstance(v, str) and v.startswith(BATCH) for v in values)


def _batched(value: Sym) -> bool:
    return isinstance(value, str) and value.startswith(BATCH)


def _widen(values: tuple[Sym, ...], width: int) -> tuple[Sym, ...]:
    return values * width if len(values) == 1 else values


_INTEGER: dict[str, Callable[[int, int], int | None]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": lambda a, b: int(a / b) if b else None,
    "Mod": lambda a, b: a % b if b else None,
    "Max": max,
    "Min": min,
    "Equal": lambda a, b: int(a == b),
    "Less": lambda a, b: int(a < b),
    "Greater": lambda a, b: int(a > b),
    "LessOrEqual": lambda a, b: int(a <= b),
    "GreaterOrEqual": lambda a, b: int(a >= b),
    "And": lambda a, b: int(bool(a) and bool(b)),
    "Or": lambda a, b: int(bool(a) or bool(b)),
    "Pow": lambda a, b: a**b if b >= 0 else None,
}


def combine(op: str, a: Sym, b: Sym) -> Sym:
    """One element of a binary operator on shape values."""
    if isinstance(a, int) and isinstance(b, int):
        result = _INTEGER[op](a, b)
        return FREE if result is None else int(result)
    batched = [v for v in (a, b) if _batched(v)]
    if not batched:
        return FREE
    sizes = [v for v in (a, b) if isinstance(v, int)]
    # A size is never negative: exporters compare with -1 (and build -1s with Mul) before an Expand or a Reshape.
    if sizes and sizes[0] < 0:
        if op == "Equal":
            return 0
        if op in ("Greater", "GreaterOrEqual"):
            return int(b == sizes[0])
        if op in ("Less", "LessOrEqual"):
            return int(a == sizes[0])
        if op == "Max":
            return batched[0]
    if op == "Mul" and len(batched) == 1 and batched[0] in (BATCH, BATCH_TIMES) and sizes != [0]:
        return BATCH_TIMES
    if op in ("Max", "Min") and a == b:
        return a
    return BATCH_DATA


def _first(flow: Flow, node: Node, values: list[Value]) -> Value:
    return values[0]


def _shape(flow: Flow, node: Node, values: list[Value]) -> Value:
    source = node.inputs[0]
    dims = flow.dims.get(source)
    axis = flow.axis.get(source)
    if node.op_type == "Size":
        return (BATCH_TIMES if axis is not None else FREE,)
    if dims is None:
        return None if axis is not None else (FREE,)  # its length unknown: only its head is relied on
    whole: list[Sym] = [d if d is not None else FREE for d in dims]
    if axis is not None:
        whole[axis] = BATCH_TIMES if source in flow.merged else BATCH
    rank = len(dims)
    start = resolve(node.attr("start", 0), rank) or 0
    end = resolve(node.ints.get("end", (rank,))[0], rank)
    return tuple(whole[start:end])


def _concat(flow: Flow, node: Node, values: list[Value]) -> Value:
    parts = [v for v in values if v is not None]
    return tuple(e for v in parts for e in v) if len(parts) == len(values) else None


def _gather(flow: Flow, node: Node, values: list[Value]) -> Value:
    first = values[0]
    index = flow.constants.get(node.input(1))
    if first is None or index is None or not all(-len(first) <= i < len(first) for i in index):
        return SKIP
    return tuple(first[i] for i in index)


def _slice(flow: Flow, node: Node, values: list[Value]) -> Value:
    first = values[0]
    starts, ends = flow.constants.get(node.input(1)), flow.constants.get(node.input(2))
    steps = flow.ints_of(node, 4) or (1,)
    if first is None or starts is None or ends is None or len(starts) != 1:
        return SKIP
    return first[starts[0] : min(ends[0], HUGE) : steps[0]]


def _reduce(flow: Flow, node: Node, values: list[Value]) -> Value:
    first = values[0]
    if first is None or node.op_type != "ReduceProd" and has_batch(first):
        return SKIP
    if all(isinstance(v, int) for v in first):
        total = {"ReduceProd": math.prod, "ReduceSum": sum, "ReduceMax": max, "ReduceMin": min}[node.op_type]
        return (int(total(first)),) if first else SKIP  # type: ignore[operator]
    return (BATCH_TIMES if has_batch(first) else FREE,)


def _binary(flow: Flow, node: Node, values: list[Value]) -> Value:
    if len(values) != 2:
        return SKIP
    a, b = values
    if a is None or b is None or not (len(a) == len(b) or 1 in (len(a), len(b))):
        return None
    width = max(len(a), len(b))
    return tuple(combine(node.op_type, x, y) for x, y in zip(_widen(a, width), _widen(b, width), strict=True))


def _unary(flow: Flow, node: Node, values: list[Value]) -> Value:
    first = values[0]
    if first is None:
        return None
    op = node.op_type
    known = {"Neg": lambda v: -v, "Abs": abs, "Not": lambda v: int(not v), "Sign": lambda v: (v > 0) - (v < 0)}
    if op in known:
        return tuple(known[op](v) if isinstance(v, int) else (BATCH_DATA if _batched(v) else FREE) for v in first)
    return first  # Floor, Ceil, Round of integers


def _where(flow: Flow, node: Node, values: list[Value]) -> Value:
    given = [v for v in values if v is not None]
    width = max((len(v) for v in given), default=0)
    if len(given) != 3 or not all(len(v) in (1, width) for v in given):
        return None
    cond, a, b = (_widen(v, width) for v in given)
    return tuple(
        (x if c else y) if isinstance(c, int) else x if x == y else BATCH_DATA if _batched(x) or _batched(y) else FREE
        for c, x, y in zip(cond, a, b, strict=True)
    )


def _constant_of_shape(flow: Flow, node: Node, values: list[Value]) -> Value:
    shape = values[0]
    if shape is None or len(shape) != 1 or not isinstance(shape[0], int) or shape[0] > LONGEST:
        return SKIP  # a tensor of the batch's length, or longer than a shape: data
    fill: Sym = node.ints["value"][0] if "value" in node.ints else FREE if node.value_dims is not None else 0
    return (fill,) * shape[0]


def _expand(flow: Flow, node: Node, values: list[Value]) -> Value:
    first, shape = values
    if first is None or shape is None or len(shape) != 1 or not isinstance(shape[0], int):
        return SKIP
    if len(first) in (1, shape[0]) and shape[0] <= LONGEST:
        return _widen(first, shape[0]) if shape[0] > 1 else first
    return SKIP


def _range(flow: Flow, node: Node, values: list[Value]) -> Value:
    parts = [v[0] if v is not None and len(v) == 1 else None for v in values]
    if len(parts) != 3 or not all(isinstance(p, int) for p in parts):
        return SKIP  # over the batch size: the index of each row, data
    start, limit, delta = parts
    count = max(0, math.ceil((limit - start) / delta)) if delta else LONGEST + 1  # type: ignore[operator]
    return tuple(range(start, limit, delta)) if count <= LONGEST else SKIP  # type: ignore[arg-type]


def constants(values: Sequence[Sym]) -> tuple[int, ...] | None:
    """The value as plain integers, where every element is known."""
    return tuple(values) if all(isinstance(v, int) for v in values) else None  # type: ignore[arg-type]


SHAPE = _shape
FIRST = _first
CONCAT = _concat
GATHER = _gather
SLICE = _slice
REDUCE = _reduce
BINARY = _binary
UNARY = _unary
WHERE = _where
CONSTANT_OF_SHAPE = _constant_of_shape
EXPAND = _expand
RANGE = _range
