"""The supervisor's reading of stub command lines, its count of missing instances and its reload
config (the healing itself is tested against a real tritonserver in tests/slow/test_faults.py)."""

from __future__ import annotations

from backend.server.supervisor import RELOAD_PARAMETER, Stub, instance_count, reload_config, short_models

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


def test_a_stub_command_line_names_its_model_instance_and_region():
    stub = Stub.from_command_line(42, STUB_ARGS)
    assert stub == Stub(42, "mobilenet_v3_small", "mobilenet_v3_small_0_1", "triton_python_backend_shm_region_5d7f0daf")


def test_other_children_are_not_stubs():
    assert Stub.from_command_line(1, ["/usr/bin/python3", "-m", "something"]) is None
    assert Stub.from_command_line(1, STUB_ARGS[:5]) is None


def test_the_reload_config_bumps_its_parameter_and_leaves_the_served_one_alone():
    served = {"name": "resnet50", "max_batch_size": 16, "parameters": {"intra_op_thread_count": {"string_value": "2"}}}
    first, second = reload_config(served, "1"), reload_config(served, "2")
    assert first["parameters"][RELOAD_PARAMETER] == {"string_value": "1"}
    assert second["parameters"][RELOAD_PARAMETER] == {"string_value": "2"}
    assert first["parameters"]["intra_op_thread_count"] == {"string_value": "2"}
    assert RELOAD_PARAMETER not in served["parameters"]


def stubs(*models: str) -> dict[int, Stub]:
    return {pid: Stub(pid, model, f"{model}_0_{pid}", f"region_{pid}") for pid, model in enumerate(models)}


def test_a_model_that_had_all_its_instances_and_lost_one_is_short():
    expected = {"a": 2, "b": 1}
    assert short_models(stubs("a", "a", "b"), expected, {"a", "b"}) == set()
    assert short_models(stubs("a", "b"), expected, {"a", "b"}) == {"a"}
    assert short_models(stubs("a", "a"), expected, {"a", "b"}) == {"b"}
    assert short_models(stubs("a"), expected, {"a", "b"}) == {"a", "b"}
    # Still coming up (never complete): not short.
    assert short_models(stubs("b"), expected, {"b"}) == set()
    # Old and new generation side by side during a reload: not short.
    assert short_models(stubs("a", "a", "a", "b"), expected, {"a", "b"}) == set()


def test_instances_are_counted_from_the_served_config():
    assert instance_count({"instance_group": [{"count": 2, "kind": "KIND_CPU"}, {"count": 3}]}) == 5
    assert instance_count({}) == 1
