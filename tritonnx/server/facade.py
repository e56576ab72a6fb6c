"""The facade (`python -m tritonnx.client.facade`) as a child process in its own process group.

Its ports are the ones it reports: it binds (0: a free port), then writes the ports bound to a port file in a folder
of its own, which `wait_ready` reads. No port is picked here and bound there later, so none can be taken in between.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tritonnx.common.admin import ADMIN_KEY_ENV
from tritonnx.common.ports import TRITON_GRPC, local
from tritonnx.server.process import ManagedProcess


@dataclass
class FacadeProcess(ManagedProcess):
    """`python -m tritonnx.client.facade` with the given flags; `extra_args` go after the ones set here.

    `grpc_port` and `http_port` are asked for (0: a free one) until `wait_ready` learned the ones bound.
    """

    grpc_port: int = 0
    http_port: int = 0
    triton_url: str = local(TRITON_GRPC)
    host: str = "127.0.0.1"
    extra_args: list[str] = field(default_factory=list)
    admin_key: str = ""  # Triton's restricted-API key, handed over in the environment (flags show in `ps`)
    port_file: Path | None = field(init=False, default=None)

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def start(self) -> None:
        self.port_file = Path(tempfile.mkdtemp(prefix="tritonnx-facade-")) / "ports.json"
        command = [
            sys.executable,
            "-m",
            "tritonnx.client.facade",
            "--host",
            self.host,
            "--port",
            str(self.grpc_port),
            "--http-port",
            str(self.http_port),
            "--triton-url",
            self.triton_url,
            *self.extra_args,
            "--port-file",  # last: the ports are learned from this file, whatever the extra flags say
            str(self.port_file),
        ]
        env = dict(os.environ)
        if self.admin_key:
            env[ADMIN_KEY_ENV] = self.admin_key
        self.spawn(command, env=env)

    def _ports_reported(self) -> bool:
        """Whether the facade wrote its port file; takes the ports from it when it did."""
        if self.port_file is None:
            return False
        ports = json.loads(self.port_file.read_text())  # written whole (a rename) or not at all
        self.grpc_port, self.http_port = int(ports["grpc"]), int(ports["http"])
        return True

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"{self.http_url}/health", timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def wait_listening(self, timeout: float = 60.0) -> None:
        """Block until the facade reported the ports it listens on (grpc_port and http_port are those then)."""
        self.wait_until(self._ports_reported, "the facade", timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the facade listens and /health answers 200: a real inference went through Triton."""
        deadline = time.monotonic() + timeout
        self.wait_listening(timeout)
        self.wait_until(lambda: self.health()[0] == 200, "the facade", max(0.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM: the facade drains in-flight calls first."""
        code = super().stop(timeout)
        if self.port_file is not None:
            shutil.rmtree(self.port_file.parent, ignore_errors=True)
        return code


def start_facade(
    triton_url: str,
    admin_key: str,
    log_file: Path | None,
    extra_args: list[str] | None = None,
    ports: tuple[int, int] | None = None,
    timeout: float = 60.0,
) -> FacadeProcess:
    """A facade in front of `triton_url`, on `ports` (gRPC, HTTP) or free ones, ready (or stopped and raising)."""
    grpc_port, http_port = ports or (0, 0)
    facade = FacadeProcess(
        grpc_port=grpc_port,
        http_port=http_port,
        triton_url=triton_url,
        log_file=log_file,
        admin_key=admin_key,
        extra_args=list(extra_args or []),
    )
    facade.start()
    try:
        facade.wait_ready(timeout)
    except BaseException:
        facade.stop()
        raise
    return facade
