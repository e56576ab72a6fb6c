"""tritonserver's locked-down defaults: administrative APIs need the key (model control is not
reachable by clients), inference does not; HTTP can be turned off and the facade still works."""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from bench.perf import VENV_BIN
from tests.kserve import make_inputs
from tests.serving import MODEL_REPOSITORY, start_facade
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack

RESTRICTED_GRPC_CALLS = {
    "repository index": lambda c, h: c.get_model_repository_index(headers=h),
    "model control": lambda c, h: c.load_model("no_such_model", headers=h),
    "shared memory": lambda c, h: c.get_system_shared_memory_status(headers=h),
    "trace": lambda c, h: c.get_trace_settings(headers=h),
    "logging": lambda c, h: c.get_log_settings(headers=h),
}


@pytest.mark.parametrize("api", RESTRICTED_GRPC_CALLS)
def test_administrative_grpc_apis_need_the_key(triton, api):
    call = RESTRICTED_GRPC_CALLS[api]
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="restricted"):
            call(client, None)
        with pytest.raises(InferenceServerException, match="restricted"):
            call(client, {"triton-grpc-protocol-tritonnx-admin-key": "wrong"})
        if api == "model control":  # with the key it gets as far as the unknown model
            with pytest.raises(InferenceServerException, match="no_such_model"):
                call(client, triton.admin_headers)
        else:
            call(client, triton.admin_headers)


def test_inference_health_metadata_config_and_statistics_stay_open(triton):
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        assert client.is_server_ready() and client.is_model_ready("mobilenet_v3_small")
        assert client.get_model_metadata("mobilenet_v3_small").name == "mobilenet_v3_small"
        assert client.get_model_config("mobilenet_v3_small").config.max_batch_size > 0
        stats = client.get_inference_statistics("mobilenet_v3_small").model_stats
        assert [s.name for s in stats] == ["mobilenet_v3_small"]
        image = np.zeros((1, 3, 224, 224), np.float32)
        result = client.infer("mobilenet_v3_small", make_inputs({"input": image}))
        assert result.as_numpy("output").shape == (1, 1000)


@pytest.mark.parametrize("path", ["/v2/repository/index", "/v2/systemsharedmemory/status", "/v2/logging"])
def test_administrative_http_apis_need_the_key(triton, path):
    method = "POST" if path.endswith("index") else "GET"
    url = f"http://{triton.http_url}{path}"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data=b"{}" if method == "POST" else None, method=method))
    assert refused.value.code == 403
    request = urllib.request.Request(
        url, data=b"{}" if method == "POST" else None, method=method, headers=triton.http_admin_headers
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


@pytest.mark.parametrize("path", ["/v2/models/resnet50/config", "/v2/models/resnet50/stats"])
def test_read_only_http_apis_need_no_key(triton, path):
    with urllib.request.urlopen(f"http://{triton.http_url}{path}", timeout=5) as response:
        assert response.status == 200 and b"resnet50" in response.read()


def test_perf_analyzer_runs_without_the_key(triton):
    """The command every Triton tutorial runs first, as a user types it: no header, no library path.

    Its model config and server-side statistics calls are open; `.venv/bin/perf_analyzer` is the
    wrapper `make venv` installs (bench/perf_analyzer.sh) that finds libcudart.
    """
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    # A fixed request count, not windows until latency is stable: a busy machine may never give stable windows.
    done = subprocess.run(
        [str(VENV_BIN / "perf_analyzer"), "-m", "mobilenet_v3_small", "-u", triton.grpc_url, "-i", "grpc",
         "--request-count", "20"],
        capture_output=True, text=True, timeout=180, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Throughput:" in done.stdout
    assert "Server:" in done.stdout and "Inference count:" in done.stdout  # the statistics API answered


def test_without_http_the_facade_still_serves(tmp_path):
    repository = link_models(tmp_path / "repository", {"mobilenet_v3_small": MODEL_REPOSITORY / "mobilenet_v3_small"})
    with ServingStack(repository, tmp_path, with_facade=False, triton_http=False) as stack:
        server = stack.triton
        with pytest.raises(OSError):  # nothing listens on the HTTP port
            socket.create_connection(("127.0.0.1", server.ports.http), timeout=1).close()
        assert [m["state"] for m in server.model_states()] == ["READY"]
        facade = start_facade(server, tmp_path, "--default-model", "mobilenet_v3_small")
        try:
            assert facade.health()[0] == 200  # a real inference went through
        finally:
            facade.stop()
