"""The tritonclient scripts a user runs, against the real server, over both protocols."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.kserve import reference_session
from tests.serving import SERVED_MODELS, onnx_file
from tritonnx.common.admin import ADMIN_KEY_ENV


@pytest.fixture(autouse=True)
def admin_key(triton, monkeypatch):
    """The scripts find the server's restricted-API key in the environment, as after `make serve`."""
    monkeypatch.setenv(ADMIN_KEY_ENV, triton.admin_key)


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_health_reports_every_model_ready(triton, protocol):
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    done = run("tritonnx.client.triton_health", "--url", url, "--protocol", protocol, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert json.dumps(report).count('"ready": true') >= 1 + len(SERVED_MODELS)
    assert {m["name"] for m in report["models"]} == set(SERVED_MODELS)


def test_health_exits_1_for_an_unknown_model(triton):
    done = run("tritonnx.client.triton_health", "--url", triton.grpc_url, "--model", "no_such_model")
    assert done.returncode == 1
    assert "no_such_model" in done.stdout + done.stderr


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_infer_with_a_file_prints_the_top_k_of_onnxruntime(triton, protocol, tmp_path):
    image = np.random.default_rng(3).standard_normal((1, 3, 224, 224), dtype=np.float32)
    np.save(tmp_path / "image.npy", image)
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    done = run(
        "tritonnx.client.triton_infer",
        "--model",
        "mobilenet_v3_small",
        "--url",
        url,
        "--protocol",
        protocol,
        "--input",
        str(tmp_path / "image.npy"),
        "--top-k",
        "3",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    printed = json.dumps(json.loads(done.stdout))
    expected = reference_session(onnx_file("mobilenet_v3_small")).run(["output"], {"input": image})[0][0]
    for index in np.argsort(expected)[::-1][:3]:
        assert str(int(index)) in printed


def test_infer_a_text_model_with_random_tokens(triton):
    done = run(
        "tritonnx.client.triton_infer",
        "--model",
        "text_classifier",
        "--url",
        triton.grpc_url,
        "--batch-size",
        "2",
        "--seq-len",
        "12",
        "--requests",
        "5",
    )
    assert done.returncode == 0, done.stderr
    assert "logits: FP32 [2, 2]" in done.stdout and "embedding: FP32 [2, 64]" in done.stdout
    assert "p50" in done.stdout


def test_infer_shows_server_errors_without_a_traceback(triton):
    done = run("tritonnx.client.triton_infer", "--model", "resnet50", "--url", triton.grpc_url, "--batch-size", "17")
    assert done.returncode == 1
    assert "INVALID_ARGUMENT" in done.stdout + done.stderr and "Traceback" not in done.stderr
