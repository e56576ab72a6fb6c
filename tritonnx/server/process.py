"""A server started as a child process in its own process group, with its output in a log file.

Both tritonserver (with its Python stub processes) and the facade are run this way by `make
serve`, the tests and the benchmark, and so are the benchmark's other servers (the FastAPI baseline,
the peers); stopping the group stops everything the server started, and returns once all of it is
gone. Tests and benchmarks put them on free loopback ports, so they run next to `make serve`.

A child started from the main thread gets SIGTERM when this process dies, however it dies (Linux's
PR_SET_PDEATHSIG, set by setpriv before it execs the command): a killed test run or benchmark leaves
no server behind. Linux ties that signal to the thread that started the child, so children started
from other threads (the supervisor's restarts) go only with their process group.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import psutil


class ServerError(RuntimeError):
    """A server could not be found, started, or made ready."""


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the OS has just handed out as free."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# util-linux's setpriv (on every Debian and Ubuntu) sets the parent-death signal, then execs the command. Python's
# preexec_fn could do it without a helper, but forking a process whose other threads are in gRPC and running Python
# in the child crashed the child now and then (SIGSEGV before exec).
_SETPRIV = shutil.which("setpriv")


def _dying_with_parent(command: list[str]) -> list[str]:
    """`command`, run so that it gets SIGTERM when this thread dies; unchanged off the main thread or without setpriv."""
    if _SETPRIV is None or threading.current_thread() is not threading.main_thread():
        return command
    return [_SETPRIV, "--pdeathsig", "TERM", "--", *command]


# How long stop() waits for the SIGKILLed members of a group to exit (a process in uninterruptible sleep may not).
GROUP_EXIT_SECONDS = 10.0


def _living_members(pgid: int) -> list[psutil.Process]:
    """The processes of group `pgid` that have not exited.

    Zombies are left out: a member that outlives the group's leader is re-parented to PID 1, and a container's PID 1 may
    never reap it.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    members = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


@dataclass
class ManagedProcess:
    log_file: Path | None = None
    process: subprocess.Popen | None = None

    def spawn(self, command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        output = open(self.log_file, "ab") if self.log_file else None  # noqa: SIM115 - lives with the process
        self.process = subprocess.Popen(
            _dying_with_parent(command),
            env=env,
            cwd=cwd,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ServerError("the process was never started")
        return self.process.pid

    def wait_until(self, ready: Callable[[], bool], what: str, timeout: float) -> None:
        """Poll `ready` until it answers True; raise with the log tail if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise ServerError(f"{what} exited with code {code} before it was ready{self.log_hint()}")
            try:
                if ready():
                    return
            except (OSError, ValueError):
                pass  # not listening yet, or half-started
            time.sleep(0.1)
        raise ServerError(f"{what} was not ready after {timeout:.0f}s{self.log_hint()}")

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_file or not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def log_hint(self) -> str:
        tail = self.log_tail()
        return f"; last lines of {self.log_file}:\n{tail}" if tail else ""

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM the process group, SIGKILL it if it lingers; return the exit code once the whole group is gone."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        try:  # children left behind by a crashed parent share its process group
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # Killed members take a moment to exit: until then they hold ports, shared memory and CPU.
        deadline = time.monotonic() + GROUP_EXIT_SECONDS
        while _living_members(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.process.returncode


class StopRequest:
    """Set by SIGTERM or SIGINT (Ctrl-C): a foreground command then stops its servers and exits."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._request)
        signal.signal(signal.SIGINT, self._request)

    def _request(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def wait(self, *servers: ManagedProcess) -> bool:
        """Block until a stop is requested (True) or one of `servers` exits on its own (False)."""
        while not self.requested and all(s.process is not None and s.process.poll() is None for s in servers):
            time.sleep(0.2)
        return self.requested
