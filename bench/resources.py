"""Memory (PSS: the server and its stub processes share pages) and start-up time of servers."""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from backend.tritonserver import DEFAULT_REPOSITORY, Ports, TritonServer


@dataclass(frozen=True)
class Memory:
    rss_mib: float
    pss_mib: float
    processes: int

    def as_dict(self) -> dict:
        return {"rss_mib": round(self.rss_mib, 1), "pss_mib": round(self.pss_mib, 1), "processes": self.processes}


def tree_memory(pid: int) -> Memory:
    """RSS and PSS summed over a process and all its descendants."""
    root = psutil.Process(pid)
    rss = pss = 0
    processes = [root, *root.children(recursive=True)]
    for process in processes:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += info.pss
    return Memory(rss / 2**20, pss / 2**20, len(processes))


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


def one_model_repository(model: str, workdir: Path, repository: Path = DEFAULT_REPOSITORY) -> Path:
    """`workdir/repo` holding only `model` (a symlink into `repository`): a server of that model alone."""
    (workdir / "repo").mkdir()
    (workdir / "repo" / model).symlink_to((repository / model).resolve())
    return workdir / "repo"


def measure_triton_startup(model: str, ports: Ports, repository: Path = DEFAULT_REPOSITORY, timeout: float = 180) -> Startup:
    """Start tritonserver with only `model` (a repository of one symlink) and time it to READY."""
    workdir = Path(tempfile.mkdtemp(prefix="tritonnx-startup-"))
    try:
        server = TritonServer(
            model_repository=one_model_repository(model, workdir, repository), ports=ports, backend_dir=workdir / "backends",
            log_file=workdir / "tritonserver.log",
        )
        started = time.perf_counter()
        server.start()
        try:
            deadline = time.monotonic() + timeout
            while not _model_ready(server, model):
                if server.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{model} did not become ready:\n{server.log_tail(30)}")
                time.sleep(0.02)
            ready = time.perf_counter() - started
            time.sleep(1.0)  # let the stubs settle before reading memory
            return Startup(model, ready, tree_memory(server.process.pid))
        finally:
            server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
