"""The facade study's judgement: the median ratio's distribution-free interval and the verdict it gives."""

from __future__ import annotations

import math

import pytest

from bench.output import median_interval
from bench.studies.facade import compare


@pytest.mark.parametrize(
    ("rounds", "k", "coverage"),
    [(1, 1, 0.0), (4, 1, 0.875), (5, 1, 0.9375), (9, 2, 0.9609375), (10, 2, 0.978515625), (20, 6, 0.9586105346679688)],
)
def test_the_interval_is_the_narrowest_covering_ninety_percent_else_the_widest(rounds, k, coverage):
    assert median_interval(rounds) == (k, pytest.approx(coverage))


def test_the_coverage_is_the_binomial_chance_that_the_median_lies_between_the_order_statistics():
    n, k = 10, 2  # P(k <= Binomial(n, 1/2) <= n - k)
    assert median_interval(n)[1] == pytest.approx(sum(math.comb(n, i) for i in range(k, n - k + 1)) / 2**n)


def test_every_round_faster_is_outside_noise_and_better_by_the_metrics_direction():
    pairs = [(0.9, 1.0), (1.8, 2.0), (0.95, 1.0), (0.8, 1.0), (0.45, 0.5)]
    latency = compare(pairs, higher_is_better=False)
    assert latency["ratio"] == pytest.approx(0.9)
    assert latency["interval"] == pytest.approx([0.8, 0.95])
    assert latency["coverage"] == pytest.approx(0.9375)
    assert (latency["current"], latency["baseline"]) == (pytest.approx(0.9), pytest.approx(1.0))
    assert latency["verdict"] == "outside noise: current better"
    assert compare(pairs, higher_is_better=True)["verdict"] == "outside noise: current worse"  # fewer req/s


def test_an_interval_holding_one_is_within_noise():
    pairs = [(0.9, 1.0), (1.1, 1.0), (0.95, 1.0), (1.02, 1.0), (0.97, 1.0)]
    judged = compare(pairs, higher_is_better=False)
    assert judged["interval"] == pytest.approx([0.9, 1.1])
    assert judged["verdict"] == "within noise"


def test_too_few_rounds_are_never_outside_noise():
    judged = compare([(0.5, 1.0)] * 4, higher_is_better=False)  # all four halved, but [min, max] covers 87.5%
    assert judged["interval"] == pytest.approx([0.5, 0.5])
    assert judged["verdict"] == "within noise (too few rounds for a 90% interval)"


def test_a_baseline_that_answered_nothing_gives_no_verdict_of_change():
    assert compare([(1.0, 0.0)] * 5, higher_is_better=True)["verdict"] == "within noise"
