"""If, Loop and Scan: the batch axis followed into their bodies and out again."""

from __future__ import annotations

from tritonnx.backend.batch_axis.flow import Flow
from tritonnx.backend.batch_axis.graph import Graph, Node, resolve
from tritonnx.backend.batch_axis.symbolic import has_batch


def control_flow(flow: Flow, node: Node, where: str) -> None:
    op, name = node.op_type, node.name or node.outputs[0]
    inner = f" in {op} '{name}'{where}"
    if op == "If":
        _if(flow, node, inner, where)
    elif op == "Loop":
        _loop(flow, node, next(iter(node.graphs.values())), inner, where)
    elif op == "Scan":
        _scan(flow, node, next(iter(node.graphs.values())), inner, where)
    else:
        flow.unsure(node, "has subgraphs the rule does not follow", where)


def _if(flow: Flow, node: Node, inner: str, where: str) -> None:
    condition = node.input(0)
    taint = flow.tainted.get(condition)
    if condition in flow.axis or (taint is not None and taint.certain):
        flow.couple(node, "chooses its branch by a value that depends on the batch", where)
    elif taint is not None:
        flow.unsure(node, f"chooses its branch by a value that may depend on the batch ({taint.origin})", where)
    found: dict[int, set[int | None]] = {}
    for branch in node.graphs.values():
        child = flow.child()
        child.run(branch, inner)
        for i, out in enumerate(branch.outputs):
            found.setdefault(i, set()).add(child.axis.get(out))
            if out in child.tainted and i < len(node.outputs):
                flow.tainted[node.outputs[i]] = child.tainted[out]
    for i, axes in found.items():
        axis = next(iter(axes)) if len(axes) == 1 else min(a for a in axes if a is not None)
        if len(axes) > 1:
            flow.unsure(node, "has branches whose outputs carry the batch differently", where)
        if axis is not None and i < len(node.outputs):
            flow.axis[node.outputs[i]] = axis


def _loop(flow: Flow, node: Node, body: Graph, inner: str, where: str) -> None:
    if any(n in flow.tainted or (n in flow.sym and has_batch(flow.sym[n])) for n in node.inputs[:2] if n):
        flow.couple(node, "runs a number of iterations that depends on the batch", where)
    carried = len(node.inputs) - 2
    axes: list[int | None] = [flow.axis.get(n) for n in node.inputs[2:]]
    child = flow
    for _ in range(2):  # a value carried round may take the batch on the first iteration
        child = flow.child()
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
            flow.tainted[node.outputs[i]] = child.tainted[out]
        if axis is not None:
            flow.axis[node.outputs[i]] = axis + (i >= carried)  # scan outputs are stacked on a new axis 0


def _scan(flow: Flow, node: Node, body: Graph, inner: str, where: str) -> None:
    scanned = node.attr("num_scan_inputs", 0)
    states = len(node.inputs) - scanned
    input_axes = node.ints.get("scan_input_axes", (0,) * scanned)
    output_axes = node.ints.get("scan_output_axes", (0,) * (len(node.outputs) - states))
    child = flow.child()
    for i, (actual, formal) in enumerate(zip(node.inputs, body.inputs, strict=False)):
        axis = flow.axis.get(actual)
        if axis is None:
            continue
        if i >= states:
            along = resolve(input_axes[i - states], flow.rank(actual))
            if along is None or along == axis:
                flow.couple(node, f"iterates over axis {axis}, the batch axis", where)
                continue
            axis -= along < axis
        child.axis[formal] = axis
    child.run(body, inner)
    for i, out in enumerate(body.outputs):
        if i >= len(node.outputs):
            break
        if out in child.tainted:
            flow.tainted[node.outputs[i]] = child.tainted[out]
        axis = child.axis.get(out)
        if axis is not None and i >= states:
            axis += resolve(output_axes[i - states], None) is not None and output_axes[i - states] <= axis
        if axis is not None:
            flow.axis[node.outputs[i]] = axis
