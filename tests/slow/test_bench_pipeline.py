"""python -m bench.studies.pipeline end to end at its smallest: a real tritonserver, every answer checked, a report written."""

import json

from bench.studies.pipeline import main


def test_the_pipeline_benchmark_runs_and_reports(tmp_path):
    out = tmp_path / "run"
    args = ["--models", "mobilenet_v3_small", "--seconds", "1", "--warmup", "0.5", "--images", "4",
            "--max-requests", "100", "--out", str(out)]  # fmt: skip
    assert main(args) == 0  # no error and no answer unlike in-process
    result = json.loads((out / "results.json").read_text())["results"][0]
    assert result["triton"]["requests"] > 0 and result["wrong_answers"] == 0
    assert set(result["stages"]) == {"mobilenet_v3_small_image", "image_preprocess", "mobilenet_v3_small"}
    assert result["stages"]["image_preprocess"]["requests"] >= result["triton"]["requests"]
    assert len(result["limit"]) == 4 and all(v > 0 for v in result["limit"].values())
    assert "| mobilenet_v3_small |" in (out / "report.md").read_text()
