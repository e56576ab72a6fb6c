"""The facade's settings: one dataclass, filled from flags, then environment variables, then defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

ENV_PREFIX = "TRITONNX_"
SECRETS = ("auth_token", "admin_key")


@dataclass(frozen=True)
class FacadeSettings:
    host: str = "127.0.0.1"
    port: int = 50051
    http_port: int = 3000
    port_file: str = ""
    triton_url: str = "127.0.0.1:8001"
    default_model: str = "resnet50"
    max_in_flight: int = 64
    max_message_bytes: int = 64 * 1024 * 1024
    max_image_bytes: int = 8 * 1024 * 1024
    shm_slots: int = 64
    shm_slot_bytes: int = 1024 * 1024
    retry_after_ms: int = 100
    health_interval: float = 2.0
    health_timeout: float = 5.0
    model_info_ttl: float = 30.0
    drain_seconds: float = 10.0
    auth_token: str = ""
    admin_key: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    reflection: bool = True
    log_level: str = "INFO"
    cache_models: str = ""
    cache_bytes: int = 64 * 1024 * 1024
    otlp_endpoint: str = ""
    trace_ratio: float = 0.1


_HELP = {
    "host": "address to bind the gRPC and HTTP servers to",
    "port": "gRPC port of inference.InferenceService, grpc.health.v1 and reflection (0: a free one, see --port-file)",
    "http_port": "HTTP port of /metrics (Prometheus) and /health (0: a free one, see --port-file)",
    "port_file": 'once both ports listen, write the ports bound to this file as JSON {"grpc": N, "http": M} '
    "(written whole: a new file renamed into place); empty: none",
    "triton_url": "Triton's KServe v2 gRPC endpoint: host:port, several comma-separated (replicas, taken in turn), "
    "or a name resolving to several (a headless Service); a call whose replica went away goes once to another",
    "default_model": "model served when a request names none",
    "max_in_flight": "requests handled at once; beyond it callers get RESOURCE_EXHAUSTED at once",
    "max_message_bytes": "largest request or response message",
    "max_image_bytes": "largest image file Classify takes; a larger one gets INVALID_ARGUMENT before reaching Triton",
    "shm_slots": "requests whose inputs can be in shared memory with Triton at once (0: none; the rest use the socket)",
    "shm_slot_bytes": "inputs up to this size go to Triton through shared memory (larger ones use the socket)",
    "retry_after_ms": "retry hint sent with RESOURCE_EXHAUSTED (trailer grpc-retry-pushback-ms)",
    "health_interval": "seconds between real-inference health probes",
    "health_timeout": "seconds a health probe may take before it counts as failed",
    "model_info_ttl": "seconds model metadata is cached before it is asked of Triton again",
    "drain_seconds": "grace period for in-flight calls after SIGTERM",
    "auth_token": "when set, inference calls need metadata `authorization: Bearer <token>` (else UNAUTHENTICATED); "
    "prefer the environment variable, flags show in `ps`",
    "admin_key": "key of Triton's restricted APIs (shared memory, repository index, model control), as given to "
    "tritonserver's restricted-protocol option; prefer the environment variable",
    "tls_cert": "PEM certificate chain: serve gRPC over TLS (with --tls-key)",
    "tls_key": "PEM private key of --tls-cert",
    "reflection": "serve gRPC server reflection (turn off in production: 0)",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
    "cache_models": "comma-separated models whose results the facade caches (by model, version, every input's name, "
    "datatype, shape and bytes, and the outputs asked for); none by default",
    "cache_bytes": "most bytes of results the cache keeps; the least recently used go first",
    "otlp_endpoint": "OpenTelemetry tracing: base URL of an OTLP/HTTP receiver (e.g. http://127.0.0.1:4318; spans go "
    "to <url>/v1/traces, JSON-encoded) and each traced call's context goes to Triton as traceparent; empty: tracing "
    "off. OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and OTEL_BSP_* apply",
    "trace_ratio": "share of calls traced (0..1) when tracing is on; a call whose traceparent is sampled is always "
    "traced, one whose traceparent is not sampled never",
}


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "on", "yes"):
        return True
    if lowered in ("0", "false", "off", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected 1/0 or true/false, got {value!r}")


# A setting's annotation (a string under `from __future__ import annotations`) -> its parser.
_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str, "bool": _boolean}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; its default comes from the environment when set there."""
    for field in fields(FacadeSettings):
        flag = "--" + field.name.replace("_", "-")
        env_value = os.environ.get(env_name(field.name))
        kind = _PARSERS[str(field.type)]
        default = kind(env_value) if env_value is not None else field.default
        parser.add_argument(
            flag,
            type=kind,
            default=default,
            dest=field.name,
            help=f"{_HELP[field.name]} (env {env_name(field.name)}"
            + ("; never shown)" if field.name in SECRETS else "; default: %(default)s)"),
        )


def from_arguments(namespace: argparse.Namespace) -> FacadeSettings:
    return FacadeSettings(**{field.name: getattr(namespace, field.name) for field in fields(FacadeSettings)})
