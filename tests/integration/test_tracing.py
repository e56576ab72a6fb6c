"""One trace from the caller to ONNX Runtime: the real tritonserver and facade, both exporting
OpenTelemetry spans over OTLP/HTTP to a receiver this test starts, which joins them by trace id."""

from __future__ import annotations

import secrets

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.kserve import assert_close, make_inputs, reference_session
from tests.serving import MODEL_REPOSITORY, onnx_file
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc
from tritonnx.commands.traces import OtlpReceiver, ReceivedSpan
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack

MODEL = "mobilenet_v3_small"
RATIO = 0.25
FACADE_CHILDREN = ("admission", "receive", "decode", "ModelInfer", "encode")


@pytest.fixture(scope="module")
def receiver():
    with OtlpReceiver() as started:
        yield started


@pytest.fixture(scope="module")
def stack(receiver, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tracing")
    repository = link_models(workdir / "repository", {MODEL: MODEL_REPOSITORY / MODEL})
    with pytest.MonkeyPatch.context() as patch:
        # Both exporters (the facade's Python SDK, tritonserver's C++ one) send within 100 ms.
        patch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        with ServingStack(
            repository,
            workdir,
            facade_args=["--default-model", MODEL],
            otlp_endpoint=receiver.endpoint,
            trace_ratio=RATIO,
        ) as serving:
            yield serving


@pytest.fixture(scope="module")
def stub(stack):
    with grpc.insecure_channel(stack.facade.grpc_url) as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel)


def traceparent() -> tuple[str, str, str]:
    """A caller's new sampled context: (trace id, span id, header value)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 224, 224), dtype=np.float32)


def predict(stub, seed: int, metadata: tuple = ()) -> np.ndarray:
    x = image(seed)
    response = stub.Predict(inference_pb2.PredictRequest(raw_data=x.tobytes(), shape=x.shape), metadata=metadata)
    return np.frombuffer(response.outputs[0].raw_data, "<f4").reshape(response.outputs[0].shape)


def complete(trace_id: str):
    """Whether a facade call's trace holds both processes' spans: the facade's root, tritonserver's compute."""
    return lambda spans: (
        {"inference.InferenceService/Predict", "compute"} <= {s.name for s in spans if s.trace_id == trace_id}
    )


def only(spans: list[ReceivedSpan], service: str, name: str) -> ReceivedSpan:
    found = [s for s in spans if s.service == service and s.name == name]
    assert len(found) == 1, f"{service}/{name}: {len(found)} spans"
    return found[0]


def traced_predict(stub, receiver, seed: int) -> tuple[str, str, np.ndarray, list[ReceivedSpan]]:
    """A call with a sampled context whose trace tritonserver sent too: (trace id, caller's span, output, spans).

    tritonserver 2.51 leaves a few percent of the requests that carry a sampled context untraced (whole
    traces, whatever its span queue and batch settings; see the README's Tracing section), so a call is
    tried again, with a new trace, when its trace stays without tritonserver's spans.
    """
    for _ in range(5):
        trace_id, caller_span, header = traceparent()
        served = predict(stub, seed, (("traceparent", header),))
        try:
            spans = receiver.wait_for(complete(trace_id), 5)
        except TimeoutError:
            continue
        return trace_id, caller_span, served, [s for s in spans if s.trace_id == trace_id]
    raise AssertionError("five traced calls in a row left no tritonserver spans")


def test_one_trace_runs_from_the_caller_through_the_facade_into_tritons_queue_and_compute(stack, stub, receiver):
    trace_id, caller_span, served, spans = traced_predict(stub, receiver, 1)
    assert_close(served, reference_session(onnx_file(MODEL)).run(None, {"input": image(1)})[0])

    root = only(spans, "tritonnx-facade", "inference.InferenceService/Predict")
    assert root.parent_id == caller_span and root.kind == "SERVER"
    assert root.attributes["tritonnx.model"] == MODEL and root.attributes["tritonnx.model_version"] == "1"
    for name in FACADE_CHILDREN:
        assert only(spans, "tritonnx-facade", name).parent_id == root.span_id
    model_infer = only(spans, "tritonnx-facade", "ModelInfer")

    # tritonserver's spans hang under the facade's call to it: request -> model (its queue) -> compute.
    request = only(spans, "tritonserver", "InferRequest")
    model = only(spans, "tritonserver", MODEL)
    compute = only(spans, "tritonserver", "compute")
    assert request.parent_id == model_infer.span_id
    assert model.parent_id == request.span_id and compute.parent_id == model.span_id
    assert {"REQUEST_START", "QUEUE_START", "REQUEST_END"} <= set(model.events)
    assert {"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"} <= set(compute.events)
    assert model.attributes["triton.model_name"] == MODEL
    assert len(spans) == 1 + len(FACADE_CHILDREN) + 3


def test_the_ratio_samples_the_facades_calls_and_triton_traces_only_those(stack, stub, receiver):
    before = {s.trace_id for s in receiver.spans()}
    calls = 80
    for seed in range(calls):
        predict(stub, seed)
    # Both exporters send every 100 ms: a second without an export means they have sent everything.
    spans = [s for s in receiver.settle(1.0, 30) if s.trace_id not in before]

    facade_traces = {s.trace_id for s in spans if s.service == "tritonnx-facade"}
    triton_traces = {s.trace_id for s in spans if s.service == "tritonserver"}
    # Binomial(80, 0.25): 20 +- 4; outside 5..40 is a sampler that ignores the ratio.
    assert 5 <= len(facade_traces) <= 40
    # Triton traced sampled calls and no other: none of its traces lacks the facade's start.
    assert triton_traces <= facade_traces
    # ...and most of them (it leaves a few percent untraced, see traced_predict); each one whole.
    assert len(triton_traces) >= len(facade_traces) / 2
    for trace_id in triton_traces:
        names = [s.name for s in spans if s.trace_id == trace_id and s.service == "tritonserver"]
        assert sorted(names) == sorted(["InferRequest", MODEL, "compute"])
    calls_to_triton = {s.span_id for s in spans if s.name == "ModelInfer"}
    assert {s.parent_id for s in spans if s.name == "InferRequest"} <= calls_to_triton


def test_a_direct_request_is_traced_when_it_carries_a_context_and_only_then(stack, receiver):
    before = {s.trace_id for s in receiver.spans()}
    x = image(7)
    contexts = [traceparent() for _ in range(5)]
    with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
        untraced = client.infer(MODEL, make_inputs({"input": x}), request_id="no-context")
        for _, _, header in contexts:
            traced = client.infer(MODEL, make_inputs({"input": x}), headers={"traceparent": header})
            assert_close(traced.as_numpy("output"), untraced.as_numpy("output"))

    spans = [s for s in receiver.settle(1.0, 30) if s.trace_id not in before]
    callers = {trace_id: caller_span for trace_id, caller_span, _ in contexts}
    traced_ids = {s.trace_id for s in spans}
    # The request without a context, sent first, left no trace (Triton runs with rate=0); those with one
    # did (all but the few tritonserver leaves untraced), each under its caller's span.
    assert traced_ids and traced_ids <= set(callers)
    for trace_id in traced_ids:
        assert (
            only([s for s in spans if s.trace_id == trace_id], "tritonserver", "InferRequest").parent_id
            == (callers[trace_id])
        )
