"""OpenTelemetry tracing of the serving stack: where spans go, and tritonserver's flags for it.

Both tritonserver and the facade export OTLP/HTTP to one receiver. tritonserver traces every
request that carries a W3C `traceparent`, whatever its sampling rate, so it runs with `rate=0`:
it traces exactly the calls the facade sampled (which hand it their context) and the direct
requests whose caller sends a context (an OpenTelemetry-instrumented client does), and its spans
join the caller's trace. Requests without a context are not traced, so no trace is left without
its start, and the sampling ratio is decided in one place, where the call enters.
"""

from __future__ import annotations

TRACES_PATH = "/v1/traces"
SERVICE_NAME = "tritonserver"


def traces_url(endpoint: str) -> str:
    """Where spans go: an OTLP/HTTP base URL (as OTEL_EXPORTER_OTLP_ENDPOINT) plus /v1/traces."""
    endpoint = endpoint.rstrip("/")
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"the OTLP endpoint must be an http:// or https:// URL, got {endpoint!r}")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def check_ratio(ratio: float) -> float:
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"the trace ratio must be within 0..1, got {ratio}")
    return ratio


def triton_trace_args(endpoint: str) -> list[str]:
    """The flags of tritonserver's OpenTelemetry tracing of the requests that carry a context, to `endpoint`."""
    return [
        "--trace-config=mode=opentelemetry",
        # Timestamps of the request, its queue and compute (TENSORS would copy every tensor into the trace).
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=0",
        "--trace-config=count=-1",
        f"--trace-config=opentelemetry,url={traces_url(endpoint)}",
        f"--trace-config=opentelemetry,resource=service.name={SERVICE_NAME}",
    ]
