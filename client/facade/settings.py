"""The facade's settings (`FacadeSettings`): every flag with its environment variable and default.

Declared with tritonnx/common/settings.py's mechanism, which `tritonnx-serve`'s settings use too.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from tritonnx.common.ports import FACADE_GRPC, FACADE_HTTP, TRITON_GRPC, local
from tritonnx.common.settings import add_flags, setting, settings_from


@dataclass(frozen=True)
class FacadeSettings:
    host: str = setting("127.0.0.1", "address to bind the gRPC and HTTP servers to")
    port: int = setting(
        FACADE_GRPC,
        "gRPC port of inference.InferenceService, grpc.health.v1 and reflection (0: a free one, see --port-file)",
    )
    http_port: int = setting(
        FACADE_HTTP, "HTTP port of /metrics (Prometheus) and /health (0: a free one, see --port-file)"
    )
    port_file: str = setting(
        "",
        'once both ports listen, write the ports bound to this file as JSON {"grpc": N, "http": M} (written whole: '
        "a new file renamed into place); empty: none",
    )
    triton_url: str = setting(
        local(TRITON_GRPC),
        "Triton's KServe v2 gRPC endpoint: host:port, several comma-separated (replicas, taken in turn), or a name "
        "resolving to several (a headless Service); a call whose replica went away goes once to another",
    )
    default_model: str = setting(
        "",
        "the model of a request that names none, and the one /health probes; empty: resnet50 while Triton serves it, "
        "else the one model Triton serves; with several, requests name theirs and /health probes the first by name "
        "with numeric inputs",
    )
    max_in_flight: int = setting(
        64,
        "requests handled at once, counted once their body arrived; beyond it callers get RESOURCE_EXHAUSTED at once "
        "(the last quarter is kept for priority 1)",
    )
    max_in_flight_bytes: int = setting(
        128 * 1024 * 1024,
        "bytes of request messages handled at once; a request that would exceed it gets RESOURCE_EXHAUSTED at once "
        "(one alone is always taken); with --max-message-bytes it bounds the facade's memory",
    )
    max_receiving: int = setting(
        128,
        "calls started whose body has not arrived yet; beyond it a new call takes the place of the oldest of the "
        "connection holding the most places (when it holds more than the new call's), else gets RESOURCE_EXHAUSTED",
    )
    max_receiving_per_connection: int = setting(
        64,
        "calls of one connection whose body has not arrived yet; beyond it that connection's new calls get "
        "RESOURCE_EXHAUSTED at once",
    )
    max_receiving_bytes: int = setting(
        128 * 1024 * 1024,
        "bytes of bodies on their way (the facade's memory above its level when nothing is received); beyond it the "
        "calls waiting longest for their body get RESOURCE_EXHAUSTED (0: no bound)",
    )
    body_timeout: float = setting(
        10.0,
        "seconds a call's body may take to arrive from the call's start (else DEADLINE_EXCEEDED): a caller that opens "
        "calls and sends nothing holds nothing longer",
    )
    send_timeout: float = setting(
        2.0,
        "seconds an answer may wait for its caller to read it; then its connection is closed, ending its calls "
        "(callers that never read cannot hold calls open)",
    )
    max_resets_per_second: int = setting(
        100,
        "calls one connection may cancel before their body arrived, per second; beyond it the connection is closed "
        "(HTTP/2 rapid reset)",
    )
    http_request_timeout: float = setting(
        10.0,
        "seconds a connection to the HTTP port may take to send a whole request, from its connect or its previous "
        "answer; then it is closed (slow headers and idle keep-alive connections hold nothing)",
    )
    max_predict_streams: int = setting(
        64, "PredictStreams open at once (a quarter of them per connection); beyond it RESOURCE_EXHAUSTED"
    )
    max_health_watches: int = setting(16, "grpc.health.v1 Watch streams open at once; beyond it RESOURCE_EXHAUSTED")
    health_watch_seconds: float = setting(
        300.0, "a health Watch stream ends (OK) after this long; its caller watches again"
    )
    max_connections: int = setting(1024, "gRPC connections open at once; more are closed as they arrive")
    max_connections_per_address: int = setting(
        256,
        "gRPC connections from one address open at once (0: no limit); beyond it the address's newest are closed "
        "within a second, those answered lately last, so that one address cannot hold all of --max-connections "
        "(behind a proxy every caller has the proxy's address: raise it to the proxy's connections, or 0)",
    )
    max_connection_idle: float = setting(
        300.0, "seconds a gRPC connection may carry no call before it is closed with GOAWAY (0: never)"
    )
    max_connection_age: float = setting(
        3600.0,
        "seconds after which a gRPC connection gets GOAWAY (its calls get --max-connection-age-grace to finish; "
        "clients reconnect; 0: never)",
    )
    max_connection_age_grace: float = setting(
        30.0, "seconds the calls of a connection past its age get before it is closed"
    )
    max_message_bytes: int = setting(
        16 * 1024 * 1024,
        "largest request or response message (gRPC answers RESOURCE_EXHAUSTED beyond it); the largest demo request, "
        "resnet50 at batch 16, is 9.6 MB",
    )
    max_image_bytes: int = setting(
        8 * 1024 * 1024,
        "largest image file Classify takes; a larger one gets INVALID_ARGUMENT before reaching Triton",
    )
    max_image_pixels: int = setting(
        16_000_000,
        "most pixels Classify decodes an image to (a JPEG at the reduced scale the pipeline decodes it at, from its "
        "header); beyond it INVALID_ARGUMENT before reaching Triton; within it the decoded bytes count against "
        "--max-in-flight-bytes",
    )
    stream_max_in_flight: int = setting(
        16,
        "requests of one PredictStream handled or waiting to be read back at once; the stream's next request is read "
        "only when one is answered and read, so a caller that stops reading is slowed by gRPC's flow control",
    )
    max_streams_per_connection: int = setting(
        256,
        "concurrent calls on one HTTP/2 connection (its SETTINGS_MAX_CONCURRENT_STREAMS); gRPC's core refuses the "
        "streams a client opens past it (REFUSED_STREAM, UNAVAILABLE to gRPC callers, which may retry)",
    )
    request_timeout: float = setting(
        60.0,
        "deadline of a call that sets none (no gRPC deadline, no timeout_ms): Triton's answer is awaited this long at "
        "most, so a hung model cannot hold a call forever",
    )
    metadata_cache_size: int = setting(
        1024, "model versions whose metadata is held at most; the least recently used go first"
    )
    shm_slots: int = setting(
        64,
        "slots of shared memory with Triton (0: none); a request's inputs take as many adjacent slots as they need, "
        "and go through the socket when no such run is free",
    )
    shm_slot_bytes: int = setting(1024 * 1024, "bytes of one shared-memory slot")
    retry_after_ms: int = setting(100, "retry hint sent with RESOURCE_EXHAUSTED (trailer grpc-retry-pushback-ms)")
    priority_lane: tuple[str, ...] = setting(
        help="MODEL=LANE, repeatable: a Predict call at priority 1 that names MODEL and no version goes to LANE, the "
        "same graph served under a second name with instances of its own (docs/facade.md#a-latency-lane); while "
        "LANE is not served, to MODEL",
        factory=tuple,
    )
    health_interval: float = setting(2.0, "seconds between real-inference health probes")
    health_timeout: float = setting(5.0, "seconds a health probe may take before it counts as failed")
    model_info_ttl: float = setting(30.0, "seconds model metadata is cached before it is asked of Triton again")
    drain_seconds: float = setting(10.0, "grace period for in-flight calls after SIGTERM")
    allow_unauthenticated: bool = setting(
        False,
        "serve inference without a token on an address other than loopback (the facade refuses to start that way "
        "otherwise): for a network where something else authenticates callers",
    )
    auth_token: str = setting(
        "",
        "when set, every gRPC call (inference, health, reflection) needs metadata `authorization: Bearer <token>` "
        "(else UNAUTHENTICATED); prefer the environment variable, flags show in `ps`",
        secret=True,
    )
    admin_key: str = setting(
        "",
        "key of Triton's restricted APIs (shared memory, repository index, model control), as given to "
        "tritonserver's restricted-protocol option; prefer the environment variable",
        secret=True,
    )
    tls_cert: str = setting("", "PEM certificate chain: serve gRPC over TLS (with --tls-key)")
    tls_key: str = setting("", "PEM private key of --tls-cert")
    reflection: bool = setting(True, "serve gRPC server reflection (turn off in production: 0)")
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR")
    cache_models: str = setting(
        "",
        "comma-separated models whose results the facade caches (by model, version, every input's name, datatype, "
        "shape and bytes, and the outputs asked for); none by default",
    )
    cache_bytes: int = setting(
        64 * 1024 * 1024, "most bytes of results the cache keeps; the least recently used go first"
    )
    otlp_endpoint: str = setting(
        "",
        "OpenTelemetry tracing: base URL of an OTLP/HTTP receiver (e.g. http://127.0.0.1:4318; spans go to "
        "<url>/v1/traces, JSON-encoded) and each traced call's context goes to Triton as traceparent; empty: "
        "tracing off. OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and OTEL_BSP_* apply",
    )
    trace_caller_rate: float = setting(
        100.0,
        "most calls per second traced because the caller's traceparent asks for it (beyond it they are traced at "
        "--trace-ratio): callers cannot make the facade trace every call",
    )
    trace_ratio: float = setting(
        0.1,
        "share of calls traced (0..1) when tracing is on; a call whose traceparent is sampled is always traced, one "
        "whose traceparent is not sampled never",
    )


def priority_lanes(pairs: Sequence[str]) -> dict[str, str]:
    """--priority-lane's MODEL=LANE pairs as a mapping; ValueError naming a malformed pair."""
    lanes = {}
    for pair in pairs:
        model, _, lane = pair.partition("=")
        if not model.strip() or not lane.strip() or model.strip() == lane.strip():
            raise ValueError(f"--priority-lane {pair!r}: give MODEL=LANE, two model names, e.g. resnet50=resnet50_lane")
        lanes[model.strip()] = lane.strip()
    return lanes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The facade's flags."""
    add_flags(parser, FacadeSettings)


def from_arguments(namespace: argparse.Namespace) -> FacadeSettings:
    return settings_from(namespace, FacadeSettings)
