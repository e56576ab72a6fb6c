"""The benchmark's parsing of perf_analyzer output and its report, on recorded/synthetic data."""

import json

import pytest

from bench.perf import PerfAnalyzerError, parse
from bench.report import write_report

CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,"
    "Avg latency,request/response,response wait\n"
    "16,433.379,77,5062,5180,667,23514,2319,2,35618,55923,63483,78976,36824,79,36684\n"
)
STDOUT = """Request concurrency: 16
  Server:
    Inference count: 6335
    Execution count: 1237
    Successful request count: 6335
"""


def test_perf_analyzer_csv_and_counts_are_read():
    point = parse("mobilenet_v3_small", CSV, STDOUT, client_cpu=0.4)
    assert point.concurrency == 16 and point.throughput == pytest.approx(433.379)
    assert point.p50_ms == pytest.approx(35.618) and point.p99_ms == pytest.approx(78.976)
    assert point.server_queue_ms == pytest.approx(5.18) and point.server_compute_infer_ms == pytest.approx(23.514)
    assert (point.inference_count, point.execution_count) == (6335, 1237)
    assert point.as_dict()["avg_batch"] == 5.12 and point.client_cpu == 0.4


def test_unreadable_perf_analyzer_output_is_an_error():
    with pytest.raises(PerfAnalyzerError, match="no measurement"):
        parse("m", CSV.splitlines()[0] + "\n", STDOUT)
    with pytest.raises(PerfAnalyzerError, match="inference/execution counts"):
        parse("m", CSV, "nothing here")


def load_point(concurrency: int, images: float, p50: float) -> dict:
    return {
        "concurrency": concurrency,
        "images_per_s": images,
        "p50_ms": p50,
        "p95_ms": p50 * 1.5,
        "p99_ms": p50 * 2,
        "client_cpu": 0.3,
        "errors": {},
    }


UNSPREAD = {"shares": [0.95, 0.05], "spread": False, "runs": 2, "cpu_seconds": [1.9, 0.1]}


