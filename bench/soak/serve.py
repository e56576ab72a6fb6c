"""The soak's stack, run as `make serve` runs it: `python -m tritonnx.commands.serve` in a process of its own.

That process holds the supervisor (a thread watching tritonserver's stubs and the server) and starts tritonserver
and the facade (with its defaults) as its children; so its memory, fds and threads are the supervisor's, sampled apart
from the load generator's. Ports are free loopback ones, logs and Triton's assembled backend go to the run's folder,
and the admin key is handed over in its environment (the publishes need it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil

from tritonnx.common.admin import ADMIN_KEY_ENV, new_admin_key
from tritonnx.common.paths import BUILD_ENV
from tritonnx.server.process import ManagedProcess, ServerError, free_ports

CHECKOUT = Path(__file__).resolve().parents[1]
READY_LINE = "Ctrl-C stops it."  # tritonnx.commands.serve's last line once the facade answered a real inference


class ServeProcess(ManagedProcess):
    def __init__(self, repository: Path, workdir: Path, timeout: float = 300.0) -> None:
        self.workdir, self.timeout = workdir, timeout
        self.log_file = workdir / "serve.log"
        self.admin_key = new_admin_key()
        http, grpc, metrics, supervisor, facade_grpc, facade_http = free_ports(6)
        self.triton_grpc_url, self.facade_url = f"127.0.0.1:{grpc}", f"127.0.0.1:{facade_grpc}"
        self._args = [
            "--model-repository", str(repository), "--log-dir", str(workdir), "--http-port", str(http),
            "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--supervisor-metrics-port", str(supervisor),
            "--", "--port", str(facade_grpc), "--http-port", str(facade_http),
        ]  # fmt: skip

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, BUILD_ENV: str(self.workdir / "build"), ADMIN_KEY_ENV: self.admin_key}
        self.spawn([sys.executable, "-m", "tritonnx.commands.serve", *self._args], env=env, cwd=CHECKOUT)
        self.wait_until(lambda: READY_LINE in self.log_tail(5), "python -m tritonnx.commands.serve", self.timeout)

    def children(self) -> tuple[int, int]:
        """(tritonserver's pid, the facade's pid), the serve process's children."""
        triton = facade = None
        for child in psutil.Process(self.pid).children():
            command = " ".join(child.cmdline())
            if child.name() == "tritonserver" or "/tritonserver " in command:
                triton = child.pid
            elif "tritonnx.client.facade" in command:
                facade = child.pid
        if triton is None or facade is None:
            raise ServerError(f"tritonserver or the facade is not a child of tritonnx.commands.serve (pid {self.pid})")
        return triton, facade
