"""`python -m client.serve` as a user runs it: tritonserver, its supervisor and the facade, with facade flags after `--`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from backend.demo_models import generate
from backend.server.admin import ADMIN_KEY_ENV
from backend.server.paths import BUILD_ENV
from backend.server.process import free_ports
from tests.helpers import wait_until
from tests.serving import CHECKOUT, MODEL_REPOSITORY

MODEL = "mobilenet_v3_small"  # the quickest demo model to load: the only one this Triton loads


def test_serve_waits_for_and_prints_the_facade_ports_given_after_the_double_dash(tmp_path):
    generate(MODEL_REPOSITORY, [MODEL], force=False)  # cached after `make models`
    triton_grpc, triton_metrics, facade_http = free_ports(3)
    output = tmp_path / "serve.out"
    command = [
        sys.executable,
        "-m",
        "client.serve",
        "--model-repository",
        str(MODEL_REPOSITORY),
        "--log-dir",
        str(tmp_path),
        "--grpc-port",
        str(triton_grpc),
        "--metrics-port",
        str(triton_metrics),
        "--no-triton-http",
        "--supervisor-metrics-port",
        "-1",
        "--load-model",
        MODEL,
        "--",
        "--default-model",
        MODEL,
        "--port",
        "0",
        "--http-port",
        str(facade_http),
    ]
    env = {**os.environ, BUILD_ENV: str(tmp_path / "build"), ADMIN_KEY_ENV: "serve-test-key"}
    with output.open("w") as out:
        serve = subprocess.Popen(command, cwd=CHECKOUT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def ready() -> str | None:
        text = output.read_text()
        assert serve.poll() is None, f"serve exited with code {serve.returncode}:\n{text}"
        return text if "Ctrl-C stops it." in text else None

    try:
        # Ready once the facade answered /health with a real inference, on the port it was given.
        text = wait_until(ready, 120, "serve reporting ready")
        facade_line = next(line for line in text.splitlines() if line.lstrip().startswith("facade "))
        assert f"http://127.0.0.1:{facade_http}/health" in facade_line, text
        # --port 0: the port the facade bound, printed and answering, not the default 50051.
        grpc_port = int(re.search(r"gRPC 127\.0\.0\.1:(\d+) ", facade_line)[1])
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
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
