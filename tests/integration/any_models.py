"""Small ONNX graphs unlike the demo models, each a corner of what "any ONNX model" means.

Every builder returns a model; `write_repository` gives each a policy-only `config.pbtxt` (or the
one named here) and the stock `model.py`, as a user adding the file would.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime_extensions import get_library_path

from tritonnx.server.repository import add_model

POLICY = 'backend: "python"\ninstance_group [ { kind: KIND_CPU, count: 1 } ]\n'
# onnxruntime-extensions' library, named in a config by its file name alone: the server needs its folder on
# LD_LIBRARY_PATH.
EXTENSIONS_LIBRARY = Path(get_library_path())
# tritonserver's flags for the repository: a backend setting written with a space, as tritonserver's docs write it.
SERVER_ARGS = ["--backend-config", "onnxruntime,default-max-batch-size=6"]

# Every ONNX element type Triton's Python backend carries, with its numpy dtype.
CARRIED_TYPES = {
    "bool": (TensorProto.BOOL, np.bool_),
    "int8": (TensorProto.INT8, np.int8),
    "int16": (TensorProto.INT16, np.int16),
    "int32": (TensorProto.INT32, np.int32),
    "int64": (TensorProto.INT64, np.int64),
    "uint8": (TensorProto.UINT8, np.uint8),
    "uint16": (TensorProto.UINT16, np.uint16),
    "uint32": (TensorProto.UINT32, np.uint32),
    "uint64": (TensorProto.UINT64, np.uint64),
    "fp16": (TensorProto.FLOAT16, np.float16),
    "fp32": (TensorProto.FLOAT, np.float32),
    "fp64": (TensorProto.DOUBLE, np.float64),
    "string": (TensorProto.STRING, np.object_),
}


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def value(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


# A real kernel where ONNX Runtime has one for the type; the rest pass through Identity.
_OPS = {"bool": "Not", "int32": "Neg", "int64": "Neg", "fp16": "Neg", "fp32": "Neg", "fp64": "Neg"}


def every_type() -> onnx.ModelProto:
    """One input and output per carried type, each [n, 2] (n dynamic: the model batches)."""
    nodes, inputs, outputs = [], [], []
    for name, (elem, _) in CARRIED_TYPES.items():
        inputs.append(value(f"x_{name}", elem, ["n", 2]))
        outputs.append(value(f"y_{name}", elem, ["n", 2]))
        nodes.append(helper.make_node(_OPS.get(name, "Identity"), [f"x_{name}"], [f"y_{name}"]))
    return _model(nodes, inputs, outputs)


def not_batched() -> onnx.ModelProto:
    """[3, 4, 5] in and out, fixed: the model cannot batch, and its first dim is its own."""
    return _model(
        [helper.make_node("Neg", ["x"], ["y"])],
        [value("x", TensorProto.FLOAT, [3, 4, 5])],
        [value("y", TensorProto.FLOAT, [3, 4, 5])],
    )


def first_dim_not_batch() -> onnx.ModelProto:
    """A dynamic first dim that is no batch dim: the sum runs over it (config says max_batch_size: 0)."""
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    node = helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=1)
    return _model(
        [node], [value("x", TensorProto.FLOAT, ["rows", 4])], [value("total", TensorProto.FLOAT, ["one", 4])], [axes]
    )


def scalars() -> onnx.ModelProto:
    """Rank-0 in and out: y = x * k + 1 over FP64, and the count of an INT64 vector's elements."""
    one = numpy_helper.from_array(np.array(1.0), "one")
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["xk"]),
        helper.make_node("Add", ["xk", "one"], ["y"]),
        helper.make_node("Size", ["v"], ["count"]),
    ]
    return _model(
        nodes,
        [value("x", TensorProto.DOUBLE, []), value("k", TensorProto.DOUBLE, []), value("v", TensorProto.INT64, ["n"])],
        [value("y", TensorProto.DOUBLE, []), value("count", TensorProto.INT64, [])],
        [one],
    )


