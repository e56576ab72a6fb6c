"""The generators study's pure parts: perf_analyzer's input data and each generator's goodput."""

import json

import numpy as np

from bench.studies.generators import goodputs, perf_input_data


def test_text_requests_become_perf_analyzer_steps_without_the_batch_dimension(tmp_path):
    requests = [
        {"input_ids": np.array([[5, 6, 7]], np.int64), "attention_mask": np.ones((1, 3), np.int64)},
        {"input_ids": np.array([[9]], np.int64), "attention_mask": np.ones((1, 1), np.int64)},
    ]
    path = perf_input_data(requests, tmp_path)
    steps = json.loads((tmp_path / "perf-input.json").read_text())["data"]
    assert path == str(tmp_path / "perf-input.json")
    assert steps[0]["input_ids"] == {"content": [5, 6, 7], "shape": [3]}
    assert steps[1]["attention_mask"] == {"content": [1], "shape": [1]}
    assert perf_input_data([np.zeros((1, 3, 224, 224), np.float32)], tmp_path) == "random"


def open_step(rate: float, p99: float, error_share: float = 0.0) -> dict:
    return {"offered_rps": rate, "answered": 10, "p99_ms": p99, "error_share": error_share}


def test_each_generator_finds_the_highest_rate_within_the_objective():
    record = {
        "generator": "perf_analyzer",
        "python": [open_step(100, 8), open_step(200, 30), open_step(300, 12, error_share=0.01)],
        "compiled": [
            {"offered_rps": 100, "p99_ms": 5},
            {"offered_rps": 200, "p99_ms": 20},
            {"offered_rps": 300, "refused": True, "error": "Triton refused calls"},
        ],
    }
    # Python: 200/s broke the objective, 300/s had errors; perf_analyzer: a refused step keeps nothing.
    assert goodputs(record, 25.0) == {"Python open loop": 100, "perf_analyzer": 200}


def test_poisson_http_steps_are_judged_as_the_python_loop_s():
    record = {
        "generator": "poisson-http",
        "python": [open_step(100, 8)],
        "compiled": [open_step(100, 8), open_step(200, 20, error_share=0.01), open_step(300, 40)],
    }
    assert goodputs(record, 25.0) == {"Python open loop": 100, "poisson-http": 100}
