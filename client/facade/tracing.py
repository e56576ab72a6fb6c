"""OpenTelemetry in the facade: each call's spans, exported over OTLP/HTTP, and its context handed to Triton.

A traced Predict is one trace: the call's SERVER span (its parent is the caller's, when the call
carries a W3C `traceparent`), with children `receive` (the body read and parsed), `admission`
(an in-flight slot and the body's bytes), `decode` (model metadata, checks, the Triton request built), `ModelInfer` (the
CLIENT span of the call to Triton, whose context goes along as `traceparent`, so tritonserver's own
spans hang under it) and `encode` (the PredictResponse built).

Sampling is parent-based: a call whose `traceparent` is sampled is traced (at most
`--trace-caller-rate` a second: callers cannot make the facade trace every call; beyond it such a
call is traced at the ratio), one that says not is not, and the others are traced at the configured
ratio. Span attributes are capped in length and number (`SPAN_LIMITS`). A call that is not traced costs one
sampling decision and creates no child spans, and Triton is told nothing, so it traces nothing
for it (tritonserver runs with `rate=0`: it traces exactly the requests that carry a context).

Spans go out in batches (the SDK's BatchSpanProcessor, on its own thread) as OTLP/HTTP with the
JSON encoding, which is what tritonserver's exporter sends too and what every OTLP receiver
(the OpenTelemetry Collector, Jaeger, Tempo) accepts. The SDK's own OTLP exporter is not used: it
needs protobuf 5, and tritonclient 2.51 needs protobuf 4.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import grpc

from tritonnx.common.tracing import check_ratio, traces_url

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (about 50 ms at start-up)
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("tritonnx.facade")

SERVICE_NAME = "tritonnx-facade"
TRACEPARENT = "traceparent"
# OTLP's SpanKind numbers are the Python SDK's plus one (OTLP keeps 0 for "unspecified").
_OTLP_KIND_OFFSET = 1
# A receiver that is down is said once a minute, not once per batch.
_WARN_EVERY_S = 60.0
# Per span: the attributes and events the facade sets are a handful, their values request ids and names (at most
# wire.MAX_NAME_BYTES) and status messages (at most errors.MAX_MESSAGE_CHARS).
MAX_ATTRIBUTES = 32
MAX_ATTRIBUTE_CHARS = 2048


def _any_value(value: Any) -> dict:
    """An attribute value in OTLP JSON (64-bit integers as decimal strings, as the encoding says)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    return {"arrayValue": {"values": [_any_value(v) for v in value]}}


def _attributes(attributes: Any) -> list[dict]:
    return [{"key": key, "value": _any_value(value)} for key, value in (attributes or {}).items()]


def _span_json(span: ReadableSpan) -> dict:
    context = span.get_span_context()
    assert context is not None  # a span the SDK ended always has one
    encoded: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
        "name": span.name,
        "kind": span.kind.value + _OTLP_KIND_OFFSET,
        "startTimeUnixNano": str(span.start_time),
        "endTimeUnixNano": str(span.end_time),
        "attributes": _attributes(span.attributes),
        "events": [
            {"timeUnixNano": str(event.timestamp), "name": event.name, "attributes": _attributes(event.attributes)}
            for event in span.events
        ],
        "status": {"code": span.status.status_code.value, "message": span.status.description or ""},
    }
    if span.parent is not None:
        encoded["parentSpanId"] = f"{span.parent.span_id:016x}"
    return encoded


def otlp_json(spans: Sequence[ReadableSpan]) -> dict:
    """An OTLP ExportTraceServiceRequest in the JSON encoding: spans grouped by resource, then by scope."""
    by_resource: dict[int, tuple[Any, dict[tuple[str, str], list[dict]]]] = {}
    for span in spans:
        resource, scopes = by_resource.setdefault(id(span.resource), (span.resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version or "") if scope is not None else ("", "")
        scopes.setdefault(key, []).append(_span_json(span))
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(resource.attributes)},
                "scopeSpans": [
                    {"scope": {"name": name, "version": version}, "spans": encoded}
                    for (name, version), encoded in scopes.items()
                ],
            }
            for resource, scopes in by_resource.values()
        ]
    }


def _exporter_class() -> type:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class OtlpJsonExporter(SpanExporter):
        """Posts batches of spans to an OTLP/HTTP receiver, JSON-encoded; a failed post drops that batch."""

        def __init__(self, url: str, timeout: float = 10.0) -> None:
            self.url = url
            self.timeout = timeout
            self._warned = -_WARN_EVERY_S

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            body = json.dumps(otlp_json(spans), separators=(",", ":")).encode()
            request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    response.read()
                return SpanExportResult.SUCCESS
            except (urllib.error.URLError, OSError) as error:
                if time.monotonic() - self._warned >= _WARN_EVERY_S:
                    self._warned = time.monotonic()
                    log.warning("tracing: %d span(s) not delivered to %s (%s)", len(spans), self.url, error)
                return SpanExportResult.FAILURE

        def shutdown(self) -> None:
            pass

    return OtlpJsonExporter


