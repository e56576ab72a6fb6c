"""The open-loop goodput mode of the peers benchmark (bench/peers/goodput.py): its rule, gates and report."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math

import pytest

from bench.output import finish
from bench.peers import goodput
from bench.peers.goodput import DIRECT, FACADE, best_fastapi, gates, objective_ms, within


def _step(rate: float, p99: float, errors: float = 0.0, answered: int = 100, **more) -> dict:
    return {
        "offered_rps": rate,
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        "answered": answered,
        "error_share": errors,
        "refused_share": errors,
        "timed_out_share": 0.0,
        "lag_p99_ms": 0.5,
        "lag_max_ms": 2.0,
        **more,
    }


def test_goodput_is_the_highest_rate_within_the_objective_and_the_error_budget():
    steps = [_step(10, 5), _step(20, 8), _step(30, 9.9), _step(40, 12), _step(50, 400)]
    assert goodput.goodput(steps, objective=10.0) == 30
    # Errors over 0.1% disqualify a step however fast its answers were; 0.1% itself is allowed.
    steps[2]["error_share"] = 0.0011
    assert goodput.goodput(steps, objective=10.0) == 20
    steps[1]["error_share"] = 0.001
    assert goodput.goodput(steps, objective=10.0) == 20
    # A step with no answers (all refused, p99 nan) keeps no promise; nothing kept gives 0.
    assert not within(_step(5, math.nan, answered=0), 10.0)
    assert goodput.goodput([_step(10, 11), _step(20, 30)], objective=10.0) == 0.0


def test_the_objective_is_a_multiple_of_the_in_process_latency_with_a_floor():
    assert objective_ms(40.0) == pytest.approx(goodput.OBJECTIVE_FACTOR * 40.0)
    assert objective_ms(0.2) == goodput.OBJECTIVE_FLOOR_MS
    assert objective_ms(3.0, factor=10, floor_ms=1) == 30.0


def _record(good: float, at_2x_p99: float | None = None, lone: float = 1.0) -> dict:
    steps = [_step(good / 2, 5), _step(good, 9), _step(good * 2, 80, errors=0.2)]
    overloads = {"1.5": _step(good * 1.5, 20, errors=0.1), "2.0": _step(good * 2, at_2x_p99 or 50, errors=0.4)}
    record = {"setup": "s", "capacity_rps": good * 1.3, "goodput_rps": good, "steps": steps, "overloads": overloads}
    return record | {"lone": {"p50_ms": lone}}


def _one_round(results: dict) -> dict:
    """Each model's rounds: one, its figures read from the servers' records."""
    for data in results["models"].values():
        data["rounds"] = [{n: goodput.figures(r) for n, r in data["servers"].items()}]
    return results


def _results() -> dict:
    return _one_round({
        "started": "20261125T000000Z",
        "machine": "test machine",
        "settings": {"servers": ["triton", "facade", "fastapi"], "capacity_seconds": 3.0, "step_seconds": 5.0,
                     "rounds": 1, "generator": "loadgen"},
        "objective": {"factor": 5.0, "floor_ms": 10.0, "why": "a reason"},
        "models": {
            "resnet50": {
                "single_p50_ms": 40.0,
                "single_p99_ms": 45.0,
                "objective_ms": 200.0,
                "in_process_rps": 40.0,
                "servers": {
                    DIRECT: _record(30.0, at_2x_p99=150, lone=41.5),
                    FACADE: _record(20.0, at_2x_p99=250),
                    "FastAPI 2x1": _record(20.0),
                    "FastAPI 1x2": _record(15.0),
                    "Ray Serve": {"setup": "s", "error": "did not start: no venv"},
                },
            },
            "text_classifier": {
                "single_p50_ms": 0.2,
                "single_p99_ms": 0.4,
                "objective_ms": 10.0,
                "servers": {DIRECT: _record(300.0, at_2x_p99=8, lone=1.5)},
            },
        },
    })  # fmt: skip


def test_gates_judge_the_goals_on_the_runs_figures_and_fail_what_they_cannot_judge():
    results = _results()
    assert best_fastapi(results["models"]["resnet50"]["rounds"][0]) == ("FastAPI 2x1", 20.0)
    verdicts = {gate.name: gate for gate in gates(results)}
    name = f"resnet50: {DIRECT} goodput >= 1.1x the best FastAPI layout, interval's low end >= 0.9x"
    assert verdicts[name].passed and verdicts[name].detail.startswith("median 1.50x")  # 30 / 20
    text = verdicts[f"text_classifier: {DIRECT} goodput >= 1.0x the best FastAPI layout, interval's low end >= 0.9x"]
    assert not text.passed and text.detail == "not judged: 1 of 1 rounds without both goodputs"
    assert verdicts[f"resnet50: {DIRECT} lone request p50 <= in-process + 2 ms"].passed  # 41.5 against 40
    lone = verdicts[f"text_classifier: {DIRECT} lone request p50 <= in-process + 1 ms"]
    assert not lone.passed and lone.detail == "median 1.50 ms, in-process 0.20 ms"
    capacity = verdicts[f"resnet50: {DIRECT} capacity at c=16 >= 0.9x the best in-process batch"]
    assert capacity.passed and capacity.detail == "0.97x of 40.0 req/s"  # 39 against 40
    at_2x = "at 2x its goodput, answered p99 <= objective (the last round)"
    assert verdicts[f"resnet50: {DIRECT} {at_2x}"].passed
    assert not verdicts[f"resnet50: {FACADE} {at_2x}"].passed
    assert verdicts[f"text_classifier: {DIRECT} {at_2x}"].passed
    facade_share = verdicts[f"resnet50: {FACADE} capacity at c=16 >= 0.95x {DIRECT}'s"]
    assert not facade_share.passed and facade_share.detail == "median 0.67x over 1 rounds"  # 26 against 39
    # A step whose generator lagged more than a tenth of the objective is not counted, whatever its latency.
    direct = results["models"]["resnet50"]["servers"][DIRECT]
    direct["steps"][1]["lag_p99_ms"] = 21.0
    assert not within(direct["steps"][1], 200.0)
    direct["goodput_rps"] = goodput.goodput(direct["steps"], 200.0)
    assert direct["goodput_rps"] == 15.0  # the step below
    assert not {g.name: g for g in gates(_one_round(results))}[name].passed  # against FastAPI's 20
    # A run without FastAPI (a smoke of one server) claims no ratio to it.
    results["settings"]["servers"] = ["triton"]
    assert not any("FastAPI" in gate.name for gate in gates(results))


def test_a_ratio_goal_is_judged_on_the_rounds_median_and_its_intervals_low_end():
    def round_of(mine: float) -> dict:
        figures = {"goodput_rps": mine, "capacity_rps": mine, "lone_p50_ms": 2.0}
        fastapi = {"goodput_rps": 100.0, "capacity_rps": 100.0, "lone_p50_ms": 1.0}
        return {DIRECT: figures, "FastAPI 2x1": fastapi, "FastAPI 1x2": {"error": "did not start"}}

    data = {"single_p50_ms": 1.5, "objective_ms": 25.0, "servers": {DIRECT: {}, "FastAPI 2x1": {}}}
    results = {"settings": {"servers": ["triton", "fastapi"]}, "models": {"mobilenet_v3_small": data}}
    name = f"mobilenet_v3_small: {DIRECT} goodput >= 1.1x the best FastAPI layout, interval's low end >= 0.9x"
    data["rounds"] = [round_of(mine) for mine in (150.0, 140.0, 120.0, 135.0, 132.0)]
    gate = {g.name: g for g in gates(results)}[name]
    assert gate.passed and gate.detail == "median 1.35x, 94% interval 1.20-1.50x over 5 rounds"
    data["rounds"][2] = round_of(80.0)  # the median holds, the interval's low end does not
    assert not {g.name: g for g in gates(results)}[name].passed
    assert goodput.rounds_table(data)[2:4] == ["| 1 | 150.0 | 100.0 | 1.50x |", "| 2 | 140.0 | 100.0 | 1.40x |"]


def test_the_report_has_a_table_per_model_the_plots_and_every_gate(tmp_path):
    results = _results()
    text_record = results["models"]["text_classifier"]["servers"][DIRECT]
    text_record["steps"][1]["lag_p99_ms"] = 3.0  # over a tenth of the 10 ms objective
    text_record["steps"][0]["other_errors"] = {"INTERNAL": 4}  # a peer failing batches of mixed lengths, say
    text_record["steps"][2]["other_errors"] = {"INTERNAL": 1, "UNKNOWN": 2}
    results["models"]["resnet50"]["servers"][DIRECT]["steps"][1].update(server_cpu_s=0.3, client_cpu_s=0.1)
    common = _step(6.0, 50.0, answered=30, server_cpu_s=0.3, client_cpu_s=0.03)  # the rate every server is offered
    results["models"]["resnet50"]["servers"][DIRECT]["common"] = common
    judged = gates(results)
    text = goodput.open_report(tmp_path, results, judged)
    assert finish(tmp_path, text, judged, results) == 1  # a gate failed
    assert text == (tmp_path / "report.md").read_text()
    assert "## resnet50" in text and "## text_classifier" in text
    assert "| 1 | 30.0 | 20.0 | 20.0 | 15.0 | n/a | 1.50x | 1.00x |" in text  # the round, then the last round's detail
    assert f"- {DIRECT}: median ratio 1.50x" in text and "over the best in-process batch's 40.0 req/s" in text
    assert "objective: p99 <= **200.0 ms**" in text and "at least 10 ms (a reason)" in text
    # goodput, its ratio to the best FastAPI, the capacity, 1.5x and 2x goodput, the generator's worst lag
    assert "| tritonnx, Triton direct | 30.0 | 1.50x | 39.0 | 10.0 / 20.0 | 10.0% / 0.0% | 75.0 / 150.0 | " in text
    assert "| 40.0% / 0.0% | 0.5 / 2.0 | 3.00 / 1.00 | 50.0, 10.00 / 1.00 |" in text  # CPU per request: at the
    # goodput's step, then at the common rate; the header names the rate and the generator is named
    assert "at 6.0 req/s: p99 ms, CPU ms per request: server / generator |" in text
    assert "measured by one generator, loadgen (bench/load/loadgen.c" in text
    steps = len(text_record["steps"]) + len(text_record["overloads"])
    late = f"tritonnx, Triton direct: 1 of {steps} steps, from 300 req/s, the worst 3.0 ms at 300 req/s"
    assert late in text and text.count("which were not counted") == 1  # resnet50's lag is within its tenth
    assert f"tritonnx, Triton direct: 5 INTERNAL, 2 UNKNOWN in 2 of {steps} steps" in text
    assert text.count("failed with other statuses") == 1
    assert "| Ray Serve | not measured: did not start: no venv |" in text
    assert "## Gates" in text and text.count("**FAILED**") == sum(not gate.passed for gate in judged)
    for png in ("goodput.png", "resnet50_open.png", "text_classifier_open.png"):
        assert (tmp_path / png).stat().st_size > 1000 and f"]({png})" in text
    assert len(json.loads((tmp_path / "results.json").read_text())["gates"]) == len(judged)


class _Fake:
    """A target whose every answer takes `delay` seconds (the loops' Target, no server)."""

    name, model, batch, timeout_s, wrong = "fake", "m", 1, 1.0, 0

    def __init__(self, delay: float) -> None:
        self.delay, self.is_open = delay, False

    async def open(self, concurrency: int = 1) -> None:
        self.is_open = True

    async def close(self) -> None:
        self.is_open = False

    async def verify(self) -> None: ...

    async def call(self) -> str | None:
        await asyncio.sleep(self.delay)
        return None


def _args() -> argparse.Namespace:
    return argparse.Namespace(step_seconds=0.05, capacity_seconds=0.1, generator="python")


@pytest.fixture(autouse=True)
def _quick_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """One settle poll before each step, shortened: these fake servers are idle or nearly."""
    monkeypatch.setattr(goodput, "SETTLE_POLL_S", 0.01)


def _idle() -> float:
    """A server that used no CPU: every step starts after one settle poll."""
    return 0.0


def test_every_step_then_the_overloads_are_offered_once_a_goodput_is_found():
    record = asyncio.run(goodput._capacity_and_steps(_Fake(0.001), _args(), 1000.0, _idle))
    assert [step["factor"] for step in record["steps"]] == list(goodput.STEPS)
    assert record["goodput_rps"] == record["steps"][-1]["offered_rps"] > 0  # every step kept a 1 s objective
    assert list(record["overloads"]) == ["1.5", "2.0"]
    assert record["overloads"]["2.0"]["offered_rps"] == pytest.approx(2 * record["goodput_rps"])


def test_lower_steps_are_tried_while_none_keeps_the_objective_and_no_goodput_means_no_overload():
    record = asyncio.run(goodput._capacity_and_steps(_Fake(0.02), _args(), 1.0, _idle))  # 20 ms answers, 1 ms
    assert [step["factor"] for step in record["steps"]] == [*goodput.STEPS, *goodput.LOW_STEPS]
    assert record["goodput_rps"] == 0.0 and record["overloads"] == {}


def test_refinement_bisects_between_the_goodput_and_the_next_rate_above_it(monkeypatch):
    offered = []

    async def step(target, rate, args, seed, server_cpu):  # p99 within a 10 ms objective below 70 req/s
        offered.append(rate)
        return _step(rate, 5.0 if rate < 70 else 50.0)

    monkeypatch.setattr(goodput, "_step", step)
    steps = [_step(50, 5.0), _step(80, 50.0), _step(100, 50.0)]
    asyncio.run(goodput._refine(_Fake(0.0), steps, 100.0, 10.0, _args(), _idle))
    assert offered == [65.0, 72.5]  # halfway to 80 kept it, halfway to 80 from 65 did not
    assert goodput.goodput(steps, 10.0) == 65.0 and steps[-1]["factor"] == 0.725


def test_each_step_records_the_cpu_the_server_and_the_generator_used():
    readings = itertools.count()  # the server's CPU: 1 ms more at every reading, idle by settle's measure

    def used() -> float:
        return next(readings) / 1000

    record = asyncio.run(goodput._capacity_and_steps(_Fake(0.001), _args(), 1000.0, used))
    step = record["steps"][0]
    assert step["server_cpu_s"] == pytest.approx(0.001) and step["client_cpu_s"] > 0 and step["settled_s"] > 0
