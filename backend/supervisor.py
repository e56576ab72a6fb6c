"""Keeps a tritonserver serving without a person.

Two faults Triton 2.51 does not heal by itself:

* A Python stub process dies (`kill -9`, out of memory): Triton never restarts it, keeps the
  model READY and fails every request the scheduler hands to that instance with INTERNAL
  "Stub process ... is not healthy". Triton does not reap the dead stub either, so it stays a
  zombie child of tritonserver; a stub Triton stopped itself is reaped at once. The supervisor
  takes a zombie stub as the signal and reloads its model through Triton's model-control API
  (explicit mode). Triton skips a load whose config is unchanged, so the reload carries the served
  config with a `tritonnx.reload` parameter bumped; the old instances serve until the new ones
  are ready. Once a request has reached the dead instance, Triton 2.51 never finishes unloading
  the old generation of the model (its unload waits forever), so its stubs would live on,
  idle, until the server stops: the supervisor stops them itself a few seconds after the reload
  and removes their shared-memory names (the server's own mapping goes when it exits).
* tritonserver itself exits (SIGKILL, SIGTERM from outside, a crash): the supervisor removes what
  it left behind (stubs in its process group, their shared-memory regions) and starts it again on
  the same ports, backing off while it keeps failing.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from backend.process import ServerError
from backend.tritonserver import TritonServer

log = logging.getLogger("tritonnx.supervisor")

STUB_EXECUTABLE = "triton_python_backend_stub"
RELOAD_PARAMETER = "tritonnx.reload"
# After a reload, how long the old generation's stubs get to stop on their own.
RETIRE_AFTER_SECONDS = 5.0


@dataclass(frozen=True)
class Stub:
    """One Python backend stub process, from its command line:
    `stub <repo>/<model>/<version>/model.py <shm region> <sizes> <parent pid> <backend dir> <ipc> <instance> <kind>`."""

    pid: int
    model: str
    instance: str
    shm_region: str

    @classmethod
    def from_command_line(cls, pid: int, args: list[str]) -> "Stub | None":
        if len(args) < 9 or not args[0].endswith(STUB_EXECUTABLE):
            return None
        return cls(pid=pid, model=Path(args[1]).parent.parent.name, instance=args[8], shm_region=args[2])


def stub_processes(server_pid: int) -> tuple[dict[int, Stub], set[int]]:
    """tritonserver's live stubs by pid, and its zombie children: stubs that died without Triton
    stopping them (a zombie no longer shows its command line)."""
    live, zombies = {}, set()
    try:
        children = psutil.Process(server_pid).children()
    except psutil.NoSuchProcess:
        return live, zombies
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                zombies.add(child.pid)
            elif (stub := Stub.from_command_line(child.pid, child.cmdline())) is not None:
                live[child.pid] = stub
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return live, zombies


def reload_config(served: dict, generation: str) -> dict:
    """The served config with the reload parameter set, so that Triton loads it anew."""
    config = json.loads(json.dumps(served))
    config.setdefault("parameters", {})[RELOAD_PARAMETER] = {"string_value": generation}
    return config


class TritonSupervisor:
    """Watches one TritonServer (started in explicit model-control mode) from a thread and heals it."""

    def __init__(self, server: TritonServer, interval: float = 0.2, ready_timeout: float = 180.0) -> None:
        self.server = server
        self.interval = interval
        self.ready_timeout = ready_timeout
        self.reloads: list[tuple[float, str]] = []  # (time.monotonic(), model)
        self.restarts: list[float] = []
        self._stubs: dict[int, Stub] = {}
        self._suspects: set[int] = set()  # zombies seen once: a stub Triton stops is reaped right away
        self._handled: set[int] = set()
        self._retiring: list[tuple[float, list[Stub]]] = []  # (when, stubs of a replaced generation)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stubs.update(stub_processes(self.server.process.pid)[0])  # a zombie no longer shows its model
        self._thread = threading.Thread(target=self._run, name="triton-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before the server is stopped on purpose)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.wait(self.interval):
            try:
                if self.server.process is not None and self.server.process.poll() is not None:
                    self._restart_server(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                if self.restarts and time.monotonic() - self.restarts[-1] > 60:
                    backoff = 0.5  # a minute of serving: the next failure is not a crash loop
                self.check_stubs()
                self._retire_due()
            except Exception:  # the watch must outlive any one failed attempt
                log.exception("supervisor: healing attempt failed; trying again")

    def check_stubs(self) -> list[str]:
        """One look at the stubs; reload the models of those that died. Returns the models reloaded."""
        pid = self.server.process.pid
        live, zombies = stub_processes(pid)
        # Forget stubs Triton reaped; remember the zombies' models, which only their past command lines tell.
        self._stubs = {p: stub for p, stub in self._stubs.items() if p in zombies} | live
        self._handled &= zombies
        new_zombies = zombies - self._handled
        confirmed = new_zombies & self._suspects
        self._suspects = new_zombies - confirmed
        dead = [self._stubs[p] for p in confirmed if p in self._stubs]
        models = sorted({stub.model for stub in dead})
        for model in models:
            instances = ", ".join(sorted(stub.instance for stub in dead if stub.model == model))
            log.warning("supervisor: stub process of %s died (instance %s); reloading the model", model, instances)
            old_generation = [stub for stub in self._stubs.values() if stub.model == model]
            self.reload(model)  # if it fails, the zombies are suspects again and the next looks retry
            self._handled |= {stub.pid for stub in old_generation if stub.pid in confirmed}
            self._retiring.append((time.monotonic() + RETIRE_AFTER_SECONDS, old_generation))
        return models

    def reload(self, model: str) -> None:
        """Load the model again with its served config (explicit model control, with the admin key)."""
        import tritonclient.grpc as grpcclient  # only the serving process needs the client

        started = time.monotonic()
        with grpcclient.InferenceServerClient(self.server.grpc_url) as client:
            served = client.get_model_config(model, headers=self.server.admin_headers, as_json=True)["config"]
            config = reload_config(served, f"{time.time():.6f}")
            client.load_model(model, config=json.dumps(config), headers=self.server.admin_headers)
        self.reloads.append((time.monotonic(), model))
        log.warning("supervisor: %s reloaded in %.1fs", model, time.monotonic() - started)

    def _retire_due(self) -> None:
        """Stop what is left of a replaced generation of stubs, and remove their shared-memory names."""
        now = time.monotonic()
        due = [stubs for when, stubs in self._retiring if when <= now]
        self._retiring = [(when, stubs) for when, stubs in self._retiring if when > now]
        for stubs in due:
            live = stub_processes(self.server.process.pid)[0]
            lingering = [stub for stub in stubs if live.get(stub.pid) == stub]  # the same process, not a reused pid
            for stub in lingering:
                try:
                    os.kill(stub.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._handled |= {stub.pid for stub in lingering}  # their zombies are not deaths to heal
            for stub in stubs:
                _unlink_region(stub)
            if lingering:
                log.warning("supervisor: stopped %d idle stub(s) of %s's replaced generation, which Triton "
                            "cannot unload after a stub died", len(lingering), stubs[0].model)

    def _restart_server(self, backoff: float) -> None:
        code = self.server.process.returncode
        log.error("supervisor: tritonserver exited with code %s; restarting it in %.1fs", code, backoff)
        self.server.stop()  # its process group: stubs that outlived it
        self._remove_stub_regions()
        if self._stop.wait(backoff):
            return
        started = time.monotonic()
        self.server.start()
        try:
            self.server.wait_ready(self.ready_timeout)
        except ServerError as error:
            log.error("supervisor: tritonserver did not come back: %s", error)
            return
        self.restarts.append(time.monotonic())
        log.warning("supervisor: tritonserver serving again after %.1fs", time.monotonic() - started)

    def _remove_stub_regions(self) -> None:
        """Stubs killed with their server cannot unlink their shared memory: do it for them."""
        for stub in self._stubs.values():
            _unlink_region(stub)
        self._stubs.clear()
        self._suspects.clear()
        self._handled.clear()
        self._retiring.clear()


def _unlink_region(stub: Stub) -> None:
    try:
        os.unlink(f"/dev/shm/{stub.shm_region}")
    except FileNotFoundError:
        pass