def _caller_budget(rate: float, otherwise: Any) -> Any:
    """The sampler of calls whose caller sampled its traceparent: at most `rate` a second, then as `otherwise` does.

    A token bucket refilled at `rate` per second, holding at most one second's worth.
    """
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Sampler

    class CallerBudget(Sampler):
        def __init__(self) -> None:
            self._tokens = rate
            self._refilled = time.monotonic()

        def should_sample(self, *args: Any, **kwargs: Any) -> Any:
            now = time.monotonic()
            self._tokens = min(rate, self._tokens + (now - self._refilled) * rate)
            self._refilled = now
            if self._tokens >= 1:
                self._tokens -= 1
                return ALWAYS_ON.should_sample(*args, **kwargs)
            return otherwise.should_sample(*args, **kwargs)

        def get_description(self) -> str:
            return f"CallerBudget{{{rate:g}/s, then {otherwise.get_description()}}}"

    return CallerBudget()


class CallTrace:
    """One call's spans. Not sampled (or tracing off): every method does nothing."""

    def __init__(self, tracer: Tracer | None = None, root: Span | None = None) -> None:
        self._tracer = tracer
        self.root = root
        if tracer is not None and root is not None:
            from opentelemetry import trace

            self._parent = trace.set_span_in_context(root)

    @property
    def sampled(self) -> bool:
        return self.root is not None

    def span(self, name: str, client: bool = False) -> AbstractContextManager[Span | None]:
        """A child span of the call around the block; one the block leaves by an exception ends with an error status.

        Not sampled: one shared context manager that does nothing, so an untraced call makes no generator per block.
        """
        return _NO_SPAN if self._tracer is None else self._child(self._tracer, name, client)

    @contextmanager
    def _child(self, tracer: Tracer, name: str, client: bool) -> Iterator[Span]:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        span = tracer.start_span(name, context=self._parent, kind=SpanKind.CLIENT if client else SpanKind.INTERNAL)
        try:
            yield span
        except BaseException as error:
            span.set_status(Status(StatusCode.ERROR, getattr(error, "message", "") or type(error).__name__))
            raise
        finally:
            span.end()

    @staticmethod
    def propagation(span: Span | None) -> tuple[tuple[str, str], ...]:
        """The gRPC metadata carrying `span`'s context to Triton as W3C traceparent; none for no span."""
        if span is None:
            return ()
        context = span.get_span_context()
        return ((TRACEPARENT, f"00-{context.trace_id:032x}-{context.span_id:016x}-01"),)

    def set(self, key: str, value: str | int | bool) -> None:
        if self.root is not None:
            self.root.set_attribute(key, value)

    def end(self, code: grpc.StatusCode, message: str = "") -> None:
        """End the call's span with its gRPC status (an error status for anything but OK)."""
        if self.root is None:
            return
        from opentelemetry.trace import Status, StatusCode

        self.root.set_attribute("rpc.grpc.status_code", code.value[0])
        if code != grpc.StatusCode.OK:
            self.root.set_status(Status(StatusCode.ERROR, f"{code.name}: {message}"))
        self.root.end()


_NO_SPAN: AbstractContextManager[None] = nullcontext()
NOT_TRACED = CallTrace()


class Tracing:
    """The facade's tracer: off (`endpoint` empty) hands every call NOT_TRACED."""

    def __init__(self, endpoint: str, ratio: float, caller_rate: float = 100.0) -> None:
        """`caller_rate`: the most calls a second traced because their caller's traceparent is sampled."""
        self.ratio = check_ratio(ratio)
        self.caller_rate = caller_rate
        self.url = traces_url(endpoint) if endpoint else ""
        self._provider: TracerProvider | None = None
        self._tracer: Tracer | None = None
        if self.url:
            self._start()

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def _start(self) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES apply, as users of OpenTelemetry expect.
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
        by_ratio = TraceIdRatioBased(self.ratio)
        sampler = ParentBased(by_ratio, remote_parent_sampled=_caller_budget(self.caller_rate, by_ratio))
        limits = SpanLimits(
            max_attributes=MAX_ATTRIBUTES,
            max_span_attributes=MAX_ATTRIBUTES,
            max_event_attributes=MAX_ATTRIBUTES,
            max_events=MAX_ATTRIBUTES,
            max_links=MAX_ATTRIBUTES,
            max_attribute_length=MAX_ATTRIBUTE_CHARS,
            max_span_attribute_length=MAX_ATTRIBUTE_CHARS,
        )
        self._provider = TracerProvider(resource=resource, sampler=sampler, span_limits=limits)
        # The batch processor's queue, batch size and delay come from the OTEL_BSP_* variables.
        self._provider.add_span_processor(BatchSpanProcessor(_exporter_class()(self.url)))
        self._tracer = self._provider.get_tracer("tritonnx.facade")
        log.info(
            "tracing: %.0f%% of calls (and those a caller's traceparent samples) to %s", self.ratio * 100, self.url
        )

    def call(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> CallTrace:
        """The trace of one call of `method`, continuing the caller's context when it sent one."""
        if self._tracer is None:
            return NOT_TRACED
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier = {key: value for key, value in metadata or () if key in (TRACEPARENT, "tracestate")}
        parent = TraceContextTextMapPropagator().extract(carrier) if carrier else None
        root = self._tracer.start_span(
            f"inference.InferenceService/{method}",
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": "inference.InferenceService", "rpc.method": method},
        )
        if not root.is_recording():
            return NOT_TRACED
        return CallTrace(self._tracer, root)

    def shutdown(self) -> None:
        """Send what is still queued (on SIGTERM) and stop the exporter's thread."""
        if self._provider is not None:
            self._provider.shutdown()
