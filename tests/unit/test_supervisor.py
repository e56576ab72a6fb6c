"""The supervisor's reading of stub command lines, its count of missing instances per model version,
its reload config, the back-off of reloads and the watchdog's decisions (the healing itself is tested
against a real tritonserver in tests/slow/test_faults.py, and across version swaps in
tests/slow/test_model_versions.py)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from tests.helpers import wait_until
from tritonnx.server import supervisor as supervisor_module
from tritonnx.server.prometheus import MetricsPage
from tritonnx.server.repository import read_config
from tritonnx.server.stubs import InstanceWatch, Stub, instance_count, instance_counts, stopped
from tritonnx.server.supervisor import RELOAD_PARAMETER, ReloadBackoff, TritonSupervisor, reload_config
from tritonnx.server.watchdog import WATCHDOG_PARAMETER

STUB_ARGS = [
    "/work/build/backends/python/triton_python_backend_stub",
    "/repo/mobilenet_v3_small/1/model.py",
    "triton_python_backend_shm_region_5d7f0daf",
    "16777216",
    "16777216",
    "7933",
    "/work/build/backends/python",
    "336",
    "mobilenet_v3_small_0_1",
    "DEFAULT",
]
M = "mobilenet_v3_small"


def test_a_stub_command_line_names_its_model_version_instance_and_region():
    stub = Stub.from_command_line(42, STUB_ARGS)
    assert stub == Stub(42, M, "1", "mobilenet_v3_small_0_1", "triton_python_backend_shm_region_5d7f0daf")
    assert stub.key == (M, "1") and not stub.auto_complete


def test_the_auto_complete_stub_of_a_loading_version_is_not_counted_as_an_instance():
    # Triton names the stub it runs for auto-complete after the model, not after an instance.
    args = [*STUB_ARGS[:1], "/repo/mobilenet_v3_small/2/model.py", *STUB_ARGS[2:8], M, "DEFAULT"]
    auto = Stub.from_command_line(7, args)
    assert auto is not None and auto.auto_complete and auto.key == (M, "2")
    live = {7: auto, 42: Stub.from_command_line(42, STUB_ARGS)}
    assert instance_counts(live) == Counter({(M, "1"): 1})


def test_other_children_are_not_stubs():
    assert Stub.from_command_line(1, ["/usr/bin/python3", "-m", "something"]) is None
    assert Stub.from_command_line(1, STUB_ARGS[:5]) is None


def test_the_reload_config_is_the_repository_config_with_its_parameter_bumped(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 16\nversion_policy: { latest: { num_versions: 2 } }\n'
        'input [ { name: "ids" allow_ragged_batch: true } ]\n'
        'parameters { key: "intra_op_thread_count" value: { string_value: "2" } }\n'
    )
    config = read_config(tmp_path / "m")
    first, second = reload_config(config, "1"), reload_config(config, "2")
    assert first["parameters"][RELOAD_PARAMETER] == {"string_value": "1"}
    assert second["parameters"][RELOAD_PARAMETER] == {"string_value": "2"}
    # Policy only: the version policy and the written input flags, no auto-completed tensors.
    assert first["version_policy"] == {"latest": {"num_versions": 2}}
    assert first["input"] == [{"name": "ids", "allow_ragged_batch": True}] and "output" not in first
    assert first["parameters"]["intra_op_thread_count"] == {"string_value": "2"}
    assert RELOAD_PARAMETER not in config["parameters"]


def test_instances_are_counted_from_the_served_config():
    assert instance_count({"instance_group": [{"count": 2, "kind": "KIND_CPU"}, {"count": 3}]}) == 5
    assert instance_count({}) == 1


def counts(**per_version: int) -> Counter:
    """Live instance stubs per version: counts(v1=3, v2=1) for model M."""
    return Counter({(M, name.removeprefix("v")): n for name, n in per_version.items() if n})


def watch_of(**complete: int) -> InstanceWatch:
    """A watch that learned these versions READY with that many instances."""
    watch = InstanceWatch()
    for name, instances in complete.items():
        watch.learn((M, name.removeprefix("v")), instances, ready=True)
    return watch


def test_a_version_that_lost_an_instance_is_short_on_the_second_look():
    watch = watch_of(v1=3)
    assert watch.look(counts(v1=3)) == set()
    assert watch.look(counts(v1=2)) == set()  # a suspect: one look could catch a reload's hand-over
    assert watch.look(counts(v1=2)) == {(M, "1")}
    assert watch.look(counts(v1=2)) == set()  # reported once; its new generation has to come up again
    assert watch.look(counts(v1=5)) == set()  # the reload: old and new generation side by side
    assert watch.look(counts(v1=2)) == set()  # complete again, so short again ...
    assert watch.look(counts(v1=2)) == {(M, "1")}


def test_a_version_still_coming_up_is_not_short():
    watch = InstanceWatch()
    watch.learn((M, "1"), 3, ready=False)  # its config is served, its instances still start
    for live in (1, 2, 2, 2):
        assert watch.look(counts(v1=live)) == set()
    assert watch.look(counts(v1=3)) == set()
    assert watch.look(counts(v1=2)) == set()
    assert watch.look(counts(v1=2)) == {(M, "1")}


def test_a_swap_is_not_a_death_and_the_new_version_is_watched_from_its_first_look():
    """latest-1: version 2 loads beside version 1, then version 1 is unloaded and its stubs exit.

    Per model the count never drops; per version version 1's does, and the supervisor asks Triton,
    which no longer calls it READY (UNLOADING), so it is forgotten, not reloaded.
    """
    watch = watch_of(v1=3)
    assert watch.look(counts(v1=3)) == set()
    assert watch.unknown(counts(v1=3, v2=1)) == {(M, "2")}  # an instance of 2 started, config not served yet
    assert watch.look(counts(v1=3, v2=1)) == set()
    watch.learn((M, "2"), 3, ready=True)
    assert watch.look(counts(v1=3, v2=3)) == set()
    assert watch.look(counts(v1=1, v2=3)) == set()
    assert watch.look(counts(v1=0, v2=3)) == {(M, "1")}  # the caller finds it not READY ...
    watch.forget((M, "1"))  # ... and forgets it
    for _ in range(3):
        assert watch.look(counts(v2=3)) == set()
    assert watch.unknown(counts(v2=3)) == set()
    # A rollback brings version 1 back: learned anew.
    assert watch.unknown(counts(v1=3, v2=3)) == {(M, "1")}


def test_a_stub_killed_right_after_a_swap_is_caught_though_its_version_was_never_seen_complete():
    watch = watch_of(v1=3)
    watch.look(counts(v1=3, v2=2))
    # Version 2 is READY (every instance started) when its count is learned, but one of its three
    # stubs is already gone: READY is what makes it watched.
    watch.learn((M, "2"), 3, ready=True)
    assert watch.look(counts(v1=3, v2=2)) == set()
    assert watch.look(counts(v1=0, v2=2)) == {(M, "2")}  # 2 lost an instance
    assert watch.suspects == {(M, "1")}  # 1 is being unloaded: short from this look on


def test_with_two_versions_served_one_version_losing_a_stub_is_short_though_the_model_has_more_than_enough():
    watch = watch_of(v1=3, v2=3)
    assert watch.look(counts(v1=3, v2=3)) == set()
    assert watch.look(counts(v1=3, v2=2)) == set()
    assert watch.look(counts(v1=3, v2=2)) == {(M, "2")}


class ScriptedSupervisor(TritonSupervisor):
    """The supervisor's own `check_stubs` and `check_hung`, with Triton's answers scripted: which versions are
    READY and their configs (with `parameters`); reloads are recorded instead of sent; time is `now`."""

    def __init__(self, ready: set[str], parameters: dict | None = None) -> None:
        super().__init__(SimpleNamespace(pid=1, metrics_url="http://127.0.0.1:1/metrics"))
        self.ready = ready
        self.parameters = parameters or {}
        self.reloaded: list[str] = []
        self.now = 1000.0
        self.clock = lambda: self.now

    def _served_config(self, model: str, version: str = "") -> dict | None:
        config = {"instance_group": [{"count": 2}], "parameters": self.parameters}
        return config if version in self.ready or not version else None

    def _model_ready(self, model: str, version: str = "") -> bool:
        return version in self.ready

    def reload(self, model: str) -> None:
        self.reloaded.append(model)


def stub_table(*versions: str) -> dict[int, Stub]:
    return {pid: Stub(pid, M, version, f"{M}_0_{pid}", f"region_{pid}") for pid, version in enumerate(versions, 100)}


def test_the_supervisor_forgets_an_unloaded_version_and_reloads_a_ready_one_that_lost_a_stub(monkeypatch):
    looks = iter(
        [
            stub_table("1", "1"),
            stub_table("1", "1", "2", "2"),  # the swap: 2 loaded beside 1
            stub_table("2", "2"),  # 1 unloaded (not READY any more)
            stub_table("2", "2"),
            stub_table("2", "2"),
            stub_table("2"),  # one of 2's stubs killed
            stub_table("2"),
        ]
    )
    monkeypatch.setattr(supervisor_module, "live_stubs", lambda pid: next(looks))
    sup = ScriptedSupervisor(ready={"1"})
    sup.check_stubs()
    sup.ready = {"1", "2"}
    sup.check_stubs()
    sup.ready = {"2"}
    for _ in range(3):
        assert sup.check_stubs() == []
    assert sup.reloaded == []  # the swap healed nothing
    assert sup.check_stubs() == []  # first look short: a suspect
    assert sup.check_stubs() == [M]
    assert sup.reloaded == [M]


def test_two_versions_short_at_once_make_one_reload_of_their_model(monkeypatch):
    tables = iter([stub_table("1", "1", "2", "2"), stub_table("1", "1", "2", "2"), stub_table(), stub_table()])
    monkeypatch.setattr(supervisor_module, "live_stubs", lambda pid: next(tables))
    sup = ScriptedSupervisor(ready={"1", "2"})
    for _ in range(4):
        sup.check_stubs()
    assert sup.reloaded == [M]


def counted(sup: TritonSupervisor, counter: str, model: str) -> float | None:
    """A supervisor counter's value for `model`, as its /metrics page shows it."""
    return sup.metrics.registry.get_sample_value(f"tritonnx_supervisor_{counter}_total", {"model": model})


