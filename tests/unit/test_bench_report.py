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


def test_report_sets_every_server_beside_the_limit_and_gives_the_tables(tmp_path):
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
                    "cores": 2,
                },
                "perf_analyzer": [perf_c1, perf],
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
                    "tritonserver": {"rss_mib": 200.0, "pss_mib": 150.0, "processes": 3},
                    "facade": {"rss_mib": 90.0, "pss_mib": 70.0, "processes": 1},
                },
            }
        },
    }
    write_report(tmp_path, results)
    report = (tmp_path / "report.md").read_text()
    assert "Limit, in-process ONNX Runtime (2x1thread b4): 790.0 img/s before the servers, 810.0 after" in report
    # Against the limit's 800 img/s at c=16; perf_analyzer's points beside the load generator's.
    assert "| limit: in-process ONNX Runtime | 790-810 | 1.00x |" in report
    assert "| tritonnx, Triton direct, perf_analyzer | 433 | 0.54x | 3.0 |" in report
    assert "| tritonnx, Triton direct | 400 | 0.50x | 3.5 | the model's config.pbtxt |" in report
    assert "| tritonnx facade | 380 | 0.47x | 4.0 |" in report
    assert "the same load generator: 0.95x the throughput, p50 +2.00 ms." in report
    assert "| tritonserver | n/a | 200.0 | 150.0 | 3 |" in report and "| facade | n/a | 90.0 | 70.0 | 1 |" in report
    assert "| FastAPI 2x1 (after load) | 2.5 | 300.0 | 250.0 | 3 |" in report
    # Every server beside the limit: FastAPI 1x2's unspread run is left out, PyTriton's error said.
    assert "| FastAPI 2x1 | 300 | 0.38x | 5.0 | 2 worker(s) x 1 thread(s) |" in report
    assert "| FastAPI 1x2 | n/a | n/a | n/a |" in report and "- PyTriton, round 1: did not start: no venv" in report
    assert "- FastAPI 1x2, round 1, c=16: 95% / 5% (not spread: not counted)" in report
    assert "| FastAPI 1x2 | 16 | 900.0 |" in report  # measured all the same
    assert "| 16 | 433.4 | 35.62 | 63.48 | 78.98 | 5.18 | 0.67 / 23.51 / 2.32 | 5.12 | 0.00 |" in report
    assert json.loads((tmp_path / "results.json").read_text())["models"]["mobilenet_v3_small"]["limit"]["layout"]

    # A run without c=16 sets the servers beside the limit at its highest concurrency.
    data = results["models"]["mobilenet_v3_small"]
    for key in ("perf_analyzer", "loadgen_kserve", "facade"):
        data[key] = data[key][:1]
    data["peers"] = {}
    write_report(tmp_path, results)
    report = (tmp_path / "report.md").read_text()
    assert "| server | img/s at c=1 |" in report and "| tritonnx facade | 100 | 0.12x | 4.0 |" in report
    assert "the same load generator: 0.91x the throughput, p50 +0.50 ms." in report
