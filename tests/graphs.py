"""ONNX graphs more than one tier builds: a dynamically quantized encoder and a batch-centring graph, whose rows are
not independent, a small convolutional classifier to quantize, and a graph of a custom operator library's string op."""

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


def small_classifier(path: Path, seed: int = 0) -> Path:
    """image FP32 [n, 3, 16, 16] -> Conv 3x3 (8) -> Relu -> Conv 3x3 (8) -> Relu -> global average pool -> Gemm ->
    scores FP32 [n, 10]: a convolutional classifier small enough to quantize (statically) in a second."""
    rng = np.random.default_rng(seed)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.5, "conv1"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "bias1"),
        numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.3, "conv2"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "bias2"),
        numpy_helper.from_array(rng.standard_normal((8, 10)).astype(np.float32), "fc"),
        numpy_helper.from_array(rng.standard_normal(10).astype(np.float32) * 0.1, "fc_bias"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv1", "bias1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "conv2", "bias2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc", "fc_bias"], ["scores"]),
    ]
    graph = helper.make_graph(
        nodes,
        "small_classifier",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["n", 3, 16, 16])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 10])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


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
