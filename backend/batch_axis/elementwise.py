"""Element-wise operators: every output element from the elements at its place, inputs broadcast to one shape."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tritonnx.backend.batch_axis.entry import Operator, entries
from tritonnx.backend.batch_axis.graph import Axes, Dims, Node, resolve
from tritonnx.backend.batch_axis.symbolic import BINARY, FIRST, UNARY, WHERE

if TYPE_CHECKING:
    from tritonnx.backend.batch_axis.flow import Flow

# The batch size taken as data by these may only build a mask or a shape (a comparison, a choice): not certain.
_LOGICAL = ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Not", "Where", "IsNaN",
            "IsInf")  # fmt: skip
_ARITHMETIC = (
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Mean", "Sum", "PRelu", "BitShift", "BitwiseAnd",
    "BitwiseOr", "BitwiseXor", "BitwiseNot", "Clip", "QuantizeLinear", "DequantizeLinear", "BiasAdd", "BiasGelu",
    "FastGelu", "Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round",
    "Sign", "Erf", "Cast", "CastLike", "Identity", "Dropout", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid",
    "HardSwish", "Gelu", "QuickGelu", "Mish", "Softplus", "Softsign", "ThresholdedRelu", "Sin", "Cos", "Tan", "Asin",
    "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Shrink",
)  # fmt: skip
_BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Mod", "Less", "Greater", "LessOrEqual",
           "GreaterOrEqual", "And", "Or", "Pow")  # fmt: skip
_UNARY = ("Neg", "Abs", "Not", "Sign", "Floor", "Ceil", "Round")
DYNAMIC_QUANTIZERS = frozenset({"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"})


def broadcast_dims(flow: Flow, node: Node) -> Dims | None:
    given = [flow.dims.get(n) for n in node.inputs if n]
    if any(d is None for d in given):
        return None
    width = max((len(d) for d in given if d is not None), default=0)
    padded = [(1,) * (width - len(d)) + d for d in given if d is not None]
    return tuple(
        next((v for v in column if v not in (1, None)), None if None in column else 1)
        for column in zip(*padded, strict=True)
    )


def elementwise(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    ranks = [flow.rank(n) if n else 0 for n in node.inputs]
    if None in ranks:
        axes = set(batched.values())
        if len(axes) > 1:
            flow.unsure(node, "meets batches on different axes", where)
        return [min(axes)] * len(node.outputs)
    out = max(r for r in ranks if r is not None)
    aligned = {a + out - ranks[i] for i, a in batched.items()}  # type: ignore[operator]
    if len(aligned) > 1:
        flow.couple(node, "pairs the rows of one batch with those of another axis", where)
    axis = min(aligned)
    for i, name in enumerate(node.inputs):
        dims = flow.dims.get(name) if name else None
        at = axis - (out - len(dims)) if dims is not None else -1
        if i not in batched and dims is not None and at >= 0 and dims[at] not in (1, None):
            flow.couple(node, f"gives each row of the batch another element of '{name}'", where)
    if node.op_type in ("QuantizeLinear", "DequantizeLinear") and batched.get(0) is not None:
        scale = flow.dims.get(node.inputs[1]) if len(node.inputs) > 1 else None
        per_axis = resolve(node.attr("axis", 1), ranks[0])
        if scale and scale != (1,) and per_axis == batched[0]:
            flow.couple(node, "scales each row of the batch by another element", where)
    return [axis] * len(node.outputs)


def _dynamic_quantizer(flow: Flow, node: Node, batched: dict[int, int], rank: int | None, where: str) -> Axes:
    if 0 in batched:
        flow.couple(node, "quantizes its input with one scale over the whole batch", where)
    return [None] * len(node.outputs)


def _quantized_dims(flow: Flow, node: Node) -> Dims | None:
    flow.dims.update({name: () for name in node.outputs[1:] if name})  # the scale and zero point
    return flow.dims.get(node.inputs[0])


def _symbolic(op: str) -> object:
    if op in ("Identity", "Cast", "CastLike"):
        return FIRST
    if op in _BINARY:
        return BINARY
    return UNARY if op in _UNARY else WHERE if op == "Where" else None


ELEMENTWISE: dict[str, Operator] = {
    **{
        op: Operator(axis=elementwise, dims=broadcast_dims, symbolic=_symbolic(op), arithmetic=op in _ARITHMETIC)  # type: ignore[arg-type]
        for op in _ARITHMETIC + _LOGICAL
    },
    **entries(DYNAMIC_QUANTIZERS, axis=_dynamic_quantizer),
    "DynamicQuantizeLinear": Operator(axis=_dynamic_quantizer, dims=_quantized_dims),
}
