"""Prometheus metrics of the facade, in a registry of its own (served on /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Model labels come from the models Triton serves, never from raw request fields, so a caller
# cannot grow the label set without bound.
UNRESOLVED_MODEL = "unresolved"


class FacadeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tritonnx_facade_requests",
            "Predict requests by model and final gRPC status",
            ["model", "code"],
            registry=self.registry,
        )
        self.retries = Counter(
            "tritonnx_facade_triton_retries",
            "Calls sent again to another Triton replica because theirs went away",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "tritonnx_facade_in_flight_requests",
            "Requests being handled now (their body arrived)",
            registry=self.registry,
        )
        self.in_flight_bytes = Gauge(
            "tritonnx_facade_in_flight_bytes",
            "Bytes of the requests being handled now (--max-in-flight-bytes bounds it)",
            registry=self.registry,
        )
        self.receiving = Gauge(
            "tritonnx_facade_receiving_calls",
            "Calls started whose body has not arrived yet (--max-receiving bounds it)",
            registry=self.registry,
        )
        # Set from the gateway when scraped (server.py): bounded by --metadata-cache-size, whatever callers send.
        self.metadata_entries = Gauge(
            "tritonnx_facade_metadata_cache_entries",
            "Model versions whose metadata the facade holds",
            registry=self.registry,
        )
        # Set from the gateway's pool when scraped (server.py): a slot kept by a failed call would show here.
        self.shm_slots_in_use = Gauge(
            "tritonnx_facade_shm_slots_in_use",
            "Shared-memory input slots held by calls on their way to Triton",
            registry=self.registry,
        )
        self.latency = Histogram(
            "tritonnx_facade_request_duration_seconds",
            "Time from a request's arrival to its answer",
            ["model"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )
        payload_buckets = tuple(float(4**k) for k in range(4, 14))  # 256 B .. 64 MiB
        self.request_bytes = Histogram(
            "tritonnx_facade_request_payload_bytes",
            "Tensor bytes received per request",
            ["model"],
            registry=self.registry,
            buckets=payload_buckets,
        )
        self.response_bytes = Histogram(
            "tritonnx_facade_response_payload_bytes",
            "Tensor bytes returned per request",
            ["model"],
            registry=self.registry,
            buckets=payload_buckets,
        )
        self.rejection_latency = Histogram(
            "tritonnx_facade_rejection_duration_seconds",
            "Time from a call's start in the facade to its RESOURCE_EXHAUSTED, by reason (overloaded: no receive place at "
            "the start, or no slot or bytes once the body was read; priority_reserve: once the body was read; too_large)",
            ["reason"],
            registry=self.registry,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.rejections = Counter(
            "tritonnx_facade_rejections",
            "Requests refused, by reason (overloaded, invalid_argument, ...)",
            ["reason"],
            registry=self.registry,
        )
        self.connections_closed = Counter(
            "tritonnx_facade_connections_closed",
            "gRPC connections the facade closed, by reason (resets, unread, reflection_flood, per_address)",
            ["reason"],
            registry=self.registry,
        )

        self.cache_requests = Counter(
            "tritonnx_facade_cache_requests",
            "Requests to models with the result cache on, by model and result (hit, miss)",
            ["model", "result"],
            registry=self.registry,
        )
        self.cache_evictions = Counter(
            "tritonnx_facade_cache_evictions",
            "Cached results dropped to stay within --cache-bytes",
            registry=self.registry,
        )
        self.cache_bytes = Gauge("tritonnx_facade_cache_bytes", "Bytes the result cache holds", registry=self.registry)
        # An answered request's four series, per model: `labels()` takes a lock and checks its labels on every call.
        self._answered: dict[str, tuple[Histogram, Histogram, Histogram, Counter]] = {}

    def answered(self, model: str, seconds: float, received_bytes: int, sent_bytes: int) -> None:
        """Count an answered request: its latency and sizes, then (last: a request is OK or failed, never both) OK."""
        series = self._answered.get(model)
        if series is None:
            series = self._answered[model] = (
                self.latency.labels(model),
                self.request_bytes.labels(model),
                self.response_bytes.labels(model),
                self.requests.labels(model, "OK"),
            )
        latency, received, sent, ok = series
        latency.observe(seconds)
        received.observe(received_bytes)
        sent.observe(sent_bytes)
        ok.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
