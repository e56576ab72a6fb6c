"""The soak's growth check (bench.trend): slopes and the flagging of memory series."""

import math

import pytest

from bench.trend import least_squares_slope, level, theil_sen_slope, trend


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


def test_steady_growth_is_flagged_only_above_the_limit():
    times = list(range(0, 610, 10))
    leak = trend("RSS facade", times, [100.0 + 0.05 * t for t in times])  # 30 MiB per 10 min
    assert leak.flagged and leak.growth_per_10min == pytest.approx(30.0)
    assert leak.robust_growth_per_10min == pytest.approx(30.0)
    # A leak in repeated steps (+4 MiB every minute) is a trend for both estimators.
    stairs = trend("RSS stub", times, [100.0 + 4 * (t // 60) for t in times])
    assert stairs.flagged and stairs.robust_growth_per_10min > 10
    # 6 MiB per 10 min is a large share of a 20 MiB series but under the 10 MiB limit: not flagged.
    small = trend("/dev/shm", times, [20.0 + 0.01 * t for t in times])
    assert not small.flagged and small.growth_per_10min == pytest.approx(6.0)
    assert trend("/dev/shm", times, [20.0 + 0.01 * t for t in times], limit=5.0).flagged


def test_a_late_step_is_reported_but_not_flagged():
    times = list(range(0, 610, 10))
    values = [165.0 if t < 550 else 205.0 for t in times]  # an arena grown once, 50 s before the end
    result = trend("RSS mobilenet_v3_small_0_0", times, values)
    assert result.growth_per_10min > 10 and result.robust_growth_per_10min == pytest.approx(0.0)
    assert not result.flagged and "a step" in result.note
    assert (result.end, result.peak) == (205.0, 205.0)


def test_the_limit_can_be_changed():
    times = [0, 10, 20, 30, 40, 50, 60]
    assert trend("RSS", times, [10, 10, 10, 10, 14, 18, 22], limit=5.0).flagged
    assert not trend("RSS", times, [1, 2, 3, 4, 5, 6, 7], limit=math.inf).flagged


def test_too_few_samples_or_gaps_are_not_judged():
    few = trend("RSS facade", [0, 10, 20], [100, 500, 900])
    assert not few.flagged and "not judged" in few.note and few.samples == 2
    empty = trend("RSS facade", [], [])
    assert not empty.flagged and empty.note == "no samples"
    gaps = trend("RSS stub", [0, 10, 20, 30, 40, 50, 60], [math.nan, 50.0, 50.0, 50.0, 50.0, 50.0, 50.0])
    assert gaps.start == 50.0 and gaps.growth_per_10min == pytest.approx(0.0)


def test_the_fit_starts_where_the_warm_up_ends_when_told():
    times = list(range(0, 610, 10))
    values = [100.0 + t / 10 if t < 200 else 120.0 for t in times]  # growth during the warm-up only
    assert trend("RSS", times, values, since=200).growth_per_10min == pytest.approx(0.0, abs=1e-9)
    assert trend("RSS", times, values, since=0).growth_per_10min > 10
    assert trend("RSS", times, values, since=200).samples == 41
    # The soak's limit: 2 MiB per 10 minutes fails 1 MiB, however large the process.
    slow = [500.0 + 2.0 * t / 600 for t in times]
    assert trend("RSS", times, slow, limit=1.0, since=0).flagged
    assert not trend("RSS", times, slow, since=0).flagged
    assert "not judged" in trend("RSS", times, values, since=590).note


def test_a_count_is_flat_when_it_ends_where_it_started_whatever_it_did_between():
    times = list(range(0, 200, 10))
    bump = [12 + (4 if 50 <= t < 90 else 0) for t in times]  # a publish's stubs beside the old ones for a while
    assert level("regions", times, bump, since=0, tolerance=2).flat
    leak = [70 + t // 30 for t in times]  # one fd more every 30 s
    found = level("fds", times, leak, since=0, tolerance=2)
    assert not found.flat and found.first == 70 and found.last == 76 and found.rise == 6
    assert level("fds", times, leak, since=0, tolerance=6).flat
    short = level("fds", times, leak, since=180, tolerance=0)
    assert short.flat and "not judged" in short.note
