"""Keeps a tritonserver serving without a person.

Faults Triton 2.51 does not heal by itself:

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
  A model whose stubs keep dying is not reloaded in a tight loop: the first reload comes at once,
  the next ones wait for a delay doubling from 0.5 s to 30 s while its stubs die again within a
  minute of its last reload (`ReloadBackoff`).
* A stub that hangs in `execute` (a deadlock, a call that never returns): Triton 2.51 keeps the
  request it holds, and those queued behind it, forever. A stopped stub (SIGSTOP) is no better:
  Triton fails every request it hands it after a second ("Stub process is not healthy") without
  ever running it, for as long as it stays stopped. The watchdog (watchdog.py) reads Triton's
  metrics and the stubs: a model version with requests waiting that finished no execution for the
  watchdog's time, one of whose stubs has been stopped that long, or one of whose stubs computed
  nothing that long while its requests waited (it hangs while the others serve) gets its stubs
  killed (that one stub only, in the last case); the dead-stub healing above then reloads it.
  60 s by default (`watchdog_seconds`), per model the config.pbtxt parameter
  `tritonnx.watchdog_seconds`; 0 turns it off.
* tritonserver itself exits (SIGKILL, SIGTERM from outside, a crash): the supervisor removes what
  it left behind (stubs in its process group, their shared-memory regions) and starts it again on
  the same ports, backing off while it keeps failing.

Before it restarts tritonserver or reloads a model, it sets aside the versions whose publish never
finished (versions.py), so that neither brings one in unchecked.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from tritonnx.client.model_control import ControlError, TritonControl
from tritonnx.server.metrics import SupervisorMetrics
from tritonnx.server.process import ServerError
from tritonnx.server.prometheus import MetricsPage, scrape
from tritonnx.server.repository import read_config
from tritonnx.server.stubs import InstanceWatch, Stub, instance_count, instance_counts, live_stubs, stopped
from tritonnx.server.triton import TritonServer
from tritonnx.server.versions import ModelFolder, recover_model, recover_repository
from tritonnx.server.watchdog import (
    DEFAULT_WATCHDOG_SECONDS,
    WATCHDOG_EVERY_SECONDS,
    Stall,
    Version,
    Watchdog,
    cpu_seconds,
    watchdog_limit,
)

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


class ReloadBackoff:
    """When a model whose stubs died may be reloaded: at once, unless it was reloaded less than `quiet` seconds ago.

    Then its reload waits `first` seconds after the last one, twice as long each time it is needed again within
    `quiet` seconds of the last, up to `cap`.
    """

    def __init__(self, first: float = 0.5, cap: float = 30.0, quiet: float = 60.0) -> None:
        self.first, self.cap, self.quiet = first, cap, quiet
        self._last: dict[str, float] = {}  # model -> when it was last reloaded
        self._delay: dict[str, float] = {}  # model -> how long its next reload waits after the last one

    def due(self, model: str, now: float) -> float:
        """When a reload of `model` needed at `now` may run (`now` when it may run at once)."""
        last = self._last.get(model)
        if last is None or now - last >= self.quiet:
            return now
        return max(now, last + self._delay[model])

    def reloaded(self, model: str, now: float) -> None:
        last = self._last.get(model)
        if last is None or now - last >= self.quiet:
            self._delay[model] = self.first
        else:
            self._delay[model] = min(self._delay[model] * 2, self.cap)
        self._last[model] = now


class TritonSupervisor:
    """Watches one TritonServer (started in explicit model-control mode) from a thread and heals it."""

    def __init__(
        self,
        server: TritonServer,
        interval: float = 0.2,
        ready_timeout: float = 180.0,
        metrics: SupervisorMetrics | None = None,
        watchdog_seconds: float = DEFAULT_WATCHDOG_SECONDS,
    ) -> None:
        self.server = server
        self.metrics = metrics or SupervisorMetrics()
        self.interval = interval
        self.ready_timeout = ready_timeout
        self.watchdog_seconds = watchdog_seconds  # per model: WATCHDOG_PARAMETER in its config.pbtxt
        self.clock: Callable[[], float] = time.monotonic
        self.reloads: list[tuple[float, str]] = []  # (time.monotonic(), model)
        self.restarts: list[float] = []
        self.watchdog_kills: list[tuple[float, Stall]] = []
        self._stubs: dict[int, Stub] = {}  # as of the last look: a dead stub's model and region
        self._watch = InstanceWatch()
        self._backoff = ReloadBackoff()
        self._pending_reloads: set[str] = set()  # models that lost a stub, waiting for their back-off
        self._watchdog = Watchdog()
        self._watchdog_due = 0.0
        self._metrics_unreadable = False
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
                if self.clock() >= self._watchdog_due:
                    self.check_hung()
                if time.monotonic() >= self._states_due:
                    self.refresh_model_states()
            except Exception:  # the watch must outlive any one failed attempt
                log.exception("supervisor: healing attempt failed; trying again")

    def check_stubs(self) -> list[str]:
        """One look at the stubs; reload the models that lost one, as their back-off allows. Returns the models reloaded."""
        live = live_stubs(self.server.pid)
        counts = instance_counts(live)
        for model, version in self._watch.unknown(counts):
            config = self._served_config(model, version)
            if config is not None:  # else it is being loaded or unloaded: learned on a later look
                self._watch.learn((model, version), instance_count(config), self._model_ready(model, version))
        for model, version in sorted(self._watch.look(counts)):
            if not self._model_ready(model, version):
                self._watch.forget((model, version))  # being unloaded on purpose (a swap, a retired version)
                continue
            gone = [s for p, s in self._stubs.items() if s.key == (model, version) and p not in live]
            log.warning(
                "supervisor: stub process of %s version %s is gone (instance %s); reloading the model",
                model,
                version,
                ", ".join(sorted(stub.instance for stub in gone)) or "killed before it was seen",
            )
            if model not in self._pending_reloads:  # another version of it was short too: one reload loads them all
                self._pending_reloads.add(model)
                self._defer_if_backing_off(model)
        reloaded = []
        now = self.clock()
        for model in sorted(self._pending_reloads):
            if self._backoff.due(model, now) > now:
                continue
            self._pending_reloads.discard(model)
            old_generation = [stub for stub in self._stubs.values() if stub.model == model]
            self._backoff.reloaded(model, now)
            self.reload(model)
            self._retiring.append((time.monotonic() + RETIRE_AFTER_SECONDS, old_generation))
            self._watchdog.restart(model, self.clock())
            reloaded.append(model)
        # Remember the gone stubs of a version still short, and of a model waiting for its reload (their regions are
        # removed once it is reloaded).
        suspects = self._watch.suspects
        self._stubs = live | {
            p: s
            for p, s in self._stubs.items()
            if (s.key in suspects or s.model in self._pending_reloads) and p not in live
        }
        return reloaded

    def _defer_if_backing_off(self, model: str) -> None:
        now = self.clock()
        due = self._backoff.due(model, now)
        if due > now:
            self.metrics.reload_backoffs.labels(model).inc()
            log.warning("supervisor: %s's stubs keep dying; backing off: its reload waits %.1fs", model, due - now)

    def check_hung(self) -> list[Stall]:
        """One look of the watchdog; kill the stubs of the model versions that hang. Returns what it found hung."""
        now = self.clock()
        self._watchdog_due = now + WATCHDOG_EVERY_SECONDS
        try:
            page: MetricsPage | None = scrape(self.server.metrics_url, timeout=WATCHDOG_EVERY_SECONDS)
            self._metrics_unreadable = False
        except (OSError, ValueError) as error:
            if not self._metrics_unreadable:
                log.warning("supervisor: cannot read Triton's metrics (%s); the watchdog waits for them", error)
            self._metrics_unreadable = True
            page = None
        live = live_stubs(self.server.pid)
        instances = [stub for stub in live.values() if not stub.auto_complete]
        stalls = self._watchdog.look(
            now, page, instances, stopped(instances), self._watchdog_limit, cpu_seconds(instances)
        )
        for stall in stalls:
            victims = [s for s in instances if s.key == stall.version and (s.pid in stall.pids or not stall.pids)]
            if not victims:
                continue  # no stubs of its own (an ensemble): what hangs is one of its steps, watched by itself
            model, version = stall.version
            if stall.pids:
                why = f"has a stub that computed nothing while {stall.pending} request(s) waited (the others served)"
            elif stall.pending:
                why = f"had {stall.pending} request(s) waiting and finished no execution"
            else:
                why = "has a stub process stopped"
            log.warning(
                "supervisor: watchdog: %s version %s %s for %.0fs (limit %gs); killing its %d stub process(es) "
                "so that it is reloaded",
                model,
                version,
                why,
                stall.seconds,
                stall.limit,
                len(victims),
            )
            for stub in victims:
                try:
                    os.kill(stub.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.metrics.watchdog_kills.labels(model).inc()
            self.watchdog_kills.append((time.monotonic(), stall))
        return stalls

    def _watchdog_limit(self, version: Version) -> float:
        return watchdog_limit(self._served_config(*version), self.watchdog_seconds)

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
        folder = ModelFolder(self.server.model_repository / model)
        recover_model(folder, log.warning)  # the reload loads what is on disk: never a version left unchecked
        config = reload_config(read_config(folder.path), f"{time.time():.6f}")
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
        recover_repository(self.server.model_repository, log.warning)
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
        self._pending_reloads.clear()
        self._watchdog.clear()
        self._retiring.clear()


def _unlink_region(stub: Stub) -> None:
    try:
        os.unlink(f"/dev/shm/{stub.shm_region}")
    except FileNotFoundError:
        pass
