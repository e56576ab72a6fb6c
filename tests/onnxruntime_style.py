"""A model repository written for Triton's onnxruntime backend: no model.py in it, configs as Triton's documentation
and tutorials write them (`platform: "onnxruntime_onnx"`, `backend: "onnxruntime"`, none at all,
`default_model_filename`, inputs spelled out with `reshape` and labels, every dim written with no max_batch_size,
sequence batching's controls), plus `backend: "tritonnx"`, the name that picks tritonnx where NVIDIA's native
onnxruntime backend is installed. The integration tests serve it as `make serve` does, the container tests in
tritonnx:cpu and tritonnx:ngc.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from onnxruntime_extensions import get_library_path

from tests.graphs import LOUD_ID, batch_centred, quantized_encoder, string_upper
from tests.integration.any_models import _model, value
from tests.kserve import assert_close, make_inputs, reference_session
from tests.serving import MODEL_REPOSITORY

TUTORIAL = (
    'platform: "onnxruntime_onnx"\n'
    'input [{ name: "input", data_type: TYPE_FP32, dims: [-1, 3, 224, 224] }]\n'
    'output [{ name: "output", data_type: TYPE_FP32, dims: [-1, 1000] }]\n'
)
EXPLICIT = (
    'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    'input [{ name: "x", data_type: TYPE_FP32, dims: [3] }]\noutput [{ name: "y", data_type: TYPE_FP32, dims: [3] }]\n'
)
# model -> (config.pbtxt, or None for none at all; the graph's file name in the version folder)
REPOSITORY = {
    "platform": ('platform: "onnxruntime_onnx"\nmax_batch_size: 8\n', "model.onnx"),
    "backend": ('backend: "onnxruntime"\n', "model.onnx"),  # batching decided from the graph
    "no_config": (None, "model.onnx"),
    # tritonnx's own `nice` too: its instance runs at a lower CPU priority (a model beside its latency lane).
    "named_tritonnx": (
        'backend: "tritonnx"\nmax_batch_size: 4\nparameters { key: "nice" value: { string_value: "5" } }\n'
        "dynamic_batching { priority_levels: 2 default_priority_level: 2 }\n",
        "model.onnx",
    ),
    "own_file_name": ('platform: "onnxruntime_onnx"\ndefault_model_filename: "model.int8.onnx"\n', "model.int8.onnx"),
    "not_batched": ('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n', "model.onnx"),
    # As Triton's tutorials write a classifier: inputs and outputs spelled out, a reshape, labels.
    "labelled": (
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [{ name: "x", data_type: TYPE_FP32, dims: [1, 3], reshape: { shape: [3] } }]\n'
        'output [{ name: "y", data_type: TYPE_FP32, dims: [3], label_filename: "labels.txt" }]\n',
        "model.onnx",
    ),
    "mobilenet": ('platform: "onnxruntime_onnx"\nmax_batch_size: 8\n', "model.onnx"),  # a real network
    "quantized": ('platform: "onnxruntime_onnx"\n', "model.onnx"),  # rows not independent: tests/graphs.py
    "centred": ('platform: "onnxruntime_onnx"\n', "model.onnx"),  # a mean over the batch axis: tests/graphs.py
    # A stateful model's way in Triton: the sequence batcher fills START and CORRID in every request.
    "sequence": (
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\nsequence_batching {\n  control_input [\n'
        '    { name: "START" control [{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }] },\n'
        '    { name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }] }\n  ]\n}\n',
        "model.onnx",
    ),
    # Strings through a custom operator library's op (onnxruntime-extensions' StringUpper).
    "custom_op": (
        f'platform: "onnxruntime_onnx"\nmax_batch_size: 8\nmodel_operations {{ op_library_filename: "{get_library_path()}" }}\n',
        "model.onnx",
    ),
    # Triton's tutorials' style: every dim written, the batch dim included, and no max_batch_size. Nothing is
    # auto-completed: max_batch_size 0, each request's tensors handed whole to the graph.
    "tutorial": (TUTORIAL, "model.onnx"),
    # max_batch_size with explicit dims and no scheduler: nothing is auto-completed, Triton's default scheduler.
    "explicit": (EXPLICIT, "model.onnx"),
}
# Models that are the real mobilenet_v3_small of the demo repository.
REAL_NETWORKS = frozenset({"mobilenet", "tutorial"})


def sequence_step() -> onnx.ModelProto:
    """y = x + 10 * START, and the sequence's id: x FP32 [n, 3], START FP32 [n, 1], CORRID UINT64 [n, 1]."""
    nodes = [
        helper.make_node("Mul", ["START", "ten"], ["started"]),
        helper.make_node("Add", ["x", "started"], ["y"]),
        helper.make_node("Identity", ["CORRID"], ["sequence"]),
    ]
    inputs = [value("x", TensorProto.FLOAT, ["n", 3]), value("START", TensorProto.FLOAT, ["n", 1]),
              value("CORRID", TensorProto.UINT64, ["n", 1])]  # fmt: skip
    outputs = [value("y", TensorProto.FLOAT, ["n", 3]), value("sequence", TensorProto.UINT64, ["n", 1])]
    return _model(nodes, inputs, outputs, [helper.make_tensor("ten", TensorProto.FLOAT, [], [10.0])])


