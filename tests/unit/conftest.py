"""Small ONNX graphs built in the test session, and a stand-in for Triton's stub utilities."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper


def _save(graph: onnx.GraphProto, path: Path, opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@pytest.fixture(scope="session")
def double_onnx(tmp_path_factory) -> Path:
    """y = 2 * x, x FP32 [batch, 4]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double", [x], [y], [two])
    return _save(graph, tmp_path_factory.mktemp("double") / "model.onnx")


@pytest.fixture(scope="session")
def masked_sum_onnx(tmp_path_factory) -> Path:
    """total = sum(ids * mask) over the sequence and length = sum(mask): padding-invariant."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])
    mask = helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "sequence"])
    total = helper.make_tensor_value_info("total", TensorProto.INT64, ["batch", 1])
    length = helper.make_tensor_value_info("length", TensorProto.INT64, ["batch", 1])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Mul", ["ids", "mask"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axes"], ["total"], keepdims=1),
        helper.make_node("ReduceSum", ["mask", "axes"], ["length"], keepdims=1),
    ]
    graph = helper.make_graph(nodes, "masked_sum", [ids, mask], [total, length], [axes])
    return _save(graph, tmp_path_factory.mktemp("masked_sum") / "model.onnx")


def _real_utils_path() -> Path:
    spec = importlib.util.find_spec("pytriton")
    assert spec is not None and spec.origin is not None, "nvidia-pytriton must be installed (make venv)"
    return Path(spec.origin).parent / "tritonserver" / "backends" / "python" / "triton_python_backend_utils.py"


class FakeTensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class FakeRequest:
    def __init__(self, **arrays: np.ndarray) -> None:
        self._inputs = [FakeTensor(name, array) for name, array in arrays.items()]

    def inputs(self) -> list[FakeTensor]:
        return self._inputs


class FakeResponse:
    def __init__(self, output_tensors, error=None) -> None:
        self.output_tensors, self.error = output_tensors, error

    def outputs(self) -> dict[str, np.ndarray]:
        return {t.name(): t.as_numpy() for t in self.output_tensors}


class FakeTritonError(Exception):
    INTERNAL, INVALID_ARG = "INTERNAL", "INVALID_ARG"

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        super().__init__(message)
        self.code = code

    def message(self) -> str:
        return str(self)


class FakeLogger:
    lines: list[str] = []

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.lines.append(message)

    log_warn = log_error = log_info


@pytest.fixture
def pb_utils(monkeypatch):
    """Triton's real `triton_python_backend_utils.py` (ModelConfig and auto-complete checks are
    pure Python), plus fakes of the types the stub injects from C++."""
    spec = importlib.util.spec_from_file_location("triton_python_backend_utils", _real_utils_path())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.Tensor, module.InferenceRequest, module.InferenceResponse = FakeTensor, FakeRequest, FakeResponse
    module.TritonError, module.TritonModelException, module.Logger = FakeTritonError, RuntimeError, FakeLogger
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", module)
    monkeypatch.delitem(sys.modules, "tritonnx.backend.triton_model", raising=False)
    return module


@pytest.fixture(autouse=True)
def ort_cache_dir(tmp_path, monkeypatch) -> Path:
    """Optimized model copies of a test go to its own directory, not the user's cache."""
    directory = tmp_path / "ort-cache"
    monkeypatch.setenv("TRITONNX_ORT_CACHE_DIR", str(directory))
    return directory


def save_graph(path: Path, nodes, inputs, outputs, initializers=(), opset: int = 17) -> Path:
    """Write a one-graph model built with onnx.helper (checked first) to `path`."""
    return _save(helper.make_graph(nodes, path.stem, inputs, outputs, list(initializers)), path, opset)


@pytest.fixture(scope="session")
def sequence_onnx(tmp_path_factory) -> Path:
    """y = x + START, x FP32 [batch, 4], START FP32 [batch, 1]: a graph that takes a sequence control input."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    start = helper.make_tensor_value_info("START", TensorProto.FLOAT, ["batch", 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "START"], ["y"])], "sequence", [x, start], [y])
    return _save(graph, tmp_path_factory.mktemp("sequence") / "model.onnx")
