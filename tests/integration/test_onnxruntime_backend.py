"""A repository written for Triton's onnxruntime backend, served unchanged: no model.py anywhere in it.

The models' configs are as Triton's documentation writes them (`platform: "onnxruntime_onnx"`, `backend:
"onnxruntime"`, none at all, `default_model_filename`), plus `backend: "tritonnx"`, the name that picks tritonnx
where NVIDIA's native onnxruntime backend is installed. tritonserver takes them through the Python-based backends
the backend directory holds (backend/server/triton.py's assemble_backend_dir). Every answer is compared with
in-process ONNX Runtime on the same file, element for element.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from onnxruntime_extensions import get_library_path

from backend.server.model_control import TritonControl
from backend.server.stack import ServingStack
from backend.server.versions import ModelFolder, publish
from tests.graphs import LOUD_ID, quantized_encoder, string_upper
from tests.integration.any_models import _model, value
from tests.kserve import infer_concurrently, make_inputs, reference_session
from tests.serving import MODEL_REPOSITORY

# model -> (config.pbtxt, or None for none at all; the graph's file name in the version folder)
REPOSITORY = {
    "platform": ('platform: "onnxruntime_onnx"\nmax_batch_size: 8\n', "model.onnx"),
    "backend": ('backend: "onnxruntime"\n', "model.onnx"),  # batching decided from the graph
    "no_config": (None, "model.onnx"),
    "named_tritonnx": ('backend: "tritonnx"\nmax_batch_size: 4\n', "model.onnx"),
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
}


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


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(stack, {model: the graph it serves}), the repository loaded at start-up."""
    workdir = tmp_path_factory.mktemp("onnxruntime-backend")
    repository = workdir / "repository"
    files = {}
    for index, (name, (config, file_name)) in enumerate(REPOSITORY.items()):
        (repository / name / "1").mkdir(parents=True)
        if config is not None:
            (repository / name / "config.pbtxt").write_text(config)
        files[name] = repository / name / "1" / file_name
        if name == "mobilenet":
            files[name].symlink_to(MODEL_REPOSITORY / "mobilenet_v3_small" / "1" / "model.onnx")
        elif name == "custom_op":
            string_upper(files[name])
        elif name == "sequence":
            onnx.save(sequence_step(), files[name])
        elif name == "quantized":
            quantized_encoder(files[name].parent)
            (files[name].parent / "float.onnx").unlink()
        else:
            onnx.save(scaled_relu(float(index + 2)), files[name])
        if name == "labelled":
            (repository / name / "labels.txt").write_text("cat\ndog\nbird\n")
    assert not list(repository.rglob("*.py"))
    # The onnxruntime backend's own setting, which Triton hands a Python-based backend no copy of.
    triton_args = ["--backend-config=onnxruntime,default-max-batch-size=8"]
    with ServingStack(repository, workdir, with_facade=False, triton_http=False, triton_args=triton_args) as stack:
        yield stack, files


@pytest.fixture(scope="module")
def client(served):
    with grpcclient.InferenceServerClient(served[0].triton.grpc_url) as client:
        yield client


def test_every_model_loads_through_a_named_backend(served, client):
    stack, _ = served
    assert {s["name"]: s["state"] for s in stack.triton.model_states()} == dict.fromkeys(REPOSITORY, "READY")
    backends = {name: client.get_model_config(name).config.backend for name in REPOSITORY}
    assert backends == {**dict.fromkeys(REPOSITORY, "onnxruntime"), "named_tritonnx": "tritonnx"}


def test_batching_and_instances_are_what_the_config_and_the_graph_say(client):
    configs = {name: client.get_model_config(name).config for name in REPOSITORY}
    assert {n: c.max_batch_size for n, c in configs.items()} == {
        "platform": 8,
        "backend": 8,  # the server's default-max-batch-size for onnxruntime: the graph batches
        "no_config": 8,
        "named_tritonnx": 4,  # written
        "own_file_name": 8,
        "not_batched": 0,
        "labelled": 8,
        "sequence": 4,
        "mobilenet": 8,
        "quantized": 8,
        "custom_op": 8,
    }
    assert configs["not_batched"].input[0].dims == [-1, 3] and configs["platform"].input[0].dims == [3]
    # Triton's default for the backend named onnxruntime: two CPU instances; one for any other name.
    assert sum(g.count for g in configs["platform"].instance_group) == 2
    assert sum(g.count for g in configs["named_tritonnx"].instance_group) == 1


