"""A repository written for Triton's onnxruntime backend, served unchanged: no model.py anywhere in it.

The repository is tests/onnxruntime_style.py's, served as `make serve` serves one: tritonserver takes its models
through the Python-based backends the backend directory holds (tritonnx/server/triton.py's assemble_backend_dir).
Every answer is compared with in-process ONNX Runtime on the same file.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient

from tests.graphs import LOUD_ID
from tests.integration.any_models import _model, value
from tests.kserve import infer_concurrently, make_inputs, reference_session
from tests.onnxruntime_style import REPOSITORY, assert_served_as_in_process, scaled_relu, write_repository
from tritonnx.client.model_control import ControlError, TritonControl
from tritonnx.server.stack import ServingStack
from tritonnx.server.stubs import live_stubs
from tritonnx.server.versions import ModelFolder, publish

# The repository's models whose configs write inputs and outputs: tritonserver serves them as written with or
# without --disable-auto-complete-config.
FULL_CONFIGS = ("tutorial", "explicit", "labelled")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(stack, {model: the graph it serves}), the repository loaded at start-up."""
    workdir = tmp_path_factory.mktemp("onnxruntime-backend")
    repository = workdir / "repository"
    files = write_repository(repository)
    assert not list(repository.rglob("*.py"))
    # The onnxruntime backend's own settings, of which Triton hands a Python-based backend no copy.
    triton_args = ["--backend-config=onnxruntime,default-max-batch-size=8",
                   "--backend-config=onnxruntime,enable-global-threadpool=1",
                   "--backend-config=onnxruntime,intra_op_thread_count=3"]  # fmt: skip
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
        "centred": 8,
        "custom_op": 8,
        "tutorial": 0,  # inputs and outputs written, no max_batch_size: nothing auto-completed
        "explicit": 8,
    }
    assert configs["not_batched"].input[0].dims == [-1, 3] and configs["platform"].input[0].dims == [3]
    assert configs["tutorial"].input[0].dims == [-1, 3, 224, 224]
    # The dynamic batcher where Triton's onnxruntime backend adds one: not where inputs and outputs are written.
    batchers = {name for name, config in configs.items() if config.HasField("dynamic_batching")}
    assert batchers == set(REPOSITORY) - {"not_batched", "labelled", "sequence", "quantized", "centred", *FULL_CONFIGS}
    # Triton's default for the backend named onnxruntime: two CPU instances; one for any other name.
    assert sum(g.count for g in configs["platform"].instance_group) == 2
    assert sum(g.count for g in configs["named_tritonnx"].instance_group) == 1


def test_nice_runs_every_thread_of_the_models_instances_at_a_lower_cpu_priority(served):
    stack, _ = served
    base = os.getpriority(os.PRIO_PROCESS, stack.triton.pid)

    def niceness(model: str) -> set[int]:
        pids = [pid for pid, stub in live_stubs(stack.triton.pid).items() if stub.model == model]
        assert pids, f"no stub of {model}"
        return {os.getpriority(os.PRIO_PROCESS, int(t)) for pid in pids for t in os.listdir(f"/proc/{pid}/task")}

    assert niceness("named_tritonnx") == {min(19, base + 5)}  # ONNX Runtime's pool threads included
    assert niceness("platform") == {base}


def test_the_servers_global_threadpool_thread_counts_reach_the_onnxruntime_models(served):
    stack, _ = served
    log = stack.triton.log_file.read_text(errors="replace")

    def threads(model: str) -> set[str]:
        return set(re.findall(rf"{model} instance \S+ ready in .*?intra_op_threads=(\d+)", log))

    assert threads("platform") == {"3"}  # the server's, not the model's share of the cores (1 of 2 for 2 instances)
    assert threads("named_tritonnx") == {"2"}  # another backend's name: the cores of its one instance


def test_priority_levels_in_front_of_a_single_instance_are_warned_of(served):
    stack, _ = served
    log = stack.triton.log_file.read_text(errors="replace")
    warned = set(re.findall(r"model '(\w+)': a dynamic batcher with \d+ priority levels in front of one instance", log))
    assert warned == {"named_tritonnx"}  # its one instance; the onnxruntime-named models have two and no levels


@pytest.mark.parametrize("model", [m for m in REPOSITORY if m != "custom_op"])
def test_answers_equal_onnx_runtime_in_process(served, client, model):
    assert_served_as_in_process(client, model, served[1][model])


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


