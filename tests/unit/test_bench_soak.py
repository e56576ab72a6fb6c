"""The soak test's pure parts: naming stub processes, the growth check, the open-loop pacing."""

import asyncio
import math

import pytest

from bench.soak import (
    OpenLoop,
    least_squares_slope,
    mapped_shm_files,
    series_name,
    theil_sen_slope,
    shm_usage,
    stub_instance_name,
    stub_region,
    trend,
)

# A stub's command line as tritonserver 2.51 starts it (seen with `ps`).
STUB = [
    "/work/main/build/backends/python/triton_python_backend_stub",
    "/work/main/model_repository/mobilenet_v3_small/1/model.py",
    "triton_python_backend_shm_region_99b81647-421a-420f-857b-4137340ded82",
    "16777216", "16777216", "8819", "/work/main/build/backends/python", "336",
    "mobilenet_v3_small_0_1", "DEFAULT",
]


def test_stub_instance_name_and_region_come_from_the_command_line():
    assert stub_instance_name(STUB) == "mobilenet_v3_small_0_1"
    assert stub_region(STUB) == "triton_python_backend_shm_region_99b81647-421a-420f-857b-4137340ded82"
    custom = STUB[:8] + ["my_group_3", "DEFAULT"]
    assert stub_instance_name(custom) == "my_group_3"


@pytest.mark.parametrize("cmdline", [
    [],
    ["/usr/bin/python3", "-m", "client.facade"],
    STUB[:2],  # no region
    STUB[:7],  # cut after the backend directory
    STUB[:7] + ["not-a-number", "x_0_0"],
])
def test_other_command_lines_are_not_stubs(cmdline):
    assert stub_instance_name(cmdline) is None


@pytest.mark.parametrize("slope", [least_squares_slope, theil_sen_slope])
def test_slopes_of_lines(slope):
    assert slope([0, 10, 20, 30], [5, 6, 7, 8]) == pytest.approx(0.1)
    assert slope([0, 10, 20], [3, 3, 3]) == pytest.approx(0.0)
    assert math.isnan(slope([5], [1]))
    assert math.isnan(slope([5, 5], [1, 2]))


def test_one_step_moves_least_squares_but_not_theil_sen():
    times = list(range(0, 310, 10))
    values = [100.0] * 25 + [140.0] * 6  # one 40 MiB step near the end
    assert least_squares_slope(times, values) > 0.05
    assert theil_sen_slope(times, values) == pytest.approx(0.0)


def test_a_flat_series_after_a_warm_up_step_is_not_flagged():
    times = list(range(0, 610, 10))
    values = [100.0 if t < 120 else 180.0 for t in times]  # warm-up in the first half, flat after
    result = trend("RSS stub", times, values)
    assert not result.flagged
    assert result.growth_per_10min == pytest.approx(0.0, abs=1e-9)
    assert (result.start, result.end, result.peak) == (100.0, 180.0, 180.0)
    assert result.samples == 31  # t = 300 .. 600