def zero_dims() -> onnx.ModelProto:
    """An `axes` input fixed at shape [0] (reduce over nothing) and a data input that may be empty."""
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1, noop_with_empty_axes=1)
    return _model(
        [node, helper.make_node("Abs", ["x"], ["absolute"])],
        [value("x", TensorProto.FLOAT, ["n", 3]), value("axes", TensorProto.INT64, [0])],
        [value("y", TensorProto.FLOAT, ["n", 3]), value("absolute", TensorProto.FLOAT, ["n", 3])],
        opset=18,
    )


def divides() -> onnx.ModelProto:
    """y = x * MIN / (x - 2) over INT64: ones as warm-up divide the smallest int64 by -1, a SIGFPE in the stub."""
    smallest = numpy_helper.from_array(np.array(np.iinfo(np.int64).min, np.int64), "smallest")
    two = numpy_helper.from_array(np.array(2, np.int64), "two")
    nodes = [
        helper.make_node("Mul", ["x", "smallest"], ["n"]),
        helper.make_node("Sub", ["x", "two"], ["d"]),
        helper.make_node("Div", ["n", "d"], ["y"]),
    ]
    return _model(nodes, [value("x", TensorProto.INT64, [2])], [value("y", TensorProto.INT64, [2])], [smallest, two])


def with_default() -> onnx.ModelProto:
    """y = x + bias, where `bias` is an input with a default (an initializer): optional."""
    bias = numpy_helper.from_array(np.array([10.0, 20.0], np.float32), "bias")
    return _model(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        [value("x", TensorProto.FLOAT, [2]), value("bias", TensorProto.FLOAT, [2])],
        [value("y", TensorProto.FLOAT, [2])],
        [bias],
    )


def data_dependent() -> onnx.ModelProto:
    """Outputs of different shapes, two of them set by the data: NonZero and TopK with a runtime k,
    and `x` itself returned as an output too."""
    nodes = [
        helper.make_node("NonZero", ["x"], ["where"]),
        helper.make_node("TopK", ["x", "k"], ["top_values", "top_indices"], axis=-1),
        helper.make_node("ReduceMax", ["x"], ["peak"], keepdims=0),
    ]
    return _model(
        nodes,
        [value("x", TensorProto.FLOAT, [2, 6]), value("k", TensorProto.INT64, [1])],
        [
            value("where", TensorProto.INT64, [2, "nonzero"]),
            value("top_values", TensorProto.FLOAT, [2, "k"]),
            value("top_indices", TensorProto.INT64, [2, "k"]),
            value("peak", TensorProto.FLOAT, []),
            value("x", TensorProto.FLOAT, [2, 6]),
        ],
    )


def sequence_input() -> onnx.ModelProto:
    """A sequence-of-tensors input: Triton has no such type, so the model must be refused."""
    seq = helper.make_tensor_sequence_value_info("items", TensorProto.FLOAT, None)
    return _model(
        [helper.make_node("SequenceLength", ["items"], ["count"])], [seq], [value("count", TensorProto.INT64, [])]
    )


def bfloat16() -> onnx.ModelProto:
    """A BF16 input: Triton 2.51's Python backend cannot hand BF16 to numpy, so it is refused."""
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)
    return _model([node], [value("x", TensorProto.BFLOAT16, [2])], [value("y", TensorProto.FLOAT, [2])])


def external_weights() -> onnx.ModelProto:
    """y = x @ w with w (64 x 8, FP32) meant to be saved beside the graph as external data."""
    weight = numpy_helper.from_array(np.random.default_rng(3).standard_normal((64, 8)).astype(np.float32), "w")
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [value("x", TensorProto.FLOAT, ["batch", 64])],
        [value("y", TensorProto.FLOAT, ["batch", 8])],
        [weight],
    )