def coupled_requests(model: str, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Requests whose answers move when batched together: loud and quiet ids, or pairs of rows at different scales."""
    if model == "quantized":
        return [{"ids": rng.integers(0, LOUD_ID, (1, 5)) if i % 2 else np.full((1, 5), LOUD_ID)} for i in range(16)]
    return [{"x": rng.standard_normal((2, 3)).astype(np.float32) * (1 + 50 * (i % 2))} for i in range(16)]


@pytest.mark.parametrize("model", ["quantized", "centred"])
def test_concurrent_requests_to_a_batch_coupled_graph_each_get_what_they_would_get_alone(served, client, model):
    _, files = served
    assert not client.get_model_config(model).config.HasField("dynamic_batching")
    requests = coupled_requests(model, np.random.default_rng(3))
    output = "logits" if model == "quantized" else "y"
    answers = infer_concurrently(client, model, requests, [output])
    session = reference_session(files[model])
    for request, answer in zip(requests, answers, strict=True):
        assert answer.error is None
        np.testing.assert_array_equal(answer.outputs[output], session.run([output], request)[0])


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


# --- both auto-complete modes: tritonserver as started above, and with --disable-auto-complete-config ------------


@pytest.fixture(scope="module")
def without_auto_complete(tmp_path_factory):
    """(stack, {model: its graph}): the models of FULL_CONFIGS under tritonserver --disable-auto-complete-config."""
    workdir = tmp_path_factory.mktemp("no-auto-complete")
    repository = workdir / "repository"
    files = write_repository(repository, FULL_CONFIGS)
    triton_args = ["--disable-auto-complete-config"]
    with ServingStack(repository, workdir, with_facade=False, triton_http=False, triton_args=triton_args) as stack:
        yield stack, files


@pytest.fixture(params=["auto-complete", "disabled"])
def either_mode(request):
    """The served stack of this module, then the one without auto-complete."""
    return request.getfixturevalue("served" if request.param == "auto-complete" else "without_auto_complete")


@pytest.mark.parametrize("model", FULL_CONFIGS)
def test_written_inputs_and_outputs_load_as_written_and_answer_as_in_process(either_mode, model):
    stack, files = either_mode
    with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
        config = client.get_model_config(model).config
        assert config.max_batch_size == {"tutorial": 0, "explicit": 8, "labelled": 8}[model]
        assert not config.HasField("dynamic_batching")  # Triton's default scheduler: the native backend adds none
        assert_served_as_in_process(client, model, files[model])


def two_inputs() -> onnx.ModelProto:
    """y = x + z, x and z FP32 [n, 3]."""
    inputs = [value("x", onnx.TensorProto.FLOAT, ["n", 3]), value("z", onnx.TensorProto.FLOAT, ["n", 3])]
    return _model(
        [onnx.helper.make_node("Add", ["x", "z"], ["y"])], inputs, [value("y", onnx.TensorProto.FLOAT, ["n", 3])]
    )


CONTRADICTED = {
    "misspelt": ('input [{ name: "X", data_type: TYPE_FP32, dims: [3] }]', "input 'X': the graph has no such input "
                 "(its inputs: x, z)"),
    "missing": ('input [{ name: "x", data_type: TYPE_FP32, dims: [3] }]', "input 'z': the graph needs it and the "
                "config's inputs leave it out (the graph's inputs: x, z)"),
}  # fmt: skip


@pytest.mark.parametrize("case", CONTRADICTED)
def test_a_config_the_graph_contradicts_fails_the_load_naming_the_graphs_inputs(either_mode, case):
    stack, _ = either_mode
    written, reason = CONTRADICTED[case]
    name = f"contradicted_{case}"
    folder = stack.triton.model_repository / name
    (folder / "1").mkdir(parents=True)
    try:
        onnx.save(two_inputs(), folder / "1" / "model.onnx")
        output = 'output [{ name: "y", data_type: TYPE_FP32, dims: [3] }]'
        (folder / "config.pbtxt").write_text(f'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n{written}\n{output}\n')
        with TritonControl(stack.triton.grpc_url, stack.triton.admin_key) as control:
            with pytest.raises(ControlError) as refused:
                control.load(name)
        [state] = [s for s in stack.triton.model_states() if s["name"] == name]
        assert state["state"] == "UNAVAILABLE" and f"model '{name}', {reason}" in state["reason"], state
        # As a client reads it, in load_model's error and the repository index: the reason alone, no traceback.
        for seen in (str(refused.value), state["reason"]):
            assert f"model '{name}', {reason}" in seen and "At:" not in seen and "triton_model.py" not in seen, seen
    finally:
        shutil.rmtree(folder)
