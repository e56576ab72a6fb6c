"""Start, wait for and stop the FastAPI baseline server (bench/baseline/app.py) as a subprocess.

The process started becomes gunicorn (the same PID); its children are the uvicorn workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]
# Each uvicorn worker logs this when its lifespan (the model load) has finished.
_WORKER_READY = "Application startup complete."


def living_group_members(pgid: int) -> list[psutil.Process]:
    """Processes of group `pgid` that have not exited.

    Zombies are left out: a child that outlives the gunicorn master is re-parented to PID 1, and a container's PID 1
    may never reap it.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


@dataclass(eq=False)
class FastApiBaseline:
    """`python -m bench.baseline.app` in its own process group (gunicorn and its uvicorn workers)."""

    onnx_file: Path
    port: int
    workers: int
    intra_op_threads: int
    host: str = "127.0.0.1"
    log_file: Path | None = None
    # Seconds from start() until wait_ready() saw every worker serving.
    startup_seconds: float | None = field(default=None, init=False)
    _owns_log: bool = field(default=False, init=False, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _started_at: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.onnx_file = Path(self.onnx_file)
        self._owns_log = self.log_file is None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The gunicorn master's PID, which is also the process group's ID."""
        return None if self._proc is None else self._proc.pid

    def worker_pids(self) -> list[int]:
        """The PIDs of the workers serving now (gunicorn's children), in order."""
        if self._proc is None:
            return []
        try:
            return sorted(child.pid for child in psutil.Process(self._proc.pid).children())
        except psutil.NoSuchProcess:
            return []

    def start(self) -> None:
        """Launch the server; the log (stdout and stderr) goes to `log_file`, a temporary file if none was given."""
        if self._proc is not None:
            raise RuntimeError(f"{self!r} is already started")
        if self.log_file is None:
            fd, name = tempfile.mkstemp(prefix="fastapi-baseline-", suffix=".log")
            os.close(fd)
            self.log_file = Path(name)
        command = [
            sys.executable, "-m", "bench.baseline.app",
            "--model", str(self.onnx_file.resolve()),
            "--host", self.host,
            "--port", str(self.port),
            "--workers", str(self.workers),
            "--intra-op-threads", str(self.intra_op_threads),
        ]  # fmt: skip
        with open(self.log_file, "wb") as log:
            self._started_at = time.monotonic()
            # A session of its own, so stop() reaches the workers too by signalling the group.
            self._proc = subprocess.Popen(
                command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def log_text(self) -> str:
        """The server's log so far."""
        if self.log_file is None or not self.log_file.exists():
            return ""
        return self.log_file.read_text(errors="replace")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_ready(self, timeout: float = 60) -> None:
        """Block until every worker has loaded the model and /health answers 200; sets `startup_seconds`."""
        if self._proc is None:
            raise RuntimeError(f"{self!r} is not started")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"{self!r} exited with code {self._proc.returncode} before it was ready; log:\n{self.log_tail()}"
                )
            # /health alone would answer as soon as one worker is up: the log tells when all of them are.
            if self.log_text().count(_WORKER_READY) >= self.workers and self._health_ok():
                self.startup_seconds = time.monotonic() - self._started_at
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self!r} not ready after {timeout} s; log:\n{self.log_tail()}")

    def _health_ok(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL to what is left after 10 s; removes a temporary log."""
        if self._proc is None:
            return
        pgid = self._proc.pid
        self._signal_group(pgid, signal.SIGTERM)
        if not self._wait_group_gone(self._proc, timeout=10):
            self._signal_group(pgid, signal.SIGKILL)
            self._wait_group_gone(self._proc, timeout=5)
        self._proc = None
        if self._owns_log and self.log_file is not None:
            self.log_file.unlink(missing_ok=True)
            self.log_file = None

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass

    @staticmethod
    def _wait_group_gone(proc: subprocess.Popen[bytes], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc.poll()  # reap the gunicorn master so it does not linger as our zombie
            if not living_group_members(proc.pid):
                return True
            time.sleep(0.05)
        return False

    def __enter__(self) -> FastApiBaseline:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
