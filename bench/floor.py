"""The serving floor: what Triton, the Python backend and this project's model code cost with no model compute.

A "floor" copy of a model has the same inputs and outputs, filled with zeros, and is served with the model's own
`config.pbtxt` and `model.py`: every step a real request takes runs, and ONNX Runtime's work shrinks to reading a
shape. The served latency minus the floor is what the model itself costs in the stub.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from bench.cpu import perf_analyzer_with_cpu
from tritonnx.server.repository import add_model
from tritonnx.server.stack import ServingStack


def floor_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """Same inputs and outputs as `model`, every output zeros: its free first dim the batch, its other free dims 1."""
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    inputs = [value for value in graph.input if value.name not in initializers]
    nodes = [
        helper.make_node("Shape", [inputs[0].name], ["floor_input_shape"]),
        helper.make_node("Slice", ["floor_input_shape", "floor_zero", "floor_one"], ["floor_batch"]),
    ]
    constants = [
        helper.make_tensor(f"floor_{name}", TensorProto.INT64, [1], [value])
        for name, value in (("zero", 0), ("one", 1))
    ]
    for index, output in enumerate(graph.output):
        dims = output.type.tensor_type.shape.dim
        rest = [d.dim_value if d.HasField("dim_value") else 1 for d in dims[1:]]
        shape = f"floor_shape_{index}"
        if dims and not dims[0].HasField("dim_value"):
            constants.append(helper.make_tensor(f"floor_rest_{index}", TensorProto.INT64, [len(rest)], rest))
            nodes.append(helper.make_node("Concat", ["floor_batch", f"floor_rest_{index}"], [shape], axis=0))
        else:
            fixed = [d.dim_value if d.HasField("dim_value") else 1 for d in dims]
            constants.append(helper.make_tensor(shape, TensorProto.INT64, [len(fixed)], fixed))
        zero = helper.make_tensor("value", output.type.tensor_type.elem_type, [1], [0])
        nodes.append(helper.make_node("ConstantOfShape", [shape], [output.name], value=zero))
    floor = helper.make_graph(nodes, f"{graph.name}_floor", inputs, list(graph.output), initializer=constants)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    return helper.make_model(floor, opset_imports=[helper.make_opsetid("", opset)], ir_version=model.ir_version)


def floor_repository(model: str, repository: Path, workdir: Path) -> Path:
    """`workdir/floor-repo` holding `model` with its own config and model.py, and the floor graph."""
    source = repository / model
    # The floor is not the model: it leaves no optimized copy in the model's cache, where it would
    # take the place of the model's own (tritonnx.backend.session_cache keeps two copies per model name).
    config = (source / "config.pbtxt").read_text()
    config += '\nparameters { key: "optimized_model_cache" value: { string_value: "0" } }\n'
    version = add_model(workdir / "floor-repo", model, config, source / "1" / "model.py")
    onnx.save(floor_graph(onnx.load(source / "1" / "model.onnx", load_external_data=False)), version / "model.onnx")
    return workdir / "floor-repo"


def measure_floor(
    model: str, repository: Path, workdir: Path, concurrencies: list[int], measurement_ms: int, cores: int
) -> list[dict]:
    """perf_analyzer at each concurrency against the floor copy of `model`, with the CPU per image."""
    with ServingStack(
        floor_repository(model, repository, workdir), workdir / f"{model}-floor", with_facade=False
    ) as stack:
        return [perf_analyzer_with_cpu(stack.triton, model, c, measurement_ms, cores) for c in concurrencies]
