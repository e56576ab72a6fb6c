"""ONNX graphs more than one tier builds: a dynamically quantized encoder and a batch-centring graph, whose rows are
not independent, and a graph of a custom operator library's string op."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LOUD_ID = 99  # its embedding is 50x the others: a request holding it moves the quantization scale of its batch


def quantized_encoder(directory: Path) -> Path:
    """ids INT64 [n, s] -> embedding -> MatMul -> Relu -> MatMul -> mean over s -> logits FP32 [n, 2], quantized by
    onnxruntime.quantization.quantize_dynamic as transformers are: its DynamicQuantizeLinear takes one scale over the
    whole batch, so a row's answer depends on its batch mates."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    embedding = rng.standard_normal((100, 16)).astype(np.float32)
    embedding[LOUD_ID] *= 50
    initializers = [
        numpy_helper.from_array(embedding, "embedding"),
        numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((32, 2)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Gather", ["embedding", "ids"], ["embedded"]),
        helper.make_node("MatMul", ["embedded", "w1"], ["hidden"]),
        helper.make_node("Relu", ["hidden"], ["active"]),
        helper.make_node("MatMul", ["active", "w2"], ["per_token"]),
        helper.make_node("ReduceMean", ["per_token", "axes"], ["logits"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "encoder",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", "s"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 2])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(model, directory / "float.onnx")
    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic suggests pre-processing on the root logger
    quantize_dynamic(directory / "float.onnx", directory / "model.onnx", weight_type=QuantType.QInt8)
    return directory / "model.onnx"


def string_upper(path: Path) -> Path:
    """text BYTES [n] -> upper BYTES [n] with onnxruntime-extensions' StringUpper: a custom operator library's op, which
    ONNX Runtime runs only with the library registered (its path: onnxruntime_extensions.get_library_path())."""
    node = helper.make_node("StringUpper", ["text"], ["upper"], domain="ai.onnx.contrib")
    graph = helper.make_graph(
        [node],
        "upper",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("upper", TensorProto.STRING, ["n"])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def batch_centred() -> onnx.ModelProto:
    """y = x - mean of x over axis 0: x FP32 [n, 3] -> y FP32 [n, 3]. Every dim is dynamic, as a batching model's are,
    yet each row's answer depends on the rows batched with it."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "centred",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 9
    return model
