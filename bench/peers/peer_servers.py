"""The peers: PyTriton, Ray Serve and MLServer, each a `server.py` under bench/peers/<peer>/ run from a venv of its own.

bench/peers/servers.py has the servers every benchmark shares (tritonnx, FastAPI) and how any server is measured.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from bench.load.http import HttpTarget
from bench.load.targets import KServeTarget, Request, Target
from bench.output import flags, say
from bench.peers import venvs
from bench.peers.servers import READY_TIMEOUT_S, Policy, Server
from tritonnx.server.process import ManagedProcess, ServerError, free_ports

BATCH_WAIT_MS = 1.0  # for peers whose batching waits for a full batch: short, against a closed loop
# Debian's python3.11 for PyTriton (see bench/peers/pytriton/requirements.txt), PYTRITON_PYTHON to change it.
PYTRITON_PYTHON = os.environ.get("PYTRITON_PYTHON", "/usr/bin/python3.11")
PEERS = ("pytriton", "rayserve", "mlserver")


@dataclass(eq=False)
class VenvPeer(Server):
    """A peer's `server.py` run by its venv's Python: KServe v2 gRPC, or HTTP with `ready_path` (200 once serving)."""

    name: str
    peer: str  # folder under bench/peers/
    description: str
    model: str
    onnx_file: Path
    workers: int
    max_batch_size: int
    batch_wait_ms: float
    workdir: Path
    ready_path: str | None = None
    ready_log: str | None = None  # a line the peer's log must also hold (Ray's proxy answers before the app)
    threads: int = 1  # ONNX Runtime intra-op threads per worker
    extra_ports: tuple[str, ...] = ()  # options that each take a free port of their own
    interpreter: str = venvs.DEFAULT_PYTHON
    _port: int = field(default=0, init=False, repr=False)

    def command(self, python: Path, ports: list[int]) -> list[str]:
        self._port = ports[0]
        options = {
            "--model": self.onnx_file.resolve(),
            "--name": self.model,
            "--port": ports[0],
            "--workers": self.workers,
            "--threads": self.threads,
            "--max-batch-size": self.max_batch_size,
            "--batch-wait-ms": self.batch_wait_ms,
            "--workdir": self.workdir,
            **dict(zip(self.extra_ports, ports[1:], strict=True)),
        }
        return [str(python), "-m", f"bench.peers.{self.peer}.server", *flags(options)]

    def start(self) -> None:
        """Start the peer; once more when it exits before it is ready."""
        # Its own start-up race (PyTriton's handshake was refused once in CI) is not what the benchmark measures.
        try:
            self._start_once()
        except ServerError as error:
            say(f"  {self.name} exited before it was ready; starting it once more ({str(error).splitlines()[0]})")
            self._start_once()

    def _start_once(self) -> None:
        python = venvs.ensure(self.peer, self.interpreter)
        command = self.command(python, free_ports(1 + len(self.extra_ports)))
        # The peer imports bench.peers.common from this checkout; its own workers (MLServer's, Ray's) too.
        env = {
            **os.environ,
            "PYTHONPATH": str(venvs.ROOT),
            "RAY_USAGE_STATS_ENABLED": "0",
            "VIRTUAL_ENV": str(python.parent.parent),
            "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.process = process = ManagedProcess(log_file=self.workdir / f"{self.peer}.log")
        process.spawn(command, env=env, cwd=venvs.ROOT)
        try:
            process.wait_until(lambda: self._ready(process), self.name, READY_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def _ready(self, process: ManagedProcess) -> bool:
        if self.ready_log and self.ready_log not in process.log_tail(200):
            return False
        try:
            if self.ready_path is None:
                with grpcclient.InferenceServerClient(f"127.0.0.1:{self._port}") as client:
                    return bool(client.is_model_ready(self.model))
            with urllib.request.urlopen(f"http://127.0.0.1:{self._port}{self.ready_path}", timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError, InferenceServerException):
            return False  # not listening yet, or not ready

    def target(self, images: Sequence[Request] | None = None, expected: Sequence[np.ndarray] | None = None) -> Target:
        url = f"127.0.0.1:{self._port}"
        if self.ready_path is not None:
            return HttpTarget(url, 1, name=self.name, model=self.model, images=images, expected=expected)
        target = KServeTarget(url, self.model, 1, images=images, expected=expected)
        target.name = self.name
        return target


def peer(name: str, model: str, onnx_file: Path, policy: Policy, workdir: Path) -> VenvPeer:
    """The peer `name` in its best documented setup under `policy`."""
    common: dict[str, Any] = {
        "peer": name,
        "model": model,
        "onnx_file": onnx_file,
        "workdir": workdir,
        "max_batch_size": policy.max_batch_size,
    }
    if name == "pytriton":
        return VenvPeer(
            name="PyTriton",
            workers=policy.triton_instances,
            threads=policy.triton_threads,
            batch_wait_ms=policy.triton_delay_ms,
            extra_ports=("--http-port", "--metrics-port"),
            interpreter=PYTRITON_PYTHON,
            description=f"PyTriton 0.7: @batch callables, {policy.triton_instances} instances x "
            f"{policy.triton_threads} thread(s), dynamic batching "
            f"up to {policy.max_batch_size} (the model's config.pbtxt); KServe v2 gRPC, raw tensors",
            **common,
        )
    if name == "rayserve":
        return VenvPeer(
            name="Ray Serve",
            ready_path="/-/healthz",
            ready_log="application ready",
            workers=policy.workers,
            batch_wait_ms=BATCH_WAIT_MS,
            description=f"Ray Serve: {policy.workers} replicas x 1 CPU, @serve.batch up to {policy.max_batch_size} "
            f"(wait {BATCH_WAIT_MS} ms); raw float32 body",
            **common,
        )
    if name == "mlserver":
        return VenvPeer(
            name="MLServer",
            workers=policy.workers,
            batch_wait_ms=BATCH_WAIT_MS,
            extra_ports=("--http-port", "--metrics-port"),
            description=f"MLServer: {policy.workers} parallel workers, adaptive batching up to "
            f"{policy.max_batch_size} ({BATCH_WAIT_MS} ms); KServe v2 gRPC, raw tensors",
            **common,
        )
    raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
