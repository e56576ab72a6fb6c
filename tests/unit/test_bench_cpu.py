"""CPU per image by process (bench.cpu): the arithmetic on recorded snapshots, and a real snapshot."""

import os
import time

import psutil
import pytest

from bench.cpu import CpuSnapshot, measured, per_image, snapshot
from bench.usage import cpu_seconds
from tests.unit.test_bench_usage import fake_tritonserver, stop
from tritonnx.server.stubs import live_stubs


def test_cpu_per_image_splits_by_role_and_counts_idle_core_time():
    before = CpuSnapshot(at=10.0, seconds={"tritonserver": 1.0, "facade": 2.0}, per_stub={101: 5.0, 102: 6.0})
    # 2 s on 2 cores (4 core-seconds): stubs 2.0 + tritonserver 0.4 + facade 0.6 + client 0.5 = 3.5 used.
    after = CpuSnapshot(at=12.0, seconds={"tritonserver": 1.4, "facade": 2.6}, per_stub={101: 6.2, 102: 6.8, 103: 9.0})
    cpu = per_image(before, after, images=500, cores=2, extra={"client": 0.5})
    assert cpu["stubs"] == pytest.approx(4.0)  # (1.2 + 0.8) s / 500; stub 103 started in between: not counted
    assert cpu["tritonserver"] == pytest.approx(0.8) and cpu["facade"] == pytest.approx(1.2)
    assert cpu["client"] == pytest.approx(1.0) and cpu["idle"] == pytest.approx(1.0)
    assert cpu["total"] == pytest.approx(7.0) and cpu["images"] == 500 and cpu["seconds"] == 2.0


def test_nothing_served_gives_no_figures():
    empty = CpuSnapshot(at=0.0, seconds={"tritonserver": 0.0}, per_stub={})
    assert per_image(empty, empty, images=0, cores=2) == {}


def test_a_real_process_tree_is_measured_while_the_run_works(tmp_path):
    # A stand-in for tritonserver with one busy child started as a stub is, and one child that is no stub.
    parent = fake_tritonserver(tmp_path, ["busy_0_0"], busy=True)
    try:
        [stub] = [psutil.Process(pid) for pid in live_stubs(parent.pid)]

        def run() -> str:
            """Until the stub has spent 0.3 s of CPU more (however long a busy machine takes to give it that)."""
            start, deadline = cpu_seconds(stub), time.monotonic() + 60
            while cpu_seconds(stub) < start + 0.3:
                assert time.monotonic() < deadline, "the busy stub got no CPU for a minute"
                time.sleep(0.02)
            return "done"

        served = iter([0, 100])
        result, cpu = measured(run, parent.pid, lambda: next(served), cores=os.cpu_count() or 1, own_role="client")
        assert result == "done" and cpu["images"] == 100
        assert cpu["stubs"] >= 3.0  # at least the 0.3 s the run waited for, over 100 images
        assert cpu["tritonserver"] < cpu["stubs"] and "client" in cpu  # the stand-in itself sleeps
        assert len(snapshot(parent.pid).per_stub) == 1  # the stub is seen as one, the other child is not
    finally:
        stop(parent)
