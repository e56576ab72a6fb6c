"""The supervisor's Prometheus metrics: what it healed, and which models Triton calls ready.

Triton's own metrics (port 8002) say nothing of a stub that died and was reloaded (or whose reload
waited for its back-off), nor of a hung model whose stubs the watchdog killed, nor of a tritonserver
that was restarted, nor (in 2.51) whether a model is ready; the supervisor knows all of them. Served
on their own port (`tritonnx-serve --supervisor-metrics-port`, default 8003).
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from tritonnx.server.process import ServerError


class SupervisorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.model_reloads = Counter(
            "tritonnx_supervisor_model_reloads",
            "Models reloaded because one of their Python stub processes died",
            ["model"],
            registry=self.registry,
        )
        self.reload_backoffs = Counter(
            "tritonnx_supervisor_reload_backoffs",
            "Reloads of a model put off because its stubs died again within a minute of its last reload",
            ["model"],
            registry=self.registry,
        )
        self.watchdog_kills = Counter(
            "tritonnx_supervisor_watchdog_kills",
            "Times the watchdog killed a model's stubs: requests waiting and no execution finished, or a stub stopped, "
            "for the model's watchdog seconds",
            ["model"],
            registry=self.registry,
        )
        self.server_restarts = Counter(
            "tritonnx_supervisor_server_restarts",
            "Times tritonserver exited and the supervisor started it again",
            registry=self.registry,
        )
        self.model_ready = Gauge(
            "tritonnx_model_ready",
            "1 while Triton has a version of the model READY, else 0 (from its repository index)",
            ["model"],
            registry=self.registry,
        )
        self._server: WSGIServer | None = None

    def set_model_states(self, ready: dict[str, bool]) -> None:
        """Every model of the repository index, ready or not; a model's counters start at 0."""
        for model, is_ready in ready.items():
            self.model_ready.labels(model).set(1 if is_ready else 0)
            for counter in (self.model_reloads, self.reload_backoffs, self.watchdog_kills):
                counter.labels(model)

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (0: a free port) from a thread; the port."""
        try:
            server, _ = start_http_server(port, host, registry=self.registry)
        except OSError as error:
            raise ServerError(
                f"cannot serve the supervisor's metrics on {host}:{port}: {error}; "
                "give another --supervisor-metrics-port (TRITONNX_SUPERVISOR_METRICS_PORT), or -1 for none"
            ) from error
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