# --- reloads back off per model -----------------------------------------------------------------------


def test_the_first_reload_is_at_once_and_the_next_ones_back_off_doubling_to_a_cap():
    backoff = ReloadBackoff(first=0.5, cap=4.0, quiet=60.0)
    assert backoff.due("m", 100.0) == 100.0
    backoff.reloaded("m", 100.0)
    assert backoff.due("m", 100.1) == 100.5  # died again right away
    reloads = []
    now = 100.0
    for _ in range(6):  # a model whose stubs die as soon as they start: each reload when it is due
        now = backoff.due("m", now + 0.01)
        backoff.reloaded("m", now)
        reloads.append(round(now, 2))
    gaps = [round(b - a, 2) for a, b in zip([100.0, *reloads], reloads, strict=False)]
    assert gaps == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.due("other", now) == now  # per model
    # A quiet minute since its last reload: the next death is reloaded at once, and backs off from the start.
    quiet = now + 60.0
    assert backoff.due("m", quiet) == quiet
    backoff.reloaded("m", quiet)
    assert backoff.due("m", quiet + 0.1) == quiet + 0.5


def test_a_model_whose_stubs_keep_dying_is_reloaded_when_its_back_off_allows_and_counted(monkeypatch, caplog):
    """Its stubs die right after each reload: the second reload waits 0.5 s, the third 1 s; a look before it is due
    reloads nothing, and each reload put off is counted and logged."""
    full, short = stub_table("1", "1"), stub_table("1")
    tables = iter([full, short, short, full, short, short, short, short, full, short, short, short, short])
    monkeypatch.setattr(supervisor_module, "live_stubs", lambda pid: next(tables))
    caplog.set_level(logging.WARNING, logger="tritonnx.supervisor")
    sup = ScriptedSupervisor(ready={"1"})
    sup.check_stubs()
    sup.check_stubs()
    assert sup.check_stubs() == [M]  # the first death: at once
    sup.now += 0.125  # times in binary fractions: sums of them are exact
    sup.check_stubs()  # the new generation, complete
    sup.check_stubs()
    assert sup.check_stubs() == []  # dead again 0.125 s after its reload: put off until 0.5 s after it
    assert counted(sup, "reload_backoffs", M) == 1
    assert any("backing off: its reload waits 0.4s" in r.getMessage() for r in caplog.records)
    sup.now += 0.25
    assert sup.check_stubs() == []  # not due yet
    sup.now += 0.125
    assert sup.check_stubs() == [M]
    sup.now += 0.125
    sup.check_stubs()
    sup.check_stubs()
    assert sup.check_stubs() == []
    sup.now += 0.75
    assert sup.check_stubs() == []  # 0.875 s after the last reload: the delay doubled to 1 s
    sup.now += 0.125
    assert sup.check_stubs() == [M]
    assert sup.reloaded == [M, M, M]
    assert counted(sup, "reload_backoffs", M) == 2


