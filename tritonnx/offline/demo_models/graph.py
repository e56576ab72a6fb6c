"""A small builder for ONNX graphs with seeded random weights.

The demo models are written op by op with `onnx.helper`; this class keeps the bookkeeping
(unique names, initializers, weight initialisation) out of the architecture code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# ONNX 1.19 stamps IR 12 by default, newer than some runtimes accept; IR 9 covers opset 17 and is
# read by every onnxruntime since 1.15.
IR_VERSION = 9

Dim = int | str  # a str is a symbolic dimension (dim_param)
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64


class GraphBuilder:
    """Accumulates nodes, initializers and graph inputs/outputs, then emits a checked model."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self._nodes: list[onnx.NodeProto] = []
        self._initializers: list[onnx.TensorProto] = []
        self._inputs: list[onnx.ValueInfoProto] = []
        self._outputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()
        self._constants: dict[tuple[str, tuple[int, ...], bytes], str] = {}

    def unique(self, base: str) -> str:
        """Return `base`, or `base_N` if taken; node, tensor and initializer names share a pool."""
        name, n = base, 1
        while name in self._names:
            name, n = f"{base}_{n}", n + 1
        self._names.add(name)
        return name

    # --- graph interface -------------------------------------------------------------------------

    def add_input(self, name: str, elem_type: int, shape: Sequence[Dim]) -> str:
        """Declare a graph input; `name` must be free since clients address it verbatim."""
        if name in self._names:
            raise ValueError(f"name {name!r} already used")
        self._names.add(name)
        self._inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def add_output(self, tensor: str, name: str, elem_type: int, shape: Sequence[Dim]) -> None:
        """Expose `tensor` as graph output `name` by renaming it (no Identity node needed)."""
        if name in self._names:
            raise ValueError(f"name {name!r} already used")
        self._names.add(name)
        for node in self._nodes:
            for io in (node.input, node.output):
                for i, value in enumerate(io):
                    if value == tensor:
                        io[i] = name
        self._outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))

    def initializer(self, name: str, array: np.ndarray) -> str:
        """Store `array` as an initializer under a unique variant of `name`."""
        name = self.unique(name)
        self._initializers.append(numpy_helper.from_array(array, name))
        return name

    def constant(self, value: float | Sequence[int], dtype: type = np.int64) -> str:
        """A small constant (shape, axes, scalar) as an initializer; equal constants share one."""
        array: np.ndarray = np.array(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            self._constants[key] = self.initializer("const", array)
        return self._constants[key]

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        """Seeded float32 samples of N(0, std^2)."""
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def node(self, op_type: str, inputs: Sequence[str], name: str | None = None, **attrs: Any) -> str:
        """Append a single-output node; its output tensor carries the node's (unique) name."""
        name = self.unique(name or op_type)
        self._nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attrs))
        return name

    def build(self, graph_name: str) -> onnx.ModelProto:
        """Assemble the model, infer intermediate shapes and validate it with the ONNX checker."""
        graph = helper.make_graph(self._nodes, graph_name, self._inputs, self._outputs, self._initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            ir_version=IR_VERSION,
            producer_name="tritonnx.demo_models",
        )
        onnx.checker.check_model(model, full_check=True)
        return model

    # --- layers ----------------------------------------------------------------------------------

    def conv(
        self,
        x: str,
        in_ch: int,
        out_ch: int,
        kernel: int,
        name: str,
        stride: int = 1,
        groups: int = 1,
        bias: bool = False,
    ) -> str:
        """Conv padded by (k-1)//2 as in torchvision, with He-normal (fan-in) weights."""
        fan_in = in_ch // groups * kernel * kernel
        w = self.normal((out_ch, in_ch // groups, kernel, kernel), np.sqrt(2.0 / fan_in))
        inputs = [x, self.initializer(f"{name}.weight", w)]
        if bias:
            inputs.append(self.initializer(f"{name}.bias", np.zeros(out_ch, np.float32)))
        pad = (kernel - 1) // 2
        return self.node(
            "Conv",
            inputs,
            name,
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            group=groups,
        )

    def batch_norm(self, x: str, channels: int, name: str, gamma: float = 1.0, eps: float = 1e-5) -> str:
        """Inference-mode BatchNormalization with near-identity statistics.

        Random weights leave nothing for BN to normalise, so `gamma` is the knob callers use to
        keep activations in range; all four vectors are jittered so the layer is not a no-op.
        """
        scale = gamma * self.rng.uniform(0.8, 1.2, channels).astype(np.float32)
        var = self.rng.uniform(0.8, 1.2, channels).astype(np.float32)
        inputs = [
            x,
            self.initializer(f"{name}.weight", scale),
            self.initializer(f"{name}.bias", self.normal((channels,), 0.05)),
            self.initializer(f"{name}.running_mean", self.normal((channels,), 0.05)),
            self.initializer(f"{name}.running_var", var),
        ]
        return self.node("BatchNormalization", inputs, name, epsilon=eps)

    def activation(self, x: str, kind: str | None, name: str) -> str:
        """Apply "relu", "hardswish" or nothing (None)."""
        if kind is None:
            return x
        op = {"relu": "Relu", "hardswish": "HardSwish"}[kind]
        return self.node(op, [x], name)

    def conv_bn(
        self,
        x: str,
        in_ch: int,
        out_ch: int,
        kernel: int,
        name: str,
        bn_name: str,
        stride: int = 1,
        groups: int = 1,
        act: str | None = "relu",
        gamma: float = 1.0,
        eps: float = 1e-5,
    ) -> str:
        """Bias-free conv, BatchNormalization, then an optional activation."""
        y = self.conv(x, in_ch, out_ch, kernel, name, stride=stride, groups=groups)
        y = self.batch_norm(y, out_ch, bn_name, gamma=gamma, eps=eps)
        return self.activation(y, act, f"{name}.act")

    def linear(self, x: str, in_features: int, out_features: int, name: str) -> str:
        """Y = x @ W + b over the last axis (any rank); LeCun-normal W keeps unit variance."""
        w = self.normal((in_features, out_features), 1.0 / np.sqrt(in_features))
        y = self.node("MatMul", [x, self.initializer(f"{name}.weight", w)], f"{name}.matmul")
        b = self.initializer(f"{name}.bias", self.normal((out_features,), 0.02))
        return self.node("Add", [y, b], name)

    def layer_norm(self, x: str, features: int, name: str, eps: float = 1e-5) -> str:
        """LayerNormalization over the last axis with unit scale and zero shift."""
        scale = self.initializer(f"{name}.weight", np.ones(features, np.float32))
        shift = self.initializer(f"{name}.bias", np.zeros(features, np.float32))
        return self.node("LayerNormalization", [x, scale, shift], name, axis=-1, epsilon=eps)

    def global_pool_flatten(self, x: str, name: str) -> str:
        """[N, C, H, W] -> [N, C] by global average pooling."""
        y = self.node("GlobalAveragePool", [x], name)
        return self.node("Flatten", [y], f"{name}.flatten", axis=1)


def count_parameters(model: onnx.ModelProto) -> int:
    """Parameter count: initializer elements except BatchNormalization running statistics.

    This matches `sum(p.numel() for p in module.parameters())` in PyTorch, where the running
    mean/var are buffers; tiny shape/axis constants are counted too (a handful of elements).
    """
    running_stats = {
        name for node in model.graph.node if node.op_type == "BatchNormalization" for name in node.input[3:5]
    }
    return sum(
        int(np.prod(init.dims, dtype=np.int64)) for init in model.graph.initializer if init.name not in running_stats
    )
