"""The facade's tracing in-process: a real Facade and a real OTLP receiver on free loopback ports,
the stand-in gateway of test_facade_server (no tritonserver); spans travel over HTTP as in production."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import grpc
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.unit.test_facade_server import FakeGateway, request, run, serving, settings
from tritonnx.client.facade.server import Facade, StartupError
from tritonnx.client.facade.tracing import Tracing, otlp_json
from tritonnx.client.proto import inference_pb2_grpc
from tritonnx.commands.traces import OtlpReceiver, ReceivedSpan, parse_export
from tritonnx.common.tracing import triton_trace_args
from tritonnx.server.stack import ServingStack

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
SAMPLED = (("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"),)
NOT_SAMPLED = (("traceparent", f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"),)
CHILDREN = ["receive", "admission", "decode", "ModelInfer", "encode"]


@pytest.fixture
def receiver(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")  # the batch processor sends within 20 ms
    with OtlpReceiver() as started:
        yield started


def traced(receiver: OtlpReceiver, ratio: float) -> dict:
    return {"otlp_endpoint": receiver.endpoint, "trace_ratio": ratio}


def by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {span.name: span for span in spans}


def test_a_call_with_a_sampled_traceparent_is_one_trace_under_the_callers_span_and_its_context_goes_to_triton(
    receiver,
):
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway, **traced(receiver, 0.0)) as (_, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            await stub.Predict(request("r1", [1, 2, 3, 4]), metadata=SAMPLED)

    run(test)
    spans = receiver.wait_for(lambda s: len(s) == 6, 5.0)
    assert {span.trace_id for span in spans} == {CALLER_TRACE}
    named = by_name(spans)
    root = named["inference.InferenceService/Predict"]
    assert (root.parent_id, root.kind, root.service) == (CALLER_SPAN, "SERVER", "tritonnx-facade")
    assert root.attributes["rpc.grpc.status_code"] == 0 and root.status != 2
    assert root.attributes["tritonnx.model"] == "double" and root.attributes["tritonnx.request_id"] == "r1"
    assert sorted(named) == sorted([root.name, *CHILDREN])
    for name in CHILDREN:
        child = named[name]
        assert child.parent_id == root.span_id and root.start_ns <= child.start_ns <= child.end_ns <= root.end_ns
    assert named["ModelInfer"].kind == "CLIENT"
    # In the order the call runs them.
    starts = [named[name].start_ns for name in CHILDREN]
    assert starts == sorted(starts)
    # Triton got the ModelInfer span's context, so its spans hang under it.
    assert gateway.metadata == [(("traceparent", f"00-{CALLER_TRACE}-{named['ModelInfer'].span_id}-01"),)]


def test_sampling_follows_the_callers_decision_then_the_ratio(receiver):
    gateway = FakeGateway()

    async def test() -> None:
        async with serving(gateway, **traced(receiver, 0.0)) as (_, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            await stub.Predict(request("plain", [1, 2, 3, 4]))  # ratio 0: not traced
            await stub.Predict(request("declined", [1, 2, 3, 4]), metadata=NOT_SAMPLED)  # the caller said no
            await stub.Predict(request("sampled", [1, 2, 3, 4]), metadata=SAMPLED)

    run(test)
    # The one traced call's spans come after what the others would have sent: none of theirs exist.
    spans = receiver.wait_for(lambda s: any(span.name.endswith("/Predict") for span in s), 5.0)
    assert {span.attributes.get("tritonnx.request_id") for span in spans} == {None, "sampled"}
    # Calls that are not traced tell Triton nothing, so it traces nothing for them.
    assert gateway.metadata[:2] == [(), ()] and gateway.metadata[2] != ()


def test_the_ratio_traces_that_share_of_calls(receiver):
    async def test() -> None:
        async with serving(FakeGateway(), **traced(receiver, 0.5)) as (_, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            for index in range(200):
                await stub.Predict(request(f"r{index}", [1, 2, 3, 4]))

    run(test)  # the facade's stop sends what is still queued
    roots = [span for span in receiver.spans() if span.name.endswith("/Predict")]
    # Binomial(200, 0.5): 100 +- 7; outside 60..140 is a sampler that ignores the ratio.
    assert 60 <= len(roots) <= 140
    assert len({span.trace_id for span in roots}) == len(roots)  # each call is a trace of its own


def test_a_refused_call_is_traced_with_its_status_and_the_step_that_refused_it(receiver):
    async def test() -> None:
        async with serving(FakeGateway(), **traced(receiver, 1.0)) as (_, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Predict(request("wrong", [1, 2, 3]))  # the model wants 4 values
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    run(test)
    spans = receiver.wait_for(lambda s: any(span.name.endswith("/Predict") for span in s), 5.0)
    named = by_name(spans)
    root = named["inference.InferenceService/Predict"]
    assert root.status == 2 and root.status_message.startswith("INVALID_ARGUMENT: ")
    assert root.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert named["decode"].status == 2 and "ModelInfer" not in named  # refused before Triton


def test_each_request_of_a_stream_is_a_trace_of_its_own_under_the_streams_caller(receiver):
    async def test() -> None:
        async with serving(FakeGateway(), **traced(receiver, 0.0)) as (_, channel):
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            call = stub.PredictStream(iter([request("a", [1, 2, 3, 4]), request("b", [5, 6, 7, 8])]), metadata=SAMPLED)
            assert sorted([response.request_id async for response in call]) == ["a", "b"]

    run(test)
    spans = receiver.wait_for(lambda s: sum(span.name.endswith("/PredictStream") for span in s) == 2, 5.0)
    roots = [span for span in spans if span.name.endswith("/PredictStream")]
    assert {root.parent_id for root in roots} == {CALLER_SPAN}
    assert len({root.span_id for root in roots}) == 2


def test_tracing_is_off_unless_an_endpoint_is_given():
    assert not Tracing("", 1.0).enabled
    facade = Facade(settings(), FakeGateway())
    assert not facade.tracing.enabled


@pytest.mark.parametrize(
    ("endpoint", "ratio"), [("127.0.0.1:4318", 0.1), ("grpc://127.0.0.1:4317", 0.1), ("http://127.0.0.1:4318", 1.5)]
)
def test_a_wrong_endpoint_or_ratio_stops_the_start_with_what_is_wrong(endpoint, ratio):
    with pytest.raises(StartupError, match="tracing: the (OTLP endpoint must be an http|trace ratio must be within)"):
        Facade(settings(otlp_endpoint=endpoint, trace_ratio=ratio), FakeGateway())


def test_spans_that_cannot_be_delivered_are_dropped_with_one_warning(caplog):
    with OtlpReceiver() as gone:
        endpoint = gone.endpoint  # a port nobody listens on once it is stopped
    tracing = Tracing(endpoint, 1.0)
    with caplog.at_level(logging.WARNING, logger="tritonnx.facade"):
        for _ in range(3):
            trace = tracing.call("Predict", SAMPLED)
            with trace.span("decode"):
                pass
            trace.end(grpc.StatusCode.OK)
            tracing._provider.force_flush()
        tracing.shutdown()
    warnings = [r.message for r in caplog.records if "not delivered" in r.message]
    assert len(warnings) == 1


def test_the_export_is_otlps_json_encoding_of_an_export_trace_service_request():
    provider = TracerProvider(resource=Resource({"service.name": "tritonnx-facade"}))
    captured = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(captured))
    tracing = Tracing("", 1.0)
    tracing._tracer = provider.get_tracer("tritonnx.facade")  # the facade's spans, kept in memory
    trace = tracing.call("Predict", SAMPLED)
    with trace.span("ModelInfer", client=True):
        pass
    trace.set("tritonnx.cache_hit", False)
    trace.end(grpc.StatusCode.UNAVAILABLE, "retry")
    encoded = otlp_json(captured.get_finished_spans())
    # Every field name and type is one of OTLP's (the protobuf schema's JSON mapping, unknown fields refused).
    message = json_format.ParseDict(json.loads(json.dumps(encoded)), ExportTraceServiceRequest())
    resource_spans = message.resource_spans[0]
    assert {a.key: a.value.string_value for a in resource_spans.resource.attributes} == {
        "service.name": "tritonnx-facade"
    }
    assert sorted(span.kind for span in resource_spans.scope_spans[0].spans) == [2, 3]  # SERVER, CLIENT
    # OTLP's JSON encoding writes ids as hex (not protobuf JSON's base64), as the receiver reads them.
    parsed = parse_export(encoded)
    root = next(span for span in parsed if span.kind == "SERVER")
    client = next(span for span in parsed if span.kind == "CLIENT")
    assert (root.trace_id, root.parent_id, client.parent_id) == (CALLER_TRACE, CALLER_SPAN, root.span_id)
    assert root.status == 2 and root.status_message == "UNAVAILABLE: retry"
    assert root.attributes["tritonnx.cache_hit"] is False and root.attributes["rpc.grpc.status_code"] == 14


def test_tritonserver_traces_only_requests_that_carry_a_context_and_the_stack_hands_both_the_endpoint(tmp_path):
    args = triton_trace_args("http://127.0.0.1:4318")
    assert "--trace-config=mode=opentelemetry" in args and "--trace-config=rate=0" in args
    assert "--trace-config=opentelemetry,url=http://127.0.0.1:4318/v1/traces" in args
    stack = ServingStack(tmp_path, tmp_path, otlp_endpoint="http://127.0.0.1:4318", trace_ratio=0.25)
    assert set(args) <= set(stack.triton.extra_args)
    assert stack.facade_args[:4] == ["--otlp-endpoint", "http://127.0.0.1:4318", "--trace-ratio", "0.25"]
    with pytest.raises(ValueError, match="trace ratio"):
        ServingStack(tmp_path, tmp_path, otlp_endpoint="http://127.0.0.1:4318", trace_ratio=2.0)


def test_the_sdk_is_not_loaded_when_tracing_is_off():
    code = (
        "import sys; from tritonnx.client.facade.server import Facade; from tritonnx.client.facade.settings import FacadeSettings\n"
        "print(any(m.startswith('opentelemetry.sdk') for m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "False"


def test_callers_sampling_their_traceparent_are_traced_at_most_the_caller_rate(monkeypatch):
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision

    from tritonnx.client.facade import tracing

    clock = [1000.0]
    monkeypatch.setattr(tracing.time, "monotonic", lambda: clock[0])
    sampler = tracing._caller_budget(3.0, ALWAYS_OFF)

    def sampled() -> int:
        return sum(sampler.should_sample(None, 1, "call").decision == Decision.RECORD_AND_SAMPLE for _ in range(10))

    assert sampled() == 3  # a burst of ten: one second's worth
    clock[0] += 0.5
    assert sampled() == 1  # refilled at 3 a second
    clock[0] += 60
    assert sampled() == 3  # never more than one second's worth saved up


def test_span_attributes_are_capped_in_length(receiver):
    from tritonnx.client.facade.tracing import MAX_ATTRIBUTE_CHARS

    tracing = Tracing(receiver.endpoint, 0.0)
    trace = tracing.call("Predict", SAMPLED)
    trace.set("tritonnx.request_id", "x" * 100_000)
    assert len(trace.root.attributes["tritonnx.request_id"]) == MAX_ATTRIBUTE_CHARS
    trace.end(grpc.StatusCode.OK)
    tracing.shutdown()
