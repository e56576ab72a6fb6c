"""The supervisor's reading of stub command lines, its count of missing instances per model version
and its reload config (the healing itself is tested against a real tritonserver in
tests/slow/test_faults.py, and across version swaps in tests/slow/test_model_versions.py)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from backend.server import supervisor as supervisor_module
from backend.server.repository import read_config
from backend.server.stubs import InstanceWatch, Stub, instance_count, instance_counts
from backend.server.supervisor import RELOAD_PARAMETER, TritonSupervisor, reload_config

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
    """The supervisor's own `check_stubs`, with Triton's answers scripted: which versions are READY and
    their configs; reloads are recorded instead of sent."""

    def __init__(self, ready: set[str]) -> None:
        super().__init__(SimpleNamespace(pid=1))
        self.ready = ready
        self.reloaded: list[str] = []

    def _served_config(self, model: str, version: str = "") -> dict | None:
        return {"instance_group": [{"count": 2}]} if version in self.ready or not version else None

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