# --- the watchdog ---------------------------------------------------------------------------------------


def triton_page(pending: int = 0, executions: int = 0, successes: int = 0, failures: int = 0, version: str = "1"):
    """Triton's metrics for model M as its /metrics page has them."""
    labels = f'model="{M}",version="{version}"'
    return MetricsPage.parse(
        f"""# TYPE nv_inference_request_success counter
nv_inference_request_success{{{labels}}} {successes}
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{{{labels},reason="BACKEND"}} {failures}
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{{{labels}}} {executions}
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{{labels}}} {pending}
"""
    )


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen]]:
    """Three real processes standing in for stubs."""
    processes = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    yield processes
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait()


def test_the_watchdog_kills_the_stubs_of_a_hung_version_and_counts_it(monkeypatch, caplog, sleepers):
    *mine, theirs = sleepers
    stubs = {p.pid: Stub(p.pid, M, "1", f"{M}_0_{i}", f"region_{i}") for i, p in enumerate(mine)}
    other = {theirs.pid: Stub(theirs.pid, "other", "1", "other_0_0", "region_other")}  # another model's stub
    monkeypatch.setattr(supervisor_module, "live_stubs", lambda pid: stubs | other)
    pages = iter([triton_page(pending=1, executions=3, successes=3)] * 3)
    monkeypatch.setattr(supervisor_module, "scrape", lambda url, timeout: next(pages))
    caplog.set_level(logging.WARNING, logger="tritonnx.supervisor")
    sup = ScriptedSupervisor(ready={"1"}, parameters={WATCHDOG_PARAMETER: {"string_value": "5"}})
    assert sup.check_hung() == []
    sup.now += 4.0
    assert sup.check_hung() == []
    assert all(p.poll() is None for p in sleepers)
    sup.now += 1.0
    [stall] = sup.check_hung()
    assert stall.version == (M, "1") and stall.limit == 5.0
    for process in mine:
        assert process.wait(10) == -signal.SIGKILL
    assert theirs.poll() is None
    assert counted(sup, "watchdog_kills", M) == 1
    [warning] = [r.getMessage() for r in caplog.records if "watchdog" in r.getMessage()]
    assert warning == (
        f"supervisor: watchdog: {M} version 1 had 1 request(s) waiting and finished no execution for 5s (limit 5s); "
        "killing its 2 stub process(es) so that it is reloaded"
    )


def test_a_stopped_process_is_told_from_a_running_one(sleepers):
    running, halted, _ = sleepers
    stubs = [Stub(p.pid, M, "1", f"i{p.pid}", "r") for p in (running, halted)]
    assert stopped(stubs) == set()
    os.kill(halted.pid, signal.SIGSTOP)  # the kernel stops it a moment later
    wait_until(lambda: stopped(stubs) == {halted.pid}, 10, "the process stopped")
    os.kill(halted.pid, signal.SIGCONT)
    wait_until(lambda: stopped(stubs) == set(), 10, "the process running again")
    assert running.poll() is None
