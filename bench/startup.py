"""Start-up time of tritonserver serving one model, and its memory once idle."""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench import REPOSITORY
from bench.usage import Memory, tree_memory
from tritonnx.server.repository import link_models
from tritonnx.server.triton import Ports, TritonServer


@dataclass(frozen=True)
class Startup:
    model: str
    ready_seconds: float  # process start until the model answers ready
    memory: Memory  # idle, right after ready

    def as_dict(self) -> dict:
        return {"model": self.model, "ready_seconds": round(self.ready_seconds, 2), **self.memory.as_dict()}


def _model_ready(server: TritonServer, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def measure_triton_startup(model: str, ports: Ports, repository: Path = REPOSITORY, timeout: float = 180) -> Startup:
    """Start tritonserver with only `model` (linked from `repository`) and time it to READY."""
    workdir = Path(tempfile.mkdtemp(prefix="tritonnx-startup-"))
    try:
        server = TritonServer(
            model_repository=link_models(workdir / "repo", {model: repository / model}),
            ports=ports,
            backend_dir=workdir / "backends",
            log_file=workdir / "tritonserver.log",
        )
        started = time.perf_counter()
        server.start()
        assert server.process is not None
        try:
            deadline = time.monotonic() + timeout
            while not _model_ready(server, model):
                if server.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{model} did not become ready:\n{server.log_tail(30)}")
                time.sleep(0.02)
            ready = time.perf_counter() - started
            time.sleep(1.0)  # let the stubs settle before reading memory
            return Startup(model, ready, tree_memory(server.pid))
        finally:
            server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
