"""bench.usage: the serving processes as the benchmarks see them, on a stand-in tritonserver whose
children are started the way Triton starts its Python stubs (no Triton)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.usage import Watcher, mapped_shm_files, shm_usage, tree_memory
from tests.helpers import wait_until
from tritonnx.server.supervisor import Stub, live_stubs

# A stub's command line as tritonserver 2.51 starts it (seen with `ps`).
STUB = [
    "/work/main/build/backends/python/triton_python_backend_stub",
    "/work/main/model_repository/mobilenet_v3_small/1/model.py",
    "triton_python_backend_shm_region_99b81647-421a-420f-857b-4137340ded82",
    "16777216",
    "16777216",
    "8819",
    "/work/main/build/backends/python",
    "336",
    "mobilenet_v3_small_0_1",
    "DEFAULT",
]
_PARENT = (
    "import json, subprocess, sys, time\n"
    "children = [subprocess.Popen(command) for command in json.loads(sys.argv[1])]\n"
    "time.sleep(30)\n"
)


def fake_tritonserver(directory: Path, instances: list[str], busy: bool = False) -> subprocess.Popen:
    """A parent (the stand-in for tritonserver) with one child per instance started as a stub is
    (an executable named triton_python_backend_stub running the model's model.py, then the stub's
    arguments), busy or asleep for 30 s, and one other child that is no stub."""
    stub = directory / "triton_python_backend_stub"
    stub.symlink_to(sys.executable)  # a Python by the stub's name: it runs model.py
    script = directory / "mobilenet_v3_small" / "1" / "model.py"
    script.parent.mkdir(parents=True)
    script.write_text(
        "import time\nend = time.time() + 30\nwhile time.time() < end:\n"
        + ("    pass\n" if busy else "    time.sleep(0.1)\n")
    )
    commands = [
        [
            str(stub),
            str(script),
            f"triton_python_backend_shm_region_{index}",
            "16777216",
            "16777216",
            str(os.getpid()),
            str(directory),
            "336",
            instance,
            "DEFAULT",
        ]
        for index, instance in enumerate(instances)
    ]
    commands.append([sys.executable, "-c", "import time; time.sleep(30)"])
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, json.dumps(commands)])
    deadline = time.monotonic() + 10
    while len(live_stubs(parent.pid)) < len(instances) or len(psutil.Process(parent.pid).children()) <= len(instances):
        assert time.monotonic() < deadline, "the stand-in's children did not start"
        time.sleep(0.05)
    return parent


def stop(parent: subprocess.Popen) -> None:
    for process in psutil.Process(parent.pid).children(recursive=True):
        process.kill()
    parent.kill()
    parent.wait()


def test_the_stub_command_line_names_its_instance_and_region():
    stub = Stub.from_command_line(1, STUB)
    assert (stub.instance, stub.shm_region) == (
        "mobilenet_v3_small_0_1",
        "triton_python_backend_shm_region_99b81647-421a-420f-857b-4137340ded82",
    )
    assert Stub.from_command_line(1, STUB[:8] + ["my_group_3", "DEFAULT"]).instance == "my_group_3"


@pytest.mark.parametrize(
    "cmdline",
    [
        [],
        ["/usr/bin/python3", "-m", "tritonnx.client.facade"],
        STUB[:2],  # no region
        STUB[:7],  # cut after the backend directory
    ],
)
def test_other_command_lines_are_not_stubs(cmdline):
    assert Stub.from_command_line(1, cmdline) is None


def test_the_watcher_names_stubs_by_instance_and_version_samples_them_and_sees_one_go(tmp_path):
    parent = fake_tritonserver(tmp_path, ["mobilenet_v3_small_0_1", "my_group_3"])
    try:
        watcher = Watcher(parent.pid, os.getpid())  # this test process plays the facade
        stubs = ["mobilenet_v3_small_0_1@v1", "my_group_3@v1"]  # each of version 1, as its model.py's folder says
        assert sorted(watcher.processes()) == ["facade", *stubs, "tritonserver"]
        assert {"triton_python_backend_shm_region_0", "triton_python_backend_shm_region_1"} <= watcher.shm_names
        watcher.sample(0.0)
        time.sleep(0.2)
        row = watcher.sample(0.2)
        for label in ("facade", "tritonserver", *stubs):
            assert row[f"rss_mib.{label}"] > 0 and row[f"pss_mib.{label}"] > 0 and f"cpu.{label}" in row
            assert row[f"fds.{label}"] > 0 and row[f"threads.{label}"] >= 1
        assert row["pss_mib.total"] >= row["pss_mib.facade"] + row["pss_mib.tritonserver"]
        assert {"shm_files", "shm_mib", "shm_size_mib"} <= set(row)

        [gone] = [pid for pid, stub in live_stubs(parent.pid).items() if stub.instance == "my_group_3"]
        psutil.Process(gone).kill()  # left a zombie: the stand-in never reaps it
        wait_until(lambda: "my_group_3@v1" not in watcher.processes(), 5, "the killed stub no longer listed")
        assert watcher.missing == {"my_group_3@v1"} and watcher.stub_pids["my_group_3@v1"] == [gone]
        assert watcher.died() == {"my_group_3@v1"}  # no newer version replaced it
        # An exiting process loses its command line before it turns zombie: wait for the second too.
        wait_until(lambda: gone not in watcher.alive_pids(), 5, "the killed stub no longer alive")
        assert parent.pid in watcher.alive_pids()
    finally:
        stop(parent)


def test_tree_memory_sums_a_process_and_its_descendants(tmp_path):
    parent = fake_tritonserver(tmp_path, ["m_0_0"])
    try:
        memory = tree_memory(parent.pid)
        assert memory.processes == 3 and memory.pss_mib > 0 and memory.rss_mib >= memory.pss_mib
        assert memory.as_dict() == {
            "rss_mib": round(memory.rss_mib, 1),
            "pss_mib": round(memory.pss_mib, 1),
            "processes": 3,
        }
    finally:
        stop(parent)


def test_shm_usage_counts_only_the_named_files(tmp_path):
    (tmp_path / "ours").write_bytes(b"x" * 8192)
    (tmp_path / "theirs").write_bytes(b"x" * 4096)
    present, allocated, apparent = shm_usage({"ours", "gone"}, tmp_path)
    assert present == 1 and apparent == 8192 and allocated >= 8192


def test_mapped_shm_files_of_a_missing_process_is_empty():
    assert mapped_shm_files(2**22 + 12345) == set()


def test_the_watcher_samples_the_supervisors_process_too(tmp_path):
    parent = fake_tritonserver(tmp_path, ["mobilenet_v3_small_0_1"])
    try:
        # This test process plays the facade and the supervisor's process.
        watcher = Watcher(parent.pid, os.getpid(), os.getpid())
        assert sorted(watcher.processes()) == ["facade", "mobilenet_v3_small_0_1@v1", "supervisor", "tritonserver"]
        assert watcher.stub_versions == {"mobilenet_v3_small_0_1@v1": ("mobilenet_v3_small", "1")}
        row = watcher.sample(0.0)
        for label in ("supervisor", "mobilenet_v3_small_0_1@v1"):
            assert row[f"fds.{label}"] > 0 and row[f"threads.{label}"] >= 1 and row[f"rss_mib.{label}"] > 0
    finally:
        stop(parent)
