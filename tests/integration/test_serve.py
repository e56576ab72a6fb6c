"""`python -m tritonnx.commands.serve` as a user runs it: tritonserver, its supervisor and the facade, with facade flags after `--`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.graphs import small_classifier
from tests.helpers import wait_until
from tests.kserve import assert_close
from tests.serving import CHECKOUT, MODEL_REPOSITORY
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc
from tritonnx.common.admin import ADMIN_KEY_ENV
from tritonnx.common.paths import BUILD_ENV
from tritonnx.offline.demo_models import generate
from tritonnx.server.process import free_ports

MODEL = "mobilenet_v3_small"  # the quickest demo model to load: the only one this Triton loads


@dataclass
class Served:
    process: subprocess.Popen
    output: Path  # what serve printed
    facade_line: str  # its line saying where the facade answers
    grpc_port: int  # the facade's


@contextlib.contextmanager
def serving(tmp_path: Path, repository: Path, serve_flags: list[str], facade_flags: list[str]) -> Iterator[Served]:
    """`python -m tritonnx.commands.serve` on free ports with `repository`, once it printed that it is ready; stopped after."""
    triton_grpc, triton_metrics = free_ports(2)
    output = tmp_path / "serve.out"
    command = [
        sys.executable,
        "-m",
        "tritonnx.commands.serve",
        "--model-repository",
        str(repository),
        "--log-dir",
        str(tmp_path),
        "--grpc-port",
        str(triton_grpc),
        "--metrics-port",
        str(triton_metrics),
        "--no-triton-http",
        "--supervisor-metrics-port",
        "-1",
        *serve_flags,
        "--",
        *facade_flags,
    ]
    env = {**os.environ, BUILD_ENV: str(tmp_path / "build"), ADMIN_KEY_ENV: "serve-test-key"}
    with output.open("w") as out:
        serve = subprocess.Popen(command, cwd=CHECKOUT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def ready() -> str | None:
        text = output.read_text()
        assert serve.poll() is None, f"serve exited with code {serve.returncode}:\n{text}"
        return text if "Ctrl-C stops it." in text else None

    try:
        # Ready once the facade answered /health with a real inference.
        text = wait_until(ready, 120, "serve reporting ready")
        facade_line = next(line for line in text.splitlines() if line.lstrip().startswith("facade "))
        yield Served(serve, output, facade_line, int(re.search(r"gRPC 127\.0\.0\.1:(\d+) ", facade_line)[1]))
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0, output.read_text()
        assert "facade stopped (exit code 0)" in output.read_text()
    finally:
        if serve.poll() is None:  # stuck starting up, where SIGTERM waits: end it and the servers it started
            started = psutil.Process(serve.pid).children(recursive=True)
            serve.kill()
            serve.wait()
            for child in started:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()


def test_serve_waits_for_and_prints_the_facade_ports_given_after_the_double_dash(tmp_path):
    generate(MODEL_REPOSITORY, [MODEL], force=False)  # cached after `make models`
    (facade_http,) = free_ports(1)
    facade_flags = ["--default-model", MODEL, "--port", "0", "--http-port", str(facade_http)]
    with serving(tmp_path, MODEL_REPOSITORY, ["--load-model", MODEL], facade_flags) as served:
        assert f"http://127.0.0.1:{facade_http}/health" in served.facade_line, served.output.read_text()
        # --port 0: the port the facade bound, printed and answering, not the default 50051.
        with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING


def test_a_repository_with_none_of_the_demo_models_serves_with_no_default_model_set(tmp_path):
    """Your own repository: ready, and a request naming no model answered by its one model as in-process ONNX
    Runtime answers, with nothing in the settings naming it."""
    repository = tmp_path / "models"
    graph = small_classifier(repository / "scorer" / "1" / "model.onnx", seed=4)
    (repository / "scorer" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 8\n')
    with serving(tmp_path, repository, [], ["--port", "0", "--http-port", "0"]) as served:
        http = re.search(r"(http://127\.0\.0\.1:\d+)/health", served.facade_line)[1]
        with urllib.request.urlopen(f"{http}/health", timeout=10) as answer:
            assert json.loads(answer.read())["model"] == "scorer"
        image = np.random.default_rng(4).standard_normal((2, 3, 16, 16), dtype=np.float32)
        with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
            reply = inference_pb2_grpc.InferenceServiceStub(channel).Predict(
                inference_pb2.PredictRequest(raw_data=image.tobytes(), dtype=inference_pb2.FP32, shape=image.shape),
                timeout=30,
            )
        assert reply.model_name == "scorer" and list(reply.shape) == [2, 10]
        expected = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(None, {"image": image})[0]
        assert_close(np.array(reply.predictions, np.float32).reshape(2, 10), expected)
