"""The studies (bench/studies/) end to end at their smallest: each runs on real servers and writes its report.

What a study measures is its own business: its gates judge the figures and fail the study when it is run for real
(exit 1, the report naming the gate). Here only the gates a short run on a busy machine cannot miss must pass: every
answer right, no call failed, the processes where the layout puts them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.netfaults.link import unavailable as netfaults_unavailable
from tests.helpers import judged


def test_the_priority_study_runs_without_priorities_and_with_a_niced_lane_and_reports(tmp_path):
    from bench.studies.priority import main

    # The small model: its capacity shows within 2 s however busy the machine (resnet50's batches take seconds).
    code = main(["--model", "mobilenet_v3_small", "--paths", "facade", "--arms", "without", "lane_nice",
                 "--seconds", "3", "--unloaded-seconds", "1", "--capacity-seconds", "2", "--out", str(tmp_path)])  # fmt: skip
    gates = judged(tmp_path, code, ["| without | facade |", "| lane_nice | facade |"])
    assert gates["without, facade: every answer equals in-process ONNX Runtime's"]
    assert gates["lane_nice, facade: every answer equals in-process ONNX Runtime's"]
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert [r["arm"] for r in results] == ["without", "lane_nice"]
    # The lane's arm served its own repository: the model niced, its lane beside it.
    config = (tmp_path / "lane_nice" / "repository" / "mobilenet_v3_small" / "config.pbtxt").read_text()
    assert 'key: "nice"' in config and (tmp_path / "lane_nice" / "repository" / "mobilenet_v3_small_lane").is_dir()


def test_the_cache_study_runs_both_facades_and_reports(tmp_path):
    from bench.studies.cache import main

    code = main(["--seconds", "2", "--rounds", "1", "--distinct", "50", "--out", str(tmp_path)])
    gates = judged(tmp_path, code, ["| 1 | off |", "| 1 | on |"])
    assert gates["no call failed"] and gates["without the cache, no hits"]


def test_the_tracing_study_runs_with_tracing_off_and_on_and_reports(tmp_path):
    from bench.studies.tracing import main

    # Every call traced: a short run still sends Triton's spans.
    code = main(["--seconds", "1", "--warmup", "0.5", "--rounds", "1", "--ratio", "1", "--out", str(tmp_path)])
    gates = judged(tmp_path, code, ["| 1 | on |", "| 1 | off |", "| round | throughput on/off | overhead |"])
    assert gates["no call failed"] and gates["tracing on: traces joined with Triton's in every run"]


def test_the_pipeline_study_runs_and_reports(tmp_path):
    from bench.studies.pipeline import main

    code = main(["--models", "mobilenet_v3_small", "--seconds", "1", "--warmup", "0.5", "--images", "4",
                 "--max-requests", "100", "--out", str(tmp_path)])  # fmt: skip
    gates = judged(tmp_path, code, ["| mobilenet_v3_small |", "## mobilenet_v3_small", "CPU ms per image"])
    assert all(gates.values()), gates  # answers, failures and the ensemble's steps: none is a figure
    [result] = json.loads((tmp_path / "results.json").read_text())["results"]
    assert set(result["stages"]) == {"mobilenet_v3_small_image", "image_preprocess", "mobilenet_v3_small"}
    assert len(result["limit"]) == 4


def test_the_burst_study_runs_and_reports(tmp_path):
    from bench.studies.burst import main

    code = main(["--calls", "40", "--rounds", "1", "--max-in-flight", "8", "--out", str(tmp_path)])
    gates = judged(tmp_path, code, ["| burst | accepted | refused |", "| 1 |", "the facade's own"])
    assert gates["every accepted answer equals in-process ONNX Runtime's"]
    assert gates["no status but OK and RESOURCE_EXHAUSTED"]
    facade = json.loads((tmp_path / "results.json").read_text())["facade_rejection_p99_ms"]
    assert len(facade["overloaded"]) == len(facade["priority_reserve"]) == 1


def test_the_lone_request_study_places_the_average_call_and_reports(tmp_path):
    from bench.studies.lone import main

    code = main(["--rounds", "1", "--measurement-ms", "1000", "--runs", "20", "--busy", "2", "--out", str(tmp_path)])
    gates = judged(tmp_path, code, ["## In-process ONNX Runtime", "## Served at c=1", "## The same arms at c=2"])
    assert gates["the timed stub recorded every execution"]
    [data] = json.loads((tmp_path / "results.json").read_text())["rounds"]
    own = next(point for point in data["served"].values() if "error" not in point)  # a stalling arm may not be
    assert own["executions_timed"] >= own["execution_count"] > 0 and own["stub_mean"]["run_ms"] > 0


def test_the_generators_study_offers_every_rate_with_both_generators_and_reports(tmp_path):
    from bench.studies.generators import main

    args = ["--models", "text_classifier", "--step-seconds", "1", "--single-seconds", "0.5", "--out", str(tmp_path)]
    sections = ["## text_classifier", "### tritonnx, Triton direct", "### FastAPI 2x1", "| offered req/s |"]
    gates = judged(tmp_path, main(args), sections)
    assert all(gates.values()), gates  # answers right; every rate measured by both (or refused by Triton)
    servers = json.loads((tmp_path / "results.json").read_text())["models"]["text_classifier"]["servers"]
    triton, fastapi = servers["tritonnx, Triton direct"], servers["FastAPI 2x1"]
    for record in (triton, fastapi):
        assert len(record["python"]) == len(record["compiled"]) == 8
        assert all(step["answered"] > 0 for step in record["python"])
    # The sequences of mixed lengths reached Triton through perf_analyzer's input data, and FastAPI through
    # poisson-http, which checked every answer.
    assert triton["compiled"][0]["inference_count"] > 0
    assert fastapi["compiled"][0]["answered"] > 0 and fastapi["compiled"][0]["wrong"] == 0
    assert set(fastapi["goodput_rps"]) == {"Python open loop", "poisson-http"}
    assert (tmp_path / "generators.png").stat().st_size > 0


def test_the_goodput_rounds_study_measures_every_server_each_round_and_reports(tmp_path):
    from bench.studies.goodput_rounds import main

    args = ["--rounds", "2", "--step-seconds", "0.5", "--capacity-seconds", "0.5", "--single-seconds", "0.5",
            "--out", str(tmp_path)]  # fmt: skip
    gates = judged(tmp_path, main(args), ["| round |", "| 2 |", "| median |"])
    assert gates["every server answered right and was measured in every round"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert [set(r) for r in results["rounds"]] == [{"tritonnx, Triton direct", "FastAPI 1x2", "FastAPI 2x1"}] * 2
    # Two rounds are too few for a 90% interval: the goal is not judged met or missed on them.
    goal = next(g for g in results["gates"] if "goodput >=" in g["name"])
    assert not goal["passed"] and goal["detail"].startswith("undecided: too few rounds")
    assert (tmp_path / "rounds.png").stat().st_size > 0


@pytest.mark.skipif(bool(netfaults_unavailable()), reason=netfaults_unavailable() or "")
def test_the_netfaults_study_runs_and_reports(tmp_path):
    from bench.studies.netfaults import main

    code = main(["--faults", "reset", "delay", "--seconds", "1", "--calm-seconds", "0.5", "--out", str(tmp_path)])
    gates = judged(tmp_path, code, ["| fault | what |", "| reset |", "| delay |"])
    assert gates["every answer equals in-process ONNX Runtime's"]
    assert gates["failures only of the statuses each fault explains"]


def test_the_split_cores_study_places_the_processes_and_reports(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.studies.split_cores", "--concurrency", "2", "--duration", "1", "--rounds", "1",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert (tmp_path / "report.md").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    gates = judged(tmp_path, done.returncode, ["| Triton direct |", "| facade |", "facade / Triton direct:"])
    assert all(gates.values()), (gates, done.stdout[-3000:], done.stderr[-3000:])  # placement and failures only


def test_the_openvino_study_serves_with_and_without_the_accelerator_from_its_venv_and_reports(tmp_path):
    from bench.studies.openvino import main

    # The stubs run build/openvino-venv, made on first use (onnxruntime-openvino and the serving requirements).
    code = main(["--models", "mobilenet_v3_small", "--concurrency", "1", "--seconds", "1", "--warmup", "0.5",
                 "--rounds", "1", "--out", str(tmp_path)])  # fmt: skip
    rows = ["| mobilenet_v3_small | 1 | 1 | cpu |", "| mobilenet_v3_small | 1 | 1 | openvino |"]
    gates = judged(tmp_path, code, [*rows, "## OpenVINO against the CPU provider", "## What ran in the stubs"])
    stubs = next(passed for name, passed in gates.items() if name.startswith("the stubs ran onnxruntime"))
    answers = next(passed for name, passed in gates.items() if name.startswith("every answer agrees"))
    assert stubs and answers and gates["no call failed"], gates  # what ran where, and right: none is a figure
    instances = json.loads((tmp_path / "results.json").read_text())["instances"]
    assert {i["arm"]: i["providers"][0] for i in instances} == {
        "cpu": "CPUExecutionProvider",
        "openvino": "OpenVINOExecutionProvider",
    }


def test_the_int8_study_serves_fp32_and_int8_files_and_reports(tmp_path):
    from bench.studies.int8 import main

    # The two fast models; resnet50's calibration alone takes most of a minute.
    code = main(["--models", "mobilenet_v3_small", "text_classifier", "--seconds", "1", "--warmup", "0.5",
                 "--rounds", "1", "--out", str(tmp_path)])  # fmt: skip
    rows = [f"| {m} | 16 | 1 | {arm} |" for m in ("mobilenet_v3_small", "text_classifier") for arm in ("fp32", "int8")]
    gates = judged(tmp_path, code, [*rows, "## INT8 against FP32", "## The INT8 files"])
    answers = next(passed for name, passed in gates.items() if name.startswith("every answer checked agrees"))
    assert answers and gates["no call failed"], gates  # the goals are figures: not judged here
    assert gates["every INT8 file passed the agreement gate (default limits)"], gates
    quantization = json.loads((tmp_path / "results.json").read_text())["quantization"]
    assert quantization["text_classifier"]["batch_coupled"] and not quantization["mobilenet_v3_small"]["batch_coupled"]
