"""A lone request measured by perf_analyzer (c=1, p50) against in-process ONNX Runtime on the same input.

Serves the checkout's demo models (their config.pbtxt, the backend's defaults) from one tritonserver; perf_analyzer
2.51 at concurrency 1 over gRPC, two rounds; then the in-process single-request p50 of each model on both cores.

Run from the checkout (about 3 minutes):
    PYTHONPATH=. .venv/bin/python bench/reports/2026-11-29-lone-perf-analyzer/lone_perf_analyzer.py
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from bench.limit import measure_single_image
from bench.output import CORES
from tests.serving import MODEL_REPOSITORY
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack

PERF_ANALYZER = Path(".venv/bin/perf_analyzer")
TOKENS = 32  # the text model's input length, in perf_analyzer and in process alike
MODELS = {
    "mobilenet_v3_small": [],
    "text_classifier": [
        "--shape",
        f"input_ids:{TOKENS}",
        "--shape",
        f"attention_mask:{TOKENS}",
        "--input-data",
        "zero",
    ],
    "resnet50": [],
}


def perf_analyzer_p50_ms(url: str, model: str, extra: list[str]) -> float:
    window = "8000" if model == "resnet50" else "4000"
    command = [str(PERF_ANALYZER), "-m", model, "-i", "grpc", "-u", url, "--concurrency-range", "1"]
    command += ["--percentile", "50", "--measurement-interval", window, "-s", "15", *extra]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    found = re.search(r"p50 latency: (\d+) usec", out)
    if found is None:
        raise RuntimeError(f"no p50 in perf_analyzer's output:\n{out[-2000:]}")
    return int(found.group(1)) / 1000


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="lone-perf-analyzer-"))
    repository = link_models(work / "repository", {m: MODEL_REPOSITORY / m for m in MODELS})
    with ServingStack(repository, work / "stack", with_facade=False) as stack:
        for index in range(2):
            for model, extra in MODELS.items():
                p50 = perf_analyzer_p50_ms(stack.triton.grpc_url, model, extra)
                print(f"{model}, round {index + 1}: perf_analyzer c=1 p50 {p50:.3f} ms", flush=True)
    for model in MODELS:
        zeros = np.zeros((1, TOKENS), np.int64)
        feeds = [{"input_ids": zeros, "attention_mask": zeros}] if "text" in model else None
        p50, _ = measure_single_image(MODEL_REPOSITORY / model / "1" / "model.onnx", CORES, 3.0, feeds)
        print(f"{model}: in-process p50 {p50:.2f} ms (the same input)", flush=True)


if __name__ == "__main__":
    main()
