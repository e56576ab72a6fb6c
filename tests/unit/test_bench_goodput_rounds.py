"""The goodput-rounds study's pure parts: the interval of the median ratio, the ratio per round, the goal's verdict."""

from __future__ import annotations

import json
import math

import pytest

from bench.studies.goodput_rounds import TRITON, cpu_at_goodput, judge, median_interval, ratio, summarise


def test_five_rounds_give_their_range_at_94_percent():
    low, high, coverage = median_interval([1.1, 0.9, 1.3, 1.0, 1.2])
    assert (low, high) == (0.9, 1.3) and coverage == pytest.approx(1 - 2 / 32)


def test_more_rounds_drop_the_extremes_while_the_coverage_holds():
    values = [float(v) for v in range(1, 9)]  # 8 rounds: [x(2), x(7)] covers 1 - 2 * 9 / 256 = 93%
    low, high, coverage = median_interval(values)
    assert (low, high) == (2.0, 7.0) and coverage == pytest.approx(1 - 18 / 256)


def test_too_few_rounds_give_the_whole_range_with_its_own_coverage():
    assert median_interval([2.0, 1.0]) == (1.0, 2.0, 0.5)


def record(goodput: float) -> dict:
    step = {"offered_rps": goodput, "answered": 10, "error_share": 0.0, "p99_ms": 10.0, "lag_p99_ms": 1.0}
    return {"goodput_rps": goodput, "steps": [step]}


def test_the_ratio_is_over_the_best_fastapi_layout_of_the_round():
    round_ = {TRITON: record(300), "FastAPI 1x2": record(100), "FastAPI 2x1": record(200)}
    assert ratio(round_, lambda r: r["goodput_rps"]) == 1.5
    assert ratio({TRITON: record(300), "FastAPI 2x1": record(0)}, lambda r: r["goodput_rps"]) == math.inf
    assert ratio({TRITON: {"error": "did not start"}, "FastAPI 2x1": record(1)}, lambda r: r["goodput_rps"]) is None


def results(ratios: list[float], goal: float = 1.3) -> dict:
    rounds = [{TRITON: record(100 * r), "FastAPI 2x1": record(100)} for r in ratios]
    return {"model": "text_classifier", "goal": goal, "objective_ms": 25.0, "rounds": rounds,
            "settings": {"step_seconds": 5.0}}  # fmt: skip


@pytest.mark.parametrize(
    ("ratios", "passed", "word"),
    [
        ([1.4, 1.5, 1.35, 1.6, 1.45], True, "met"),
        ([1.0, 1.1, 0.9, 1.2, 1.05], False, "missed"),
        ([1.0, 1.5, 1.2, 1.4, 1.1], False, "undecided: the interval spans the goal"),
        ([1.5, 1.6], False, "undecided: too few rounds"),
    ],
)
def test_the_goal_is_judged_on_the_interval(ratios, passed, word):
    data = results(ratios)
    goal = judge(data, summarise(data))[-1]
    assert goal.passed is passed and goal.detail.startswith(word), goal


def test_a_server_that_failed_in_a_round_fails_the_measurement_gate():
    data = results([1.4, 1.5, 1.35, 1.6, 1.45])
    data["rounds"][2]["FastAPI 2x1"] = {"error": "wrong answers, not measured: 3 of 10"}
    measured = judge(data, summarise(data))[0]
    assert not measured.passed and "round 3, FastAPI 2x1: wrong answers" in measured.detail


def test_the_cpu_is_read_at_the_step_that_set_the_goodput():
    steps = [
        {"offered_rps": 100.0, "answered": 500, "server_cpu_s": 1.0, "client_cpu_s": 0.5},
        {"offered_rps": 200.0, "answered": 1000, "server_cpu_s": 4.0, "client_cpu_s": 2.0},
    ]
    assert cpu_at_goodput({"goodput_rps": 200.0, "steps": steps}, 5.0) == {
        "server_ms": 4.0, "generator_ms": 2.0, "cores": 1.2}  # fmt: skip
    assert cpu_at_goodput({"goodput_rps": 0.0, "steps": steps}, 5.0) is None


def test_earlier_runs_are_pooled_at_their_objective(tmp_path):
    from bench.studies.goodput_rounds import main

    paths = []
    for index, ratios in enumerate(([1.0, 0.9, 1.1], [0.8, 1.2])):
        run = {**results(ratios), "started": f"run-{index}", "single_p50_ms": 0.2, "objective_ms": 25.0}
        paths.append(tmp_path / f"run-{index}.json")
        paths[-1].write_text(json.dumps(run))
    out = tmp_path / "pooled"
    assert main(["--rounds", "0", "--pool", *map(str, paths), "--out", str(out)]) == 1  # the goal is missed
    pooled = json.loads((out / "results.json").read_text())
    assert len(pooled["rounds"]) == 5 and pooled["objective_ms"] == 25.0
    assert pooled["summary"]["ratios"] == [1.0, 0.9, 1.1, 0.8, 1.2]
    assert "Rounds 4-5 come from the earlier run of run-1" in (out / "report.md").read_text()


def test_runs_at_other_objectives_are_not_pooled(tmp_path):
    from bench.studies.goodput_rounds import main

    paths = []
    for index, objective in enumerate((25.0, 30.0)):
        paths.append(tmp_path / f"run-{index}.json")
        paths[-1].write_text(
            json.dumps({**results([1.0]), "started": "x", "single_p50_ms": 1, "objective_ms": objective})
        )
    with pytest.raises(SystemExit):
        main(["--rounds", "0", "--pool", *map(str, paths), "--out", str(tmp_path / "pooled")])
