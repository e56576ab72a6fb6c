"""`make bench` end to end at the smallest size: every stage runs and the report is written.

Speed is not asserted here (the figures come from `make bench` on a quiet machine); this only
keeps the benchmark runnable from a clean clone.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_the_benchmark_runs_every_stage_and_writes_its_report(tmp_path):
    out = tmp_path / "bench"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--models",
            "mobilenet_v3_small",
            "--concurrency",
            "1",
            "--duration",
            "1",
            "--limit-seconds",
            "0.3",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())["models"]["mobilenet_v3_small"]
    assert data["limit"]["images_per_s"] > 0 and data["limit"]["single_p50_ms"] > 0
    assert data["perf_analyzer"][0]["throughput"] > 0 and data["perf_analyzer"][0]["avg_batch"] >= 1
    for sweep in ("loadgen_kserve", "facade"):
        point = data[sweep][0]
        assert point["images_per_s"] > 0 and not point["errors"], (sweep, point)
    assert len(data["fastapi"]) == 2 and all(s["points"][0]["images_per_s"] > 0 for s in data["fastapi"].values())
    startup = next(
        item for name, item in data["servers"].items() if name.startswith("tritonserver (mobilenet_v3_small only")
    )
    assert startup["ready_seconds"] > 0 and startup["first_ready_seconds"] > 0
    # Where the CPU went, measured on the real processes: every role on each path spent some.
    assert data["limit"]["cpu_ms_per_image"] > 0
    for sweep, roles in (
        ("perf_analyzer", ("stubs", "tritonserver", "client")),
        ("loadgen_kserve", ("stubs", "tritonserver", "client")),
        ("facade", ("stubs", "tritonserver", "facade", "client")),
    ):
        cpu = data[sweep][0]["cpu_ms_per_image"]
        assert cpu["images"] > 0 and all(cpu[role] > 0 for role in roles), (sweep, cpu)
        assert cpu["total"] == pytest.approx(sum(cpu[role] for role in roles), abs=0.01)
    # The serving floor (a model that computes nothing) ran on the same config, at the one concurrency;
    # the in-process single image was measured beside the c=1 point.
    [floor] = data["floor"]
    assert floor["concurrency"] == 1 and floor["throughput"] > 0 and floor["cpu_ms_per_image"]["stubs"] > 0
    beside = data["single_image_beside_c1"]
    assert beside["before_p50_ms"] > 0 and beside["after_p50_ms"] > 0
    report = (out / "report.md").read_text()
    assert "| c=1 p50, Triton direct vs in-process single image (measured beside it) |" in report
    assert "| c=1 p50, serving floor: same server and config, a model that computes nothing |" in report
    assert "| serving floor, perf_analyzer (a model that computes nothing; batch " in report
    assert "| limit: in-process ONNX Runtime" in report and "vs Triton direct (same generator)" in report
    assert "### Where the CPU goes at c=1" in report and "| facade, project load generator |" in report
    assert (out / "mobilenet_v3_small_throughput.png").stat().st_size > 1000
    assert (out / "mobilenet_v3_small_latency.png").stat().st_size > 1000


def test_the_priority_benchmark_keeps_high_priority_requests_in_under_overload(tmp_path):
    from bench.priority import main as priority_main

    out = tmp_path / "priority"
    assert priority_main(["--paths", "direct", "--seconds", "5", "--unloaded-seconds", "1", "--capacity-seconds",
                          "2", "--out", str(out)]) == 0  # fmt: skip
    results = {r["priorities"]: r for r in json.loads((out / "results.json").read_text())}
    assert results[True]["wrong_outputs"] == results[False]["wrong_outputs"] == 0
    assert results[True]["high"]["rejected_pct"] < results[True]["other"]["rejected_pct"]
    assert results[True]["high"]["rejected_pct"] < results[False]["high"]["rejected_pct"]
    assert "| direct | with |" in (out / "report.md").read_text()


def test_the_cache_benchmark_measures_both_facades_and_the_hit_ratio(tmp_path):
    from bench.cache import main as cache_main

    out = tmp_path / "cache"
    assert cache_main(["--seconds", "2", "--rounds", "1", "--distinct", "50", "--out", str(out)]) == 0
    runs = {r["cache"]: r for r in json.loads((out / "results.json").read_text())}
    assert runs[False]["hit_ratio"] == 0 and runs[True]["hit_ratio"] > 0.5
    assert runs[True]["throughput_rps"] > 0 and runs[False]["throughput_rps"] > 0


def test_the_tracing_benchmark_runs_with_tracing_off_and_on_and_sees_joined_traces(tmp_path):
    from bench.tracing import main as tracing_main

    out = tmp_path / "tracing"
    assert tracing_main(["--seconds", "1", "--warmup", "0.5", "--rounds", "1", "--out", str(out)]) == 0
    runs = {r["tracing"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert runs[False]["traces"] == 0 and runs[True]["traces"] > 0
    assert runs[True]["throughput_rps"] > 0 and runs[False]["throughput_rps"] > 0
    assert "| 1 | on |" in (out / "report.md").read_text()


def test_pytriton_in_the_benchmark_answers_like_onnx_runtime_and_is_measured(tmp_path):
    """PyTriton from its own venv (made under build/peers/ on first use), as `make bench` runs it."""
    import argparse

    from bench import REPOSITORY
    from bench.__main__ import bench_pytriton

    model = "mobilenet_v3_small"
    servers: dict = {}
    args = argparse.Namespace(concurrency=[1, 4], duration=1.0)
    data = bench_pytriton(model, REPOSITORY / model / "1" / "model.onnx", args, tmp_path, servers)
    assert "points" in data, data  # neither left out (no venv) nor failed (answers unlike ONNX Runtime)
    assert [p["concurrency"] for p in data["points"]] == [1, 4]
    assert all(p["images_per_s"] > 0 and not p["errors"] for p in data["points"]), data["points"]
    assert "3 instances" in data["setup"]  # the model's own config.pbtxt policy
    memory = servers["PyTriton (after load)"]
    assert memory["ready_seconds"] > 0 and memory["pss_mib"] > 0 and memory["processes"] >= 3