def test_steady_growth_is_flagged_only_above_both_thresholds():
    times = list(range(0, 610, 10))
    leak = trend("RSS facade", times, [100.0 + 0.05 * t for t in times])  # 30 MiB per 10 min
    assert leak.flagged and leak.growth_per_10min == pytest.approx(30.0)
    assert leak.robust_growth_per_10min == pytest.approx(30.0)
    assert leak.growth_fraction == pytest.approx(30.0 / leak.mean)
    # A leak in repeated steps (+4 MiB every minute) is a trend for both estimators.
    stairs = trend("RSS stub", times, [100.0 + 4 * (t // 60) for t in times])
    assert stairs.flagged and stairs.robust_growth_per_10min > 10
    # 30 MiB per 10 min on a 2 GiB process is under 5%: not flagged.
    big = trend("RSS tritonserver", times, [2048.0 + 0.05 * t for t in times])
    assert not big.flagged and big.growth_per_10min == pytest.approx(30.0)
    # 6 MiB per 10 min is a large share of a 20 MiB series but under 10 MiB: not flagged.
    small = trend("/dev/shm", times, [20.0 + 0.01 * t for t in times])
    assert not small.flagged and small.growth_fraction > 0.05


def test_a_late_step_is_reported_but_not_flagged():
    times = list(range(0, 610, 10))
    values = [165.0 if t < 550 else 205.0 for t in times]  # an arena grown once, 50 s before the end
    result = trend("RSS mobilenet_v3_small_0_0", times, values)
    assert result.growth_per_10min > 10 and result.robust_growth_per_10min == pytest.approx(0.0)
    assert not result.flagged and "a step" in result.note
    assert (result.end, result.peak) == (205.0, 205.0)


def test_thresholds_and_units_can_be_changed():
    times = [0, 10, 20, 30, 40, 50, 60]
    p99 = trend("p99", times, [10, 10, 10, 10, 14, 18, 22], unit="ms", abs_threshold=5.0, fraction_threshold=0.5)
    assert p99.flagged and p99.unit == "ms"
    never = trend("fds", times, [1, 2, 3, 4, 5, 6, 7], unit="count", abs_threshold=math.inf)
    assert not never.flagged


def test_too_few_samples_or_gaps_are_not_judged():
    few = trend("RSS facade", [0, 10, 20], [100, 500, 900])
    assert not few.flagged and "not judged" in few.note and few.samples == 2
    empty = trend("RSS facade", [], [])
    assert not empty.flagged and empty.note == "no samples"
    gaps = trend("RSS stub", [0, 10, 20, 30, 40, 50, 60], [math.nan, 50.0, 50.0, 50.0, 50.0, 50.0, 50.0])
    assert gaps.start == 50.0 and gaps.growth_per_10min == pytest.approx(0.0)


def test_series_names():
    assert series_name("rss_mib.facade") == "RSS facade"
    assert series_name("pss_mib.total") == "PSS total"
    assert series_name("rss_mib.mobilenet_v3_small_0_0") == "RSS mobilenet_v3_small_0_0"
    assert series_name("shm_mib") == "/dev/shm allocated"


def test_shm_usage_counts_only_the_named_files(tmp_path):
    (tmp_path / "ours").write_bytes(b"x" * 8192)
    (tmp_path / "theirs").write_bytes(b"x" * 4096)
    present, allocated, apparent = shm_usage({"ours", "gone"}, tmp_path)
    assert present == 1 and apparent == 8192 and allocated >= 8192


def test_mapped_shm_files_of_a_missing_process_is_empty():
    assert mapped_shm_files(2**22 + 12345) == set()


class _Target:
    """Answers after a fixed delay; every third call fails with the given status."""

    timeout_s = 1.0

    def __init__(self, delay: float, status: str | None = None) -> None:
        self.delay, self.status, self.calls = delay, status, 0

    async def call(self):
        self.calls += 1
        number = self.calls  # this call's own: others may start while it sleeps
        await asyncio.sleep(self.delay)
        return self.status if self.status and number % 3 == 0 else None


def test_open_loop_keeps_its_rate_and_counts_statuses():
    target = _Target(0.001, "UNAVAILABLE")
    loop = OpenLoop(target, rate=200, max_outstanding=16, max_calls=10_000)
    asyncio.run(loop.run(0.5))
    assert 90 <= loop.sent <= 101 and loop.skipped == 0
    assert loop.ok + loop.errors.get("UNAVAILABLE", 0) == loop.sent
    assert loop.errors["UNAVAILABLE"] == loop.sent // 3
    taken = loop.take()
    assert len(taken.latencies) == loop.ok and loop.take().latencies == taken.latencies[:0]


def test_open_loop_skips_calls_beyond_the_outstanding_cap_and_stops_at_max_calls():
    slow = OpenLoop(_Target(0.3), rate=100, max_outstanding=2, max_calls=20)
    asyncio.run(slow.run(5.0))
    assert slow.sent + slow.skipped == 20  # max_calls ends it long before the 5 s
    assert slow.sent <= 4 and slow.skipped >= 16 and slow.ok == slow.sent
