"""The serving stack: tritonserver, optionally supervised, and optionally the facade in front of it.

One context manager for `make serve`, the benchmarks and the tests:

    with ServingStack(repository, workdir) as stack:       # free loopback ports
        stub = InferenceServiceStub(grpc.insecure_channel(stack.facade.grpc_url))

Logs go to `workdir` (tritonserver.log, facade.log); Triton's Python backend is assembled in
`workdir/backends` unless `backend_dir` says otherwise. Before tritonserver starts, the versions whose
publish never finished are set aside (versions.recover_repository), so that its `--load-model=*`
never serves one unchecked. Stopping drains the facade first, then stops the supervisor and
tritonserver with its stubs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tritonnx.common.admin import new_admin_key
from tritonnx.common.tracing import check_ratio, triton_trace_args
from tritonnx.server.facade import FacadeProcess, start_facade
from tritonnx.server.process import ServerError, free_ports
from tritonnx.server.supervisor import DEFAULT_WATCHDOG_SECONDS, TritonSupervisor
from tritonnx.server.triton import Ports, TritonServer
from tritonnx.server.versions import recover_repository

PORT_ATTEMPTS = 3
# tritonserver's words when one of its ports is taken: "Socket '127.0.0.1:8001' already in use".
TRITON_PORT_TAKEN = "already in use"


@dataclass
class ServingStack:
    repository: Path
    workdir: Path  # logs and Triton's assembled backend directory
    triton_ports: Ports | None = None  # None: free loopback ports
    facade_ports: tuple[int, int] | None = None  # (gRPC, HTTP); None: free loopback ports
    with_facade: bool = True
    facade_args: list[str] = field(default_factory=list)
    supervised: bool = False
    supervisor_interval: float = 0.2  # seconds between its looks at the stubs
    supervisor_metrics_port: int | None = None  # its /metrics (0: a free port); None: not served
    # The supervisor's watchdog: seconds a model may keep requests waiting without finishing an execution (0: off);
    # a model's config.pbtxt overrides it (supervisor.WATCHDOG_PARAMETER).
    watchdog_seconds: float = DEFAULT_WATCHDOG_SECONDS
    triton_http: bool = True
    startup_models: tuple[str, ...] = ("*",)
    all_models_ready: bool = True  # a model that failed to load fails the start (else: listed by model_states)
    admin_key: str = field(default_factory=new_admin_key)
    backend_dir: Path | None = None
    triton_cwd: Path | None = None
    triton_env: dict[str, str] = field(default_factory=dict)
    triton_args: list[str] = field(default_factory=list)  # more tritonserver flags
    stub_venv: Path | None = None  # the venv the Python stub runs with; None: this interpreter's
    ready_timeout: float = 180.0
    log_files: bool = True  # False: the servers write to this process's stdout and stderr (a container's log)
    host: str = "127.0.0.1"  # where Triton's gRPC listens, and its HTTP and metrics unless given below
    http_host: str | None = None  # where Triton's HTTP listens; None: `host`
    metrics_host: str | None = None  # where Triton's and the supervisor's metrics listen; None: `host`
    triton_netns: str = ""  # a network namespace for Triton (host: an address of it); "": this process's
    log_verbose: int = 0
    otlp_endpoint: str = ""  # OpenTelemetry tracing of Triton and the facade to this OTLP/HTTP receiver; "": off
    trace_ratio: float = 0.1  # share of the facade's calls traced (Triton traces those; tritonnx/common/tracing.py)
    triton: TritonServer = field(init=False)
    supervisor: TritonSupervisor | None = field(init=False, default=None)
    facade: FacadeProcess | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.otlp_endpoint:
            check_ratio(self.trace_ratio)
            self.triton_args = [*self.triton_args, *triton_trace_args(self.otlp_endpoint)]
            self.facade_args = [
                "--otlp-endpoint",
                self.otlp_endpoint,
                "--trace-ratio",
                str(self.trace_ratio),
                *self.facade_args,
            ]
        self.triton = TritonServer(
            model_repository=self.repository,
            ports=self.triton_ports or Ports(*free_ports(3)),
            backend_dir=self.backend_dir or self.workdir / "backends",
            log_file=self.workdir / "tritonserver.log" if self.log_files else None,
            host=self.host,
            http_host=self.http_host,
            metrics_host=self.metrics_host,
            log_verbose=self.log_verbose,
            http=self.triton_http,
            startup_models=self.startup_models,
            admin_key=self.admin_key,
            cwd=self.triton_cwd,
            extra_env=self.triton_env,
            extra_args=self.triton_args,
            stub_venv=self.stub_venv,
            netns=self.triton_netns,
        )
        if self.supervised:
            self.supervisor = TritonSupervisor(
                self.triton, self.supervisor_interval, self.ready_timeout, watchdog_seconds=self.watchdog_seconds
            )

    def start(self) -> ServingStack:
        """Tritonserver (and its supervisor), then the facade when the stack has one."""
        self.start_triton()
        if self.with_facade:
            self.start_facade()
        return self

    def start_triton(self) -> TritonServer:
        recover_repository(self.repository)
        for attempt in range(PORT_ATTEMPTS):
            self.triton.start()
            try:
                self.triton.wait_ready(self.ready_timeout, all_models=self.all_models_ready)
                break
            except ServerError:
                # Free ports are free when asked for, not always when tritonserver binds them a moment later.
                if self.triton_ports is not None or attempt + 1 == PORT_ATTEMPTS or not self._port_taken():
                    raise
                self.triton.stop()
                self.triton.ports = Ports(*free_ports(3))
        if self.supervisor is not None:
            self.supervisor.start()
            if self.supervisor_metrics_port is not None:
                self.supervisor_metrics_port = self.supervisor.metrics.serve(
                    self.triton.metrics_address, self.supervisor_metrics_port
                )
        return self.triton

    def _port_taken(self) -> bool:
        return TRITON_PORT_TAKEN in self.triton.log_tail(20)

    def start_facade(self) -> FacadeProcess:
        self.facade = start_facade(
            self.triton.grpc_url,
            self.admin_key,
            self.workdir / "facade.log" if self.log_files else None,
            self.facade_args,
            self.facade_ports,
            timeout=self.ready_timeout,
        )
        return self.facade

    def stop(self) -> dict[str, int | None]:
        """Facade first (it drains), then the supervisor, then tritonserver; their exit codes."""
        codes = {"facade": self.facade.stop() if self.facade is not None else None}
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor.metrics.close()
        codes["tritonserver"] = self.triton.stop()
        return codes

    def __enter__(self) -> ServingStack:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
