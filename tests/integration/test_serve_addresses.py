"""tritonnx-serve binds each endpoint where its settings say, and nowhere else; the pods' exec probes reach it.

Three loopback addresses stand for a pod's: 127.0.0.2 for an address other machines reach (--host, Triton's
gRPC), 127.0.0.3 for the one a metrics scraper reaches (--metrics-host), and 127.0.0.1, where Triton's HTTP stays
unless --http-host says otherwise.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import tritonclient.grpc as grpcclient

from tests.helpers import wait_until
from tests.manifests import K8S_OVERLAYS, container, deployment_pod, rendered
from tests.serving import CHECKOUT
from tritonnx.common.admin import ADMIN_KEY_ENV
from tritonnx.common.paths import BUILD_ENV
from tritonnx.server.process import free_ports

GRPC_HOST, METRICS_HOST, LOOPBACK = "127.0.0.2", "127.0.0.3", "127.0.0.1"


def listening(host: str, port: int) -> bool:
    with contextlib.suppress(ConnectionRefusedError), socket.create_connection((host, port), timeout=5):
        return True
    return False


def answers(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status == 200


def probes_pass(http_port: int) -> dict[str, bool]:
    """Whether each exec probe of the manifests' triton containers passes, run here with their port variable."""
    passed = {}
    for overlay in K8S_OVERLAYS:
        triton = container(deployment_pod(rendered(overlay)), "triton")
        for kind in ("startupProbe", "livenessProbe"):
            env = {**os.environ, "TRITONNX_TRITON_HTTP_PORT": str(http_port)}
            done = subprocess.run(triton[kind]["exec"]["command"], env=env, capture_output=True, timeout=30)
            passed[f"{overlay} {kind}"] = done.returncode == 0
    return passed


def test_grpc_metrics_and_http_each_listen_only_where_their_setting_says(tmp_path: Path):
    http, grpc, metrics, supervisor = free_ports(4)
    repository = tmp_path / "repository"
    repository.mkdir()  # no models: only the endpoints matter here
    output = tmp_path / "serve.out"
    command = [sys.executable, "-m", "tritonnx.commands.serve", "--model-repository", str(repository), "--log-dir",
               str(tmp_path), "--no-facade", "--host", GRPC_HOST, "--metrics-host", METRICS_HOST,
               "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
               "--supervisor-metrics-port", str(supervisor)]  # fmt: skip
    env = {**os.environ, BUILD_ENV: str(tmp_path / "build"), ADMIN_KEY_ENV: "addresses-test"}
    env.pop("TRITONNX_TRITON_HTTP_HOST", None)
    with output.open("w") as out:
        serve = subprocess.Popen(command, cwd=CHECKOUT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def ready() -> str:
        text = output.read_text()
        assert serve.poll() is None, f"serve exited with code {serve.returncode}:\n{text}"
        return text if "Ctrl-C stops it." in text else ""

    try:
        text = wait_until(ready, 120, "serve reporting ready")
        assert f"HTTP {LOOPBACK}:{http}  gRPC {GRPC_HOST}:{grpc}  metrics http://{METRICS_HOST}:{metrics}" in text
        assert f"supervisor  http://{METRICS_HOST}:{supervisor}/metrics" in text

        with grpcclient.InferenceServerClient(f"{GRPC_HOST}:{grpc}") as client:
            assert client.is_server_live()
        assert answers(f"http://{LOOPBACK}:{http}/v2/health/live")
        assert "nv_" in urllib.request.urlopen(f"http://{METRICS_HOST}:{metrics}/metrics", timeout=5).read().decode()
        assert answers(f"http://{METRICS_HOST}:{supervisor}/metrics")
        for host, port in [(LOOPBACK, grpc), (METRICS_HOST, grpc), (GRPC_HOST, http), (METRICS_HOST, http),
                           (GRPC_HOST, metrics), (GRPC_HOST, supervisor), (LOOPBACK, supervisor)]:  # fmt: skip
            assert not listening(host, port), f"something answers on {host}:{port}"
        assert all(probes_pass(http).values()), probes_pass(http)
        assert not any(probes_pass(free_ports(1)[0]).values())  # where nothing listens, they fail
    finally:
        started = psutil.Process(serve.pid).children(recursive=True) if serve.poll() is None else []
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
            for child in started:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
    assert serve.returncode == 0, output.read_text()
