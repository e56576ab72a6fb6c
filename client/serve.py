"""python -m client.serve: tritonserver and the facade together, as `make serve` runs them.

Starts tritonserver (backend/tritonserver.py) with the model repository, waits until it is ready,
then starts the facade in a process of its own and waits until its /health answers 200 (a real
inference went through). A supervisor (backend/supervisor.py) reloads a model whose stub process
died and restarts tritonserver if it exits. Ctrl-C or SIGTERM drains the facade first, then stops
Triton.

Triton's restricted APIs (model control, configs, shared memory, statistics) need the admin key:
$TRITONNX_ADMIN_KEY when set, else a new random key written to build/admin-key (mode 600).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from backend.process import ManagedProcess, ServerError, StopRequest
from backend.supervisor import TritonSupervisor
from backend.tritonserver import (
    ADMIN_KEY_ENV,
    DEFAULT_BACKEND_DIR,
    DEFAULT_REPOSITORY,
    GRPC_ADMIN_HEADER,
    PROJECT_ROOT,
    Ports,
    TritonServer,
    format_model_states,
    share_admin_key,
)


@dataclass
class FacadeProcess(ManagedProcess):
    """`python -m client.facade` in its own process group, with the given flags."""

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
            sys.executable, "-m", "client.facade", "--host", self.host, "--port", str(self.grpc_port),
            "--http-port", str(self.http_port), "--triton-url", self.triton_url, *self.extra_args,
        ]
        env = dict(os.environ)
        if self.admin_key:
            env[ADMIN_KEY_ENV] = self.admin_key
        self.spawn(command, env=env, cwd=PROJECT_ROOT)

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m client.serve",
        description="Run tritonserver with the model repository and the gRPC facade in front of it, until Ctrl-C.",
        epilog="Facade flags (e.g. --max-in-flight, --default-model) go after `--`; see python -m client.facade --help.",
    )
    parser.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY, help="default: %(default)s")
    parser.add_argument("--log-dir", type=Path, default=PROJECT_ROOT / "build", help="server logs; default: %(default)s")
    parser.add_argument("--triton-http", action=argparse.BooleanOptionalAction, default=True,
                        help="serve Triton's HTTP endpoint on 8000 (the facade needs only gRPC; --no-triton-http "
                        "turns it off); default: on")
    parser.add_argument("facade_args", nargs="*", help="extra flags for the facade, after `--`")
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    triton = TritonServer(
        model_repository=args.model_repository.resolve(), ports=Ports(), backend_dir=DEFAULT_BACKEND_DIR,
        log_file=args.log_dir / "tritonserver.log", http=args.triton_http,
    )
    key_place = share_admin_key(triton.admin_key)
    supervisor = TritonSupervisor(triton)
    facade = FacadeProcess(extra_args=args.facade_args, log_file=args.log_dir / "facade.log", admin_key=triton.admin_key)
    stop = StopRequest()
    started = time.monotonic()
    try:
        print(f"starting tritonserver with {triton.model_repository} (log: {triton.log_file}) ...", flush=True)
        triton.start()
        triton.wait_ready(timeout=180, all_models=False)  # a model that failed is listed with its reason
        print(f"tritonserver up after {time.monotonic() - started:.1f}s", flush=True)
        print(format_model_states(triton.model_states()), flush=True)
        supervisor.start()
        print(f"starting the facade (log: {facade.log_file}) ...", flush=True)
        facade.start()
        facade.wait_ready()
        print(
            f"ready after {time.monotonic() - started:.1f}s\n"
            f"  Triton   {'HTTP ' + triton.http_url if triton.http else 'HTTP off'}  gRPC {triton.grpc_url}  "
            f"metrics {triton.metrics_url}\n"
            f"  facade   gRPC {facade.grpc_url} (inference.InferenceService)  "
            f"{facade.http_url}/metrics  {facade.http_url}/health\n"
            f"  admin    Triton's restricted APIs want header {GRPC_ADMIN_HEADER} (gRPC) with the key in {key_place}\n"
            "Ctrl-C stops both.",
            flush=True,
        )
        # tritonserver exiting is the supervisor's to heal; the facade exiting ends the run.
        if not stop.wait(facade):
            print("error: the facade exited on its own; stopping tritonserver", file=sys.stderr)
    except ServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        supervisor.stop()
        print(f"facade stopped (exit code {facade.stop()})", flush=True)
        print(f"tritonserver stopped (exit code {triton.stop()})", flush=True)
    return 0 if stop.requested else 1


if __name__ == "__main__":
    sys.exit(main())