def test_report_gives_ratios_tables_and_plots(tmp_path):
    perf = parse("mobilenet_v3_small", CSV, STDOUT).as_dict()
    perf_c1 = dict(perf, concurrency=1, throughput=120.0, p50_ms=3.0)
    results = {
        "started": "20261122T000000Z",
        "machine": "test",
        "settings": {},
        "models": {
            "mobilenet_v3_small": {
                "limit": {
                    "images_per_s": 800.0,
                    "before": 790.0,
                    "after": 810.0,
                    "layout": "2x1thread b4",
                    "single_p50_ms": 2.0,
                    "single_p99_ms": 3.0,
                    "cpu_ms_per_image": 2.5,
                    "cores": 2,
                },
                "perf_analyzer": [
                    perf_c1,
                    dict(
                        perf,
                        cpu_ms_per_image={
                            "stubs": 3.0,
                            "tritonserver": 0.5,
                            "client": 0.5,
                            "idle": 0.2,
                            "total": 4.0,
                            "images": 900,
                        },
                    ),
                ],
                "floor": [
                    dict(perf_c1, p50_ms=0.7),
                    dict(
                        perf,
                        cpu_ms_per_image={
                            "stubs": 0.3,
                            "tritonserver": 0.4,
                            "client": 0.3,
                            "idle": 0.1,
                            "total": 1.0,
                            "images": 900,
                        },
                    ),
                ],
                "loadgen_kserve": [load_point(1, 110.0, 3.5), load_point(16, 400.0, 40.0)],
                "facade": [load_point(1, 100.0, 4.0), load_point(16, 380.0, 42.0)],
                "peers": {
                    "FastAPI 2x1": {
                        "setup": "2 worker(s) x 1 thread(s)",
                        "rounds": [
                            {
                                "ready_seconds": 2.5,
                                "points": [load_point(1, 90.0, 5.0), load_point(16, 300.0, 50.0)],
                                "memory": {"rss_mib": 300.0, "pss_mib": 250.0, "processes": 3},
                            }
                        ],
                    },
                    "FastAPI 1x2": {  # its load did not spread over its workers: shown, not counted
                        "setup": "1 worker(s) x 2 thread(s)",
                        "rounds": [{"points": [dict(load_point(16, 900.0, 9.0), worker_cpu=UNSPREAD)]}],
                    },
                    "PyTriton": {"setup": "p", "rounds": [{"error": "did not start: no venv"}]},
                },
                "servers": {
                    "tritonserver": {
                        "ready_seconds": 1.5,
                        "first_ready_seconds": 3.2,
                        "rss_mib": 200.0,
                        "pss_mib": 150.0,
                        "processes": 3,
                    },
                    "facade": {"rss_mib": 90.0, "pss_mib": 70.0, "processes": 1},
                },
            }
        },
    }
    write_report(tmp_path, results)
    report = (tmp_path / "report.md").read_text()
    assert "| Triton direct, perf_analyzer (best, c=16) | 433.4 img/s | 0.54x | 1.44x vs FastAPI |" in report
    assert "| facade vs Triton direct at c=16 | 380.0 vs 400.0 img/s | 0.95x | p50 +2.00 ms |" in report
    assert (
        "| c=1 p50, Triton direct vs in-process single image (with the limit) | 3.00 vs 2.00 ms | | +1.00 ms |"
        in report
    )
    # Served 3.0 ms at c=1, 0.7 ms of it the floor: 2.3 ms for the model, 2.0 ms in-process.
    assert (
        "| c=1 p50, serving floor: same server and config, a model that computes nothing | 0.70 ms | | "
        "served minus floor 2.30 ms vs the model's 2.00 ms in-process |"
    ) in report
    # The floor's 1.0 ms plus in-process ONNX Runtime's 2.5 ms: 2 cores serve at most 571 img/s, 0.71x.
    assert (
        "| serving floor, perf_analyzer (a model that computes nothing; batch 5.12) | 0.30 | 0.40 | - | 0.30 | 0.10 | "
        "1.00 | 571 img/s with in-process ONNX Runtime | 0.71x |"
    ) in report
    assert "| tritonserver | 1.5 | 3.2 | 200.0 | 150.0 | 3 |" in report and "| facade | n/a | n/a | 90.0 |" in report
    assert "| FastAPI 2x1 (after load) | 2.5 | n/a | 300.0 | 250.0 | 3 |" in report
    # Every server beside the limit: FastAPI 1x2's unspread run is left out, PyTriton's error said.
    assert "| FastAPI 2x1 | 300 | 0.38x | 5.0 | 2 worker(s) x 1 thread(s) |" in report
    assert "| FastAPI 1x2 | n/a | n/a | n/a |" in report and "- PyTriton, round 1: did not start: no venv" in report
    assert "- FastAPI 1x2, round 1, c=16: 95% / 5% (not spread: not counted)" in report
    assert "| FastAPI 1x2 | 16 | 900.0 |" in report  # measured all the same
    # 2 cores / 4.0 ms per image = 500 img/s at best, 0.62x of the 800 img/s limit.
    assert "### Where the CPU goes at c=16" in report
    assert "| in-process ONNX Runtime (2x1thread b4) | 2.50 | - | - | - | - | 2.50 | 800 img/s | - |" in report
    assert "| Triton direct, perf_analyzer | 3.00 | 0.50 | - | 0.50 | 0.20 | 4.00 | 500 img/s | 0.62x |" in report
    assert json.loads((tmp_path / "results.json").read_text())["models"]["mobilenet_v3_small"]["limit"]["layout"]
    for name in ("mobilenet_v3_small_throughput.png", "mobilenet_v3_small_latency.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"

    # Measured just before and after the c=1 point, the in-process figure is the one compared.
    results["models"]["mobilenet_v3_small"]["single_image_beside_c1"] = {"p50_ms": 2.5, "p99_ms": 3.5}
    write_report(tmp_path, results)
    report = (tmp_path / "report.md").read_text()
    assert (
        "| c=1 p50, Triton direct vs in-process single image (measured beside it) | 3.00 vs 2.50 ms | | +0.50 ms |"
        in report
    )
    assert "served minus floor 2.30 ms vs the model's 2.50 ms in-process |" in report
