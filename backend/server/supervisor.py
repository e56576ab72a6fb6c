"""Keeps a tritonserver serving without a person.

Two faults Triton 2.51 does not heal by itself:

* A Python stub process dies (`kill -9`, out of memory): Triton never restarts it, keeps the
  model READY and fails every request the scheduler hands to that instance with INTERNAL
  "Stub process ... is not healthy". The supervisor counts the live stubs of each model version
  (stubs.py): a version that had all its instances and has fewer on two looks in a row while
  Triton still calls it READY lost one. Versions are counted apart: a swap replaces one
  version's stubs with another's on purpose (the old version is UNLOADING, no longer READY,
  when its stubs exit), and with two versions served a lost stub would hide in the model's
  total. It reloads that model through Triton's model-control API (explicit mode). Triton skips
  a load whose config is unchanged, so the reload carries the model's config.pbtxt with a
  `tritonnx.reload` parameter bumped: the versions its version_policy selects in the repository
  load again, each auto-completed from its own graph (the served config would carry the default
  version's inputs and outputs into the others), and the old instances serve until the new ones
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

from backend.server.metrics import SupervisorMetrics
from backend.server.model_control import ControlError, TritonControl
from backend.server.process import ServerError
from backend.server.repository import read_config
from backend.server.stubs import InstanceWatch, Stub, instance_count, instance_counts, live_stubs
from backend.server.triton import TritonServer

log = logging.getLogger("tritonnx.supervisor")

RELOAD_PARAMETER = "tritonnx.reload"
# After a reload, how long the old generation's stubs get to stop on their own.
RETIRE_AFTER_SECONDS = 5.0
# How often the models' states (tritonnx_model_ready) are read from Triton's repository index.
STATES_EVERY_SECONDS = 2.0


def reload_config(config: dict, generation: str) -> dict:
    """`config` (the model's config.pbtxt as JSON) with the reload parameter set, so that Triton loads it anew."""
    config = json.loads(json.dumps(config))
    config.setdefault("parameters", {})[RELOAD_PARAMETER] = {"string_value": generation}
    return config


class TritonSupervisor:
    """Watches one TritonServer (started in explicit model-control mode) from a thread and heals it."""

    def __init__(
        self,
        server: TritonServer,
        interval: float = 0.2,
        ready_timeout: float = 180.0,
        metrics: SupervisorMetrics | None = None,
    ) -> None:
        self.server = server
        self.metrics = metrics or SupervisorMetrics()
        self.interval = interval
        self.ready_timeout = ready_timeout
        self.reloads: list[tuple[float, str]] = []  # (time.monotonic(), model)
        self.restarts: list[float] = []
        self._stubs: dict[int, Stub] = {}  # as of the last look: a dead stub's model and region
        self._watch = InstanceWatch()
        self._retiring: list[tuple[float, list[Stub]]] = []  # (when, stubs of a replaced generation)
        self._states_due = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.check_stubs()  # learn the stubs before any can die unseen
        self.refresh_model_states()
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
                if time.monotonic() >= self._states_due:
                    self.refresh_model_states()
            except Exception:  # the watch must outlive any one failed attempt
                log.exception("supervisor: healing attempt failed; trying again")

    def check_stubs(self) -> list[str]:
        """One look at the stubs; reload the models that lost one. Returns the models reloaded."""
        live = live_stubs(self.server.pid)
        counts = instance_counts(live)
        for model, version in self._watch.unknown(counts):
            config = self._served_config(model, version)
            if config is not None:  # else it is being loaded or unloaded: learned on a later look
                self._watch.learn((model, version), instance_count(config), self._model_ready(model, version))
        confirmed = self._watch.look(counts)
        reloaded = []
        for model, version in sorted(confirmed):
            if model in reloaded:
                continue  # another version of it was short too: one reload loads them all
            if not self._model_ready(model, version):
                self._watch.forget((model, version))  # being unloaded on purpose (a swap, a retired version)
                continue
            gone = [s for p, s in self._stubs.items() if s.key == (model, version) and p not in live]
            log.warning(
                "supervisor: stub process of %s version %s is gone (instance %s); reloading the model",
                model,
                version,
                ", ".join(sorted(stub.instance for stub in gone)),
            )
            old_generation = [stub for stub in self._stubs.values() if stub.model == model]
            self.reload(model)
            self._retiring.append((time.monotonic() + RETIRE_AFTER_SECONDS, old_generation))
            reloaded.append(model)
        # Remember the gone stubs of a version still short (their regions are removed when it is reloaded).
        suspects = self._watch.suspects
        self._stubs = live | {p: s for p, s in self._stubs.items() if s.key in suspects and p not in live}
        return reloaded

    def refresh_model_states(self) -> None:
        """Set tritonnx_model_ready of every model in Triton's repository index."""
        self._states_due = time.monotonic() + STATES_EVERY_SECONDS
        with self._control() as control:
            try:
                index = control.index()
            except ControlError:
                return  # stopping or restarting: the process watch deals with it
        ready: dict[str, bool] = {}
        for entry in index:
            ready[entry["name"]] = ready.get(entry["name"], False) or entry.get("state") == "READY"
        self.metrics.set_model_states(ready)

    def _control(self) -> TritonControl:
        return TritonControl(self.server.grpc_url, self.server.admin_key)

    # While tritonserver stops (SIGTERM unloads every model, which looks like lost stubs) or loads,
    # it answers "Server not ready" or "unknown model": nothing to heal, and the process watch
    # restarts a server that exits.
    def _served_config(self, model: str, version: str = "") -> dict | None:
        with self._control() as control:
            try:
                return control.config(model, version)
            except ControlError:
                return None

    def _model_ready(self, model: str, version: str = "") -> bool:
        with self._control() as control:
            try:
                return control.ready(model, version)
            except ControlError:
                return False

    def reload(self, model: str) -> None:
        """Load the model again from its config.pbtxt (explicit model control, with the admin key).

        The versions its version_policy selects in the repository are loaded, as any load would.
        """
        started = time.monotonic()
        if self._served_config(model) is None:
            raise RuntimeError(f"{model} is no longer served; nothing to reload")
        config = reload_config(read_config(self.server.model_repository / model), f"{time.time():.6f}")
        with self._control() as control:
            control.load(model, config)
        self.reloads.append((time.monotonic(), model))
        self.metrics.model_reloads.labels(model).inc()
        log.warning("supervisor: %s reloaded in %.1fs", model, time.monotonic() - started)

    def _retire_due(self) -> None:
        """Stop what is left of a replaced generation of stubs, and remove their shared-memory names."""
        now = time.monotonic()
        due = [stubs for when, stubs in self._retiring if when <= now]
        self._retiring = [(when, stubs) for when, stubs in self._retiring if when > now]
        for stubs in due:
            live = live_stubs(self.server.pid)
            lingering = [stub for stub in stubs if live.get(stub.pid) == stub]  # the same process, not a reused pid
            for stub in lingering:
                try:
                    os.kill(stub.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for stub in stubs:
                _unlink_region(stub)
            if lingering:
                log.warning(
                    "supervisor: stopped %d idle stub(s) of %s's replaced generation, which Triton "
                    "cannot unload after a stub died",
                    len(lingering),
                    stubs[0].model,
                )

    def _restart_server(self, backoff: float) -> None:
        code = self.server.process.returncode if self.server.process else None
        log.error("supervisor: tritonserver exited with code %s; restarting it in %.1fs", code, backoff)
        self.metrics.server_restarts.inc()
        self.server.stop()  # its process group: stubs that outlived it
        self._remove_stub_regions()
        if self._stop.wait(backoff):
            return
        started = time.monotonic()
        self.server.start()
        try:
            self.server.wait_ready(self.ready_timeout, all_models=False)  # the models it had, loaded or not
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
        self._watch.clear()
        self._retiring.clear()


def _unlink_region(stub: Stub) -> None:
    try:
        os.unlink(f"/dev/shm/{stub.shm_region}")
    except FileNotFoundError:
        pass
