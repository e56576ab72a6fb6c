"""The serving path end to end: real tritonserver, real gRPC, outputs checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2

from tests.kserve import (
    assert_close,
    execution_counts,
    infer,
    infer_concurrently,
    reference_session,
)
from tests.serving import MODELS, SERVED_MODELS, onnx_file
from tritonnx.backend.onnx_io import read_file_io

VISION = ("resnet50", "mobilenet_v3_small")


@pytest.fixture(scope="module")
def client(triton):
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        yield client


def images(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 3, 224, 224), dtype=np.float32)


def token_request(length: int, seed: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(1, 1000, size=(1, length), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def test_every_model_is_ready(triton, client):
    states = {s["name"]: s["state"] for s in triton.model_states()}
    assert states == {model: "READY" for model in SERVED_MODELS}
    assert all(client.is_model_ready(model) for model in SERVED_MODELS)


@pytest.mark.parametrize("model", MODELS)
def test_served_config_has_the_policy_and_the_graph_io(triton, client, model):
    # The protobuf form: JSON leaves out fields at their default, such as timeout_action REJECT.
    config = client.get_model_config(model, headers=triton.admin_headers).config
    assert config.backend == "python"
    assert config.max_batch_size >= 16
    # A plain batcher: priority levels or any queue policy would turn off Triton's prefetching of the next batch.
    batcher = config.dynamic_batching
    assert config.HasField("dynamic_batching") and batcher.priority_levels == 0
    assert batcher.default_queue_policy == model_config_pb2.ModelQueuePolicy() and not batcher.priority_queue_policy
    assert all(g.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU and g.count >= 1 for g in config.instance_group)
    assert "intra_op_thread_count" in config.parameters

    # Auto-complete filled inputs and outputs from the graph, batch dim removed.
    inputs, outputs = read_file_io(onnx_file(model), batched=True)
    triton_type = lambda t: "TYPE_" + model_config_pb2.DataType.Name(t.data_type).removeprefix("TYPE_")  # noqa: E731
    assert [(t.name, triton_type(t), list(t.dims)) for t in config.input] == [
        (s.name, s.config_type, s.config_dims) for s in inputs
    ]
    assert [(t.name, triton_type(t), list(t.dims)) for t in config.output] == [
        (s.name, s.config_type, s.config_dims) for s in outputs
    ]


def test_vision_models_take_the_documented_tensors(client):
    for model in VISION:
        metadata = client.get_model_metadata(model, as_json=True)
        assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
            ("input", "FP32", ["-1", "3", "224", "224"])
        ]
        assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["outputs"]] == [
            ("output", "FP32", ["-1", "1000"])
        ]


@pytest.mark.parametrize("model", VISION)
@pytest.mark.parametrize("batch", [1, 4])
def test_outputs_equal_onnxruntime_in_process(client, model, batch):
    data = images(batch, seed=batch)
    outcome = infer(client, model, {"input": data}, ["output"])
    assert outcome.error is None, outcome.error
    expected = reference_session(onnx_file(model)).run(["output"], {"input": data})[0]
    assert outcome.outputs["output"].shape == (batch, 1000)
    assert_close(outcome.outputs["output"], expected)


def test_concurrent_requests_are_batched_and_each_gets_its_own_result(triton, client):
    # resnet50: slow enough (tens of ms per image) that requests queue while instances are busy;
    # a fast model with several instances may keep up with the client and never need to batch.
    model = "resnet50"
    data = images(64, seed=7)
    before = execution_counts(client, model, triton.admin_headers)
    outcomes = infer_concurrently(client, model, [{"input": data[i : i + 1]} for i in range(64)], ["output"])
    after = execution_counts(client, model, triton.admin_headers, at_least=before[0] + 64)

    assert [o.status for o in outcomes] == ["OK"] * 64
    expected = reference_session(onnx_file(model)).run(["output"], {"input": data})[0]
    for index, outcome in enumerate(outcomes):
        assert_close(outcome.outputs["output"], expected[index : index + 1])
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences >= 64  # more when the facade's health probe ran meanwhile
    assert executions < inferences, f"64 concurrent requests ran in {executions} executions: no batching"


def test_bad_requests_get_invalid_argument_while_good_ones_succeed(client):
    good = [token_request(length, seed=100 + length) for length in (4, 9, 15, 6)]
    mismatched = {  # passes Triton's shape check (both [-1]); the backend's validation catches it
        "input_ids": np.ones((1, 7), np.int64),
        "attention_mask": np.ones((1, 6), np.int64),
    }
    wrong_dtype = {"input_ids": np.ones((1, 5), np.int32), "attention_mask": np.ones((1, 5), np.int64)}
    requests = [good[0], mismatched, good[1], wrong_dtype, good[2], mismatched, good[3]]
    outcomes = infer_concurrently(client, "text_classifier", requests, ["logits"])

    assert [o.status for o in outcomes] == [
        "OK",
        "StatusCode.INVALID_ARGUMENT",
        "OK",
        "StatusCode.INVALID_ARGUMENT",
        "OK",
        "StatusCode.INVALID_ARGUMENT",
        "OK",
    ]
    assert "disagree on the size of dim 'sequence' (7 and 6)" in outcomes[1].error.message()
    assert "input_ids" in outcomes[3].error.message() and "INT32" in outcomes[3].error.message()
    for index, request in zip((0, 2, 4, 6), good, strict=False):
        assert_close(
            outcomes[index].outputs["logits"], infer(client, "text_classifier", request, ["logits"]).outputs["logits"]
        )

    wrong_shape = infer(client, "resnet50", {"input": np.zeros((1, 3, 224, 225), np.float32)}, ["output"])
    assert wrong_shape.status == "StatusCode.INVALID_ARGUMENT"
    assert "unexpected shape for input 'input'" in wrong_shape.error.message()
    assert client.is_server_live() and client.is_model_ready("resnet50")
