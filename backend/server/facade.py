"""The facade (`python -m client.facade`) as a child process in its own process group."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from backend.server.admin import ADMIN_KEY_ENV
from backend.server.process import ManagedProcess, free_ports


@dataclass
class FacadeProcess(ManagedProcess):
    """`python -m client.facade` with the given flags; `extra_args` go after the ones set here."""

    grpc_port: int = 50051
    http_port: int = 3000
    triton_url: str = "127.0.0.1:8001"
    host: str = "127.0.0.1"
    extra_args: list[str] = field(default_factory=list)
    admin_key: str = ""  # Triton's restricted-API key, handed over in the environment (flags show in `ps`)

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "client.facade",
            "--host",
            self.host,
            "--port",
            str(self.grpc_port),
            "--http-port",
            str(self.http_port),
            "--triton-url",
            self.triton_url,
            *self.extra_args,
        ]
        env = dict(os.environ)
        if self.admin_key:
            env[ADMIN_KEY_ENV] = self.admin_key
        self.spawn(command, env=env)

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"{self.http_url}/health", timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until /health answers 200: a real inference went through Triton."""
        self.wait_until(lambda: self.health()[0] == 200, "the facade", timeout)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM: the facade drains in-flight calls first."""
        return super().stop(timeout)


def start_facade(
    triton_url: str,
    admin_key: str,
    log_file: Path | None,
    extra_args: list[str] | None = None,
    ports: tuple[int, int] | None = None,
    timeout: float = 60.0,
) -> FacadeProcess:
    """A facade in front of `triton_url`, on `ports` (gRPC, HTTP) or free ones, ready (or stopped and raising)."""
    grpc_port, http_port = ports or free_ports(2)
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