def scaled_relu(scale: float) -> onnx.ModelProto:
    """y = relu(x * scale) + 1, x FP32 [n, 3]: exact in any batch."""
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["scaled"]),
        helper.make_node("Relu", ["scaled"], ["relu"]),
        helper.make_node("Add", ["relu", "one"], ["y"]),
    ]
    initializers = [
        helper.make_tensor("scale", TensorProto.FLOAT, [], [scale]),
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
    ]
    return _model(
        nodes, [value("x", TensorProto.FLOAT, ["n", 3])], [value("y", TensorProto.FLOAT, ["n", 3])], initializers
    )


def write_repository(
    repository: Path, names: Iterable[str] = tuple(REPOSITORY), backend: str | None = None
) -> dict[str, Path]:
    """The models `names` of REPOSITORY in `repository` (files copied, so a container can mount it); model -> its graph.

    `backend` names every model's backend so (`tritonnx` on NGC's image, whose `onnxruntime` is NVIDIA's own).
    """
    files = {}
    for index, (name, (config, file_name)) in enumerate(REPOSITORY.items()):
        if name not in names:
            continue
        (repository / name / "1").mkdir(parents=True)
        if backend is not None:
            config = (config or "").replace('platform: "onnxruntime_onnx"', f'backend: "{backend}"')
            config = config.replace('backend: "onnxruntime"', f'backend: "{backend}"')
            config = config if f'backend: "{backend}"' in config else f'backend: "{backend}"\n{config}'
        if config is not None:
            (repository / name / "config.pbtxt").write_text(config)
        files[name] = repository / name / "1" / file_name
        if name in REAL_NETWORKS:
            shutil.copyfile(MODEL_REPOSITORY / "mobilenet_v3_small" / "1" / "model.onnx", files[name])
        elif name == "custom_op":
            string_upper(files[name])
        elif name == "sequence":
            onnx.save(sequence_step(), files[name])
        elif name == "centred":
            onnx.save(batch_centred(), files[name])
        elif name == "quantized":
            quantized_encoder(files[name].parent)
            (files[name].parent / "float.onnx").unlink()
        else:
            onnx.save(scaled_relu(float(index + 2)), files[name])
        if name == "labelled":
            (repository / name / "labels.txt").write_text("cat\ndog\nbird\n")
    return files


@dataclass
class Example:
    """A request for one model: what the client sends, what in-process ONNX Runtime is fed, the call's options."""

    sent: dict[str, np.ndarray]
    fed: dict[str, np.ndarray]
    options: dict[str, Any] = field(default_factory=dict)


def example(name: str, seed: int = 1) -> Example:
    """A request of two rows (one for the sequence model, whose request starts and ends its sequence)."""
    rng = np.random.default_rng(seed)
    if name in REAL_NETWORKS:
        x = rng.standard_normal((2, 3, 224, 224), dtype=np.float32)
        return Example({"input": x}, {"input": x})
    if name == "quantized":
        ids = np.stack([rng.integers(0, LOUD_ID, 5), np.full(5, LOUD_ID)])
        return Example({"ids": ids}, {"ids": ids})
    if name == "custom_op":
        text = np.array([["tritonnx"], ["wörld"]], dtype=object)
        return Example({"text": text}, {"text": text})
    x = rng.standard_normal((2, 3), dtype=np.float32)
    if name == "sequence":
        controls = {"START": np.ones((1, 1), np.float32), "CORRID": np.full((1, 1), 5, np.uint64)}
        return Example({"x": x[:1]}, {"x": x[:1], **controls}, {"sequence_id": 5, "sequence_start": True,
                                                                 "sequence_end": True})  # fmt: skip
    if name == "labelled":
        return Example({"x": x[:, None, :]}, {"x": x})  # its config's dims: [1, 3], reshaped to the graph's [3]
    return Example({"x": x}, {"x": x})


def assert_served_as_in_process(client: grpcclient.InferenceServerClient, name: str, graph: Path) -> None:
    """`example(name)` served equals in-process ONNX Runtime on `graph`: element for element, or within the rounding of
    a real network's convolutions. Not for custom_op, whose in-process session needs the library registered."""
    request = example(name)
    result = client.infer(name, make_inputs(request.sent), **request.options)
    session = reference_session(graph)
    names = [o.name for o in session.get_outputs()]
    for output, expected in zip(names, session.run(names, request.fed), strict=True):
        served = result.as_numpy(output)
        assert served is not None and served.shape == expected.shape, (name, output)
        if name in REAL_NETWORKS:
            assert_close(served, expected)
        else:
            np.testing.assert_array_equal(served, expected, err_msg=f"{name}: {output}")
