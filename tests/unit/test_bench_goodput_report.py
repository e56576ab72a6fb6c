"""The goodput rounds judged and written up (bench/peers/goodput_report.py): gates, tables and plots."""

from __future__ import annotations

import json

from bench.output import finish
from bench.peers import goodput, goodput_report
from bench.peers.goodput import within
from bench.peers.goodput_report import DIRECT, FACADE, best_fastapi, gates
from tests.unit.test_bench_goodput import step_record


def _record(good: float, at_2x_p99: float | None = None, lone: float = 1.0) -> dict:
    steps = [step_record(good / 2, 5), step_record(good, 9), step_record(good * 2, 80, errors=0.2)]
    overloads = {
        "1.5": step_record(good * 1.5, 20, errors=0.1),
        "2.0": step_record(good * 2, at_2x_p99 or 50, errors=0.4),
    }
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
    assert goodput_report.rounds_table(data)[2:4] == ["| 1 | 150.0 | 100.0 | 1.50x |", "| 2 | 140.0 | 100.0 | 1.40x |"]


def test_the_report_has_a_table_per_model_the_plots_and_every_gate(tmp_path):
    results = _results()
    text_record = results["models"]["text_classifier"]["servers"][DIRECT]
    text_record["steps"][1]["lag_p99_ms"] = 3.0  # over a tenth of the 10 ms objective
    text_record["steps"][0]["other_errors"] = {"INTERNAL": 4}  # a peer failing batches of mixed lengths, say
    text_record["steps"][2]["other_errors"] = {"INTERNAL": 1, "UNKNOWN": 2}
    results["models"]["resnet50"]["servers"][DIRECT]["steps"][1].update(server_cpu_s=0.3, client_cpu_s=0.1)
    common = step_record(
        6.0, 50.0, answered=30, server_cpu_s=0.3, client_cpu_s=0.03
    )  # the rate every server is offered
    results["models"]["resnet50"]["servers"][DIRECT]["common"] = common
    judged = gates(results)
    text = goodput_report.open_report(tmp_path, results, judged)
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
    assert "--facade-layout" not in text  # the facade ran the configs' layouts
    results["settings"]["facade_layout"] = "1 instance x 1 intra-op thread"
    apart = goodput_report.open_report(tmp_path, results, judged)
    assert "The facade's Triton ran each model with 1 instance x 1 intra-op thread in place of its" in apart
    assert "## Gates" in text and text.count("**FAILED**") == sum(not gate.passed for gate in judged)
    for png in ("goodput.png", "resnet50_open.png", "text_classifier_open.png"):
        assert (tmp_path / png).stat().st_size > 1000 and f"]({png})" in text
    assert len(json.loads((tmp_path / "results.json").read_text())["gates"]) == len(judged)
