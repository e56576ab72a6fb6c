"""CPU per image by process (bench.cpu): the arithmetic on recorded snapshots, and a real snapshot."""

import os
import time

import pytest

from bench.cpu import CpuSnapshot, measured, per_image, snapshot
from tests.unit.test_bench_usage import fake_tritonserver, stop


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
        time.sleep(0.5)  # the child is up and spinning
        served = iter([0, 100])
        result, cpu = measured(
            lambda: time.sleep(0.6) or "done",
            parent.pid,
            lambda: next(served),
            cores=os.cpu_count() or 1,
            own_role="client",
        )
        assert result == "done" and cpu["images"] == 100
        assert cpu["stubs"] > 2.0  # ~0.6 s of a busy child over 100 images is ~6 ms each
        assert cpu["tritonserver"] < cpu["stubs"] and "client" in cpu
        assert len(snapshot(parent.pid).per_stub) == 1  # the stub is seen as one, the other child is not
    finally:
        stop(parent)
