"""The supervisor's reading of stub command lines and its reload config (the healing itself is
tested against a real tritonserver in tests/integration/test_faults.py)."""

from __future__ import annotations

from backend.supervisor import RELOAD_PARAMETER, Stub, reload_config

STUB_ARGS = [
    "/work/build/backends/python/triton_python_backend_stub", "/repo/mobilenet_v3_small/1/model.py",
    "triton_python_backend_shm_region_5d7f0daf", "16777216", "16777216", "7933", "/work/build/backends/python",
    "336", "mobilenet_v3_small_0_1", "DEFAULT",
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