@pytest.mark.parametrize(
    "model", [m for m in REPOSITORY if m not in ("mobilenet", "quantized", "custom_op", "sequence")]
)
def test_answers_equal_onnx_runtime_in_process(served, client, model):
    _, files = served
    x = np.random.default_rng(1).standard_normal((2, 3), dtype=np.float32)
    sent = x[:, None, :] if model == "labelled" else x  # its config's dims: [1, 3], reshaped to the graph's [3]
    result = client.infer(model, make_inputs({"x": sent}))
    expected = reference_session(files[model]).run(["y"], {"x": x})[0]
    np.testing.assert_array_equal(result.as_numpy("y"), expected)


def test_labels_of_the_config_name_the_top_classes_as_tritons_classification_extension_does(served, client):
    _, files = served
    x = np.array([[0.5, 2.0, 1.0], [3.0, -1.0, 0.25]], dtype=np.float32)
    result = client.infer(
        "labelled", make_inputs({"x": x[:, None, :]}), outputs=[grpcclient.InferRequestedOutput("y", class_count=2)]
    )
    scores = reference_session(files["labelled"]).run(["y"], {"x": x})[0]
    labels = ["cat", "dog", "bird"]
    expected = [[f"{row[i]:f}:{i}:{labels[i]}" for i in np.argsort(-row)[:2]] for row in scores]
    assert [[v.decode() for v in row] for row in result.as_numpy("y")] == expected


def test_sequence_control_inputs_are_filled_by_tritons_sequence_batcher(served, client):
    _, files = served
    config = client.get_model_config("sequence").config
    assert [i.name for i in config.input] == ["x"]  # START and CORRID are the batcher's, not the client's
    session = reference_session(files["sequence"])
    steps = [(7, True, False), (8, True, False), (7, False, False), (8, False, True), (7, False, True)]
    for step, (sequence, start, end) in enumerate(steps):
        x = np.full((1, 3), step, np.float32)
        result = client.infer("sequence", make_inputs({"x": x}), sequence_id=sequence, sequence_start=start,
                              sequence_end=end)  # fmt: skip
        controls = {"START": np.full((1, 1), float(start), np.float32), "CORRID": np.full((1, 1), sequence, np.uint64)}
        expected = session.run(["y", "sequence"], {"x": x, **controls})
        np.testing.assert_array_equal(result.as_numpy("y"), expected[0])
        np.testing.assert_array_equal(result.as_numpy("sequence"), expected[1])


def test_a_custom_operator_library_named_in_the_config_serves_its_ops(client):
    text = np.array([["tritonnx"], ["wörld"]], dtype=object)  # two requests' worth in one: [n, 1] as served
    result = client.infer("custom_op", make_inputs({"text": text}))
    assert [v.decode() for v in result.as_numpy("upper").ravel()] == ["TRITONNX", "WöRLD"]


def test_a_real_network_answers_as_in_process(served, client):
    _, files = served
    x = np.random.default_rng(2).standard_normal((2, 3, 224, 224), dtype=np.float32)
    result = client.infer("mobilenet", make_inputs({"input": x}))
    expected = reference_session(files["mobilenet"]).run(["output"], {"input": x})[0]
    np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=1e-4, atol=1e-5)


def test_concurrent_requests_to_a_batch_coupled_graph_each_get_what_they_would_get_alone(served, client):
    _, files = served
    assert not client.get_model_config("quantized").config.HasField("dynamic_batching")
    rng = np.random.default_rng(3)
    requests = [rng.integers(0, LOUD_ID, (1, 5)) if i % 2 else np.full((1, 5), LOUD_ID) for i in range(16)]
    answers = infer_concurrently(client, "quantized", [{"ids": ids} for ids in requests], ["logits"])
    session = reference_session(files["quantized"])
    for ids, answer in zip(requests, answers, strict=True):
        assert answer.error is None
        np.testing.assert_array_equal(answer.outputs["logits"], session.run(["logits"], {"ids": ids})[0])


def test_publish_writes_the_graph_under_the_configs_name_and_no_model_py(served, client, tmp_path):
    stack, files = served
    new = tmp_path / "new.onnx"
    onnx.save(scaled_relu(10.0), new)
    folder = ModelFolder.find(stack.triton.model_repository, "own_file_name")
    with TritonControl(stack.triton.grpc_url, stack.triton.admin_key) as control:
        outcome = publish(folder, new, control, log=lambda line: None)
    assert sorted(p.name for p in (folder.path / "2").iterdir()) == ["model.int8.onnx"]
    assert outcome.version == 2
    x = np.ones((1, 3), np.float32)
    result = client.infer("own_file_name", make_inputs({"x": x}), model_version="2")
    np.testing.assert_array_equal(result.as_numpy("y"), reference_session(new).run(["y"], {"x": x})[0])
    assert Path(files["own_file_name"]).exists()  # version 1 stays on disk
