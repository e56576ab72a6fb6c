"""The FastAPI baseline (bench/baseline/app.py) as a child process in its own process group.

The process started becomes gunicorn (the same PID, also the group's ID); its children are the uvicorn workers.
Stopping the group (ManagedProcess.stop) stops the workers too, and returns once every one is gone.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.output import flags
from tritonnx.server.process import ManagedProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
# Each uvicorn worker logs this when its lifespan (the model load) has finished.
_WORKER_READY = b"Application startup complete."


@dataclass(kw_only=True)
class FastApiBaseline(ManagedProcess):
    """`python -m bench.baseline.app` (gunicorn and its uvicorn workers), its output in `log_file` (required)."""

    onnx_file: Path
    port: int
    workers: int
    intra_op_threads: int
    host: str = "127.0.0.1"
    startup_seconds: float = field(default=0.0, init=False)  # from start() until every worker served
    _log_offset: int = field(default=0, init=False, repr=False)  # where this start's lines begin in the log

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def worker_pids(self) -> list[int]:
        """The PIDs of the workers serving now (gunicorn's children), in order."""
        if self.process is None:
            return []
        try:
            return sorted(child.pid for child in psutil.Process(self.process.pid).children())
        except psutil.NoSuchProcess:
            return []

    def start(self, timeout: float = 60) -> None:
        """Start it and block until every worker has loaded the model and /health answers 200 (else stop it)."""
        if self.log_file is None:
            raise ValueError("the baseline's readiness is read from its log: give it a log_file")
        options = {
            "--model": Path(self.onnx_file).resolve(),
            "--host": self.host,
            "--port": self.port,
            "--workers": self.workers,
            "--intra-op-threads": self.intra_op_threads,
        }
        command = [sys.executable, "-m", "bench.baseline.app", *flags(options)]
        self._log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        started = time.monotonic()
        self.spawn(command, cwd=REPO_ROOT)
        try:
            self.wait_until(self._ready, f"the FastAPI baseline on port {self.port}", timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def _ready(self) -> bool:
        # /health alone would answer as soon as one worker is up: the log tells when all of them are.
        assert self.log_file is not None
        with self.log_file.open("rb") as log:
            log.seek(self._log_offset)
            if log.read().count(_WORKER_READY) < self.workers:
                return False
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def __enter__(self) -> FastApiBaseline:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