def unknown_rank() -> onnx.ModelProto:
    """y = 2x and z = w, where x, y and z have no shape in the graph (unknown rank) and w is FP32 [2, 3].

    ONNX's checker wants a shape on every graph input and output; ONNX Runtime loads the graph without one.
    """
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"]), helper.make_node("Identity", ["w"], ["z"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x", TensorProto.FLOAT, None), value("w", TensorProto.FLOAT, [2, 3])],
        [value("y", TensorProto.FLOAT, None), value("z", TensorProto.FLOAT, None)],
        [two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def string_not_utf8() -> onnx.ModelProto:
    """word = ["ok", bytes 0xff 0xfe][i]: a string output that is UTF-8 for i = 0 and not for i = 1."""
    words = helper.make_tensor("words", TensorProto.STRING, [2], [b"ok", b"\xff\xfe"])
    return _model(
        [helper.make_node("Gather", ["words", "i"], ["word"], axis=0)],
        [value("i", TensorProto.INT64, [1])],
        [value("word", TensorProto.STRING, [1])],
        [words],
    )


def upper() -> onnx.ModelProto:
    """text BYTES [n] -> upper BYTES [n] by onnxruntime-extensions' StringUpper (a custom operator library's op)."""
    graph = helper.make_graph(
        [helper.make_node("StringUpper", ["text"], ["upper"], domain="ai.onnx.contrib")],
        "upper",
        [value("text", TensorProto.STRING, ["n"])],
        [value("upper", TensorProto.STRING, ["n"])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    return model


def negate() -> onnx.ModelProto:
    """y = -x over FP32 [n, 4]: a graph that batches."""
    return _model(
        [helper.make_node("Neg", ["x"], ["y"])],
        [value("x", TensorProto.FLOAT, ["n", 4])],
        [value("y", TensorProto.FLOAT, ["n", 4])],
    )


# What a tutorial's config keeps after its KIND_GPU is switched to KIND_CPU: ignored there, as by the native backend.
GPU_SETTINGS = (
    'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] } }\n'
    'parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }\n'
)

# name -> (builder, config.pbtxt); models that must fail to load are listed in REFUSED.
MODELS: dict[str, tuple[Callable[[], onnx.ModelProto], str]] = {
    "every_type": (every_type, POLICY),
    "every_type_unbatched": (every_type, POLICY + "max_batch_size: 0\n"),
    "not_batched": (not_batched, POLICY),
    "first_dim_not_batch": (first_dim_not_batch, POLICY + "max_batch_size: 0\n"),
    "scalars": (scalars, POLICY),
    "zero_dims": (zero_dims, POLICY),
    "divides": (divides, POLICY),
    "divides_no_warm_up": (divides, POLICY + 'parameters { key: "warm_up" value: { string_value: "0" } }\n'),
    "with_default": (with_default, POLICY),
    "data_dependent": (data_dependent, POLICY),
    "external_weights": (external_weights, POLICY + "max_batch_size: 8\n"),
    "sequence_input": (sequence_input, POLICY),
    "bfloat16": (bfloat16, POLICY),
    "unknown_rank": (unknown_rank, POLICY),
    "string_not_utf8": (string_not_utf8, POLICY),
    "custom_op_by_soname": (
        upper,
        POLICY + f'model_operations {{ op_library_filename: "{EXTENSIONS_LIBRARY.name}" }}\n',
    ),
    "space_form_backend_config": (negate, 'platform: "onnxruntime_onnx"\n'),
    "gpu_settings_on_cpu": (negate, POLICY + GPU_SETTINGS),
    "gpu_instances": (negate, 'backend: "python"\ninstance_group [ { kind: KIND_GPU, count: 1 } ]\n'),
}
REFUSED = {
    "sequence_input": "input 'items' is a sequence, not a tensor: Triton carries tensors only",
    "bfloat16": "input 'x' is a tensor(bfloat16) tensor: Triton 2.51's Python backend cannot hand BF16 tensors to numpy",
    # Triton's core, before the backend: this machine has no GPU.
    "gpu_instances": "has kind KIND_GPU but no GPUs are available",
}


def write_repository(directory: Path) -> dict[str, Path]:
    """Every model of MODELS under `directory`; returns each model's .onnx file."""
    files = {}
    for name, (build, config) in MODELS.items():
        version = add_model(directory, name, config)
        model = build()
        if name == "external_weights":
            onnx.save(
                model,
                version / "model.onnx",
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location="model.onnx.data",
                size_threshold=0,
            )
        else:
            onnx.save(model, version / "model.onnx")
        files[name] = version / "model.onnx"
    return files
