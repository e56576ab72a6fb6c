"""`make bench` end to end at the smallest size: every stage runs and the report is written.

No figure is asserted here (they come from `make bench` on a quiet machine); this only keeps the
benchmark runnable from a clean clone, with every stage and section of its report.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

from tests.helpers import judged


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
    # Every stage ran and left its point; what the figures are is `make bench`'s business.
    assert {"before", "after", "images_per_s", "single_p50_ms"} <= set(data["limit"])
    for sweep in ("perf_analyzer", "loadgen_kserve", "facade"):
        assert [point["concurrency"] for point in data[sweep]] == [1], sweep
    for sweep in ("loadgen_kserve", "facade"):
        assert not data[sweep][0]["errors"], (sweep, data[sweep][0])  # every answer came back
    fastapi = {name: peer["rounds"][0] for name, peer in data["peers"].items() if name.startswith("FastAPI")}
    assert [len(record["points"]) for record in fastapi.values()] == [1, 1], fastapi
    assert {"tritonserver (all models, after load)", "facade (after load)"} <= set(data["servers"])
    report = (out / "report.md").read_text()
    assert "| limit: in-process ONNX Runtime" in report and "| tritonnx, Triton direct, perf_analyzer |" in report
    assert "The facade against Triton direct at c=1, the same load generator:" in report
    for section in ("### Triton direct (perf_analyzer", "### Project load generator", "### Memory after load"):
        assert section in report


def test_pytriton_in_the_benchmark_answers_like_onnx_runtime_and_is_measured(tmp_path):
    """PyTriton from its own venv (made under build/peers/ on first use), as `make bench` runs it."""
    from bench import REPOSITORY
    from bench.peers import peer_servers, servers

    model = "mobilenet_v3_small"
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    policy = servers.Policy.of(REPOSITORY / model, 2)
    pytriton = peer_servers.peer("pytriton", model, onnx_file, policy, tmp_path)
    record = servers.closed_loop(pytriton, onnx_file, [1, 4], 1.0)
    assert "points" in record, record  # neither left out (no venv) nor failed (answers unlike ONNX Runtime)
    assert [p["concurrency"] for p in record["points"]] == [1, 4]
    assert not any(p["errors"] for p in record["points"]), record["points"]
    assert f"{policy.triton_instances} instances" in pytriton.description  # the model's own config.pbtxt policy
    assert record["ready_seconds"] > 0 and record["memory"]["processes"] >= 3  # Triton, its proxy, the model


def test_the_soak_runs_every_phase_publishes_under_load_and_is_judged(tmp_path):
    """`make soak` at its smallest: every demo model through both paths, capacities measured, one publish."""
    out = tmp_path / "soak"
    command = [sys.executable, "-m", "bench.soak", "--duration", "30", "--interval", "2", "--publish-every", "15",
               "--publish-models", "mobilenet_v3_small", "--capacity-seconds", "1", "--capacity-concurrency", "4",
               "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    print(done.stdout[-5000:], done.stderr[-3000:])
    sections = ["## Load", "## Versions published", "## Growth after the warm-up"]
    gates = judged(out, done.returncode, sections)
    # Behaviour, not figures: the slopes of a 30 s run are noise, and its gates say so in the report.
    assert gates["every answer right (each output against in-process ONNX Runtime)"]
    assert gates["no call failed but the documented rejections"]
    assert gates["every version publish (1 due) served, both paths answered by the new version"]
    assert gates["no process died or restarted; nothing left behind after the stop"]
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["totals"]["streams"]) == sorted(
        f"{path}.{model}"
        for path in ("facade", "triton")
        for model in ("resnet50", "mobilenet_v3_small", "text_classifier", "token_classifier")
    )
    with open(out / "samples.csv", newline="") as handle:
        samples = list(csv.DictReader(handle))
    assert len(results["capacities"]) == 8 and len(samples) >= 10
    sampled = {column for row in samples for column, value in row.items() if value != ""}
    for process in ("tritonserver", "facade", "supervisor", "mobilenet_v3_small_0_0@v2"):
        assert {f"rss_mib.{process}", f"pss_mib.{process}", f"fds.{process}", f"threads.{process}"} <= sampled
    assert not (out / "repository").exists()  # the scratch copy with the published versions is removed


def test_the_open_loop_goodput_mode_steps_every_rate_with_every_answer_checked(tmp_path):
    """`make bench-peers PEERS_ARGS="--open-loop --smoke"` on tritonnx's two paths and PyTriton, with the text model.

    Behaviour, not figures: every step ran and sorted every scheduled call, no answer was wrong, the text model's
    sequences of mixed lengths (named INT64 inputs) went through both paths and a KServe peer from its own venv, and
    the report with its plots and gates was written. About a minute.
    """
    from bench.peers.goodput import STEPS

    out = tmp_path / "open"
    command = [sys.executable, "-m", "bench.peers", "--open-loop", "--smoke", "--models", "text_classifier",
               "--servers", "triton", "facade", "pytriton", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    print(done.stdout[-5000:], done.stderr[-3000:])
    judged(out, done.returncode, ["## text_classifier"])
    results = json.loads((out / "results.json").read_text())
    for model, data in results["models"].items():
        assert data["objective_ms"] >= 5 * data["single_p50_ms"] > 0
        assert sorted(data["servers"]) == ["PyTriton", "tritonnx facade", "tritonnx, Triton direct"], model
        for name, record in data["servers"].items():
            assert "error" not in record, (model, name, record.get("error"))
            assert record["capacity_rps"] > 0 and record["wrong"] == 0
            assert [step["factor"] for step in record["steps"]][: len(STEPS)] == list(STEPS)
            for step in record["steps"] + list(record["overloads"].values()):
                assert step["scheduled"] > 0 and step["wrong"] == 0 and not step["other_errors"], (model, name, step)
                ended = step["answered"] + step["refused"] + step["timed_out"] + step["generator_refused"]
                assert ended == step["scheduled"], (model, name, step)
    assert list(results["models"]) == ["text_classifier"]
    for png in ("goodput.png", "text_classifier_open.png"):
        assert (out / png).stat().st_size > 1000
