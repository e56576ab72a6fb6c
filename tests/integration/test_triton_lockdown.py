"""tritonserver's locked-down defaults: administrative APIs need the key (model control is not
reachable by clients), inference does not; HTTP can be turned off and the facade still works."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from backend.server.repository import link_models
from backend.server.stack import ServingStack
from tests.kserve import make_inputs
from tests.serving import MODEL_REPOSITORY, start_facade

RESTRICTED_GRPC_CALLS = {
    "model config": lambda c, h: c.get_model_config("resnet50", headers=h),
    "repository index": lambda c, h: c.get_model_repository_index(headers=h),
    "model control": lambda c, h: c.load_model("no_such_model", headers=h),
    "shared memory": lambda c, h: c.get_system_shared_memory_status(headers=h),
    "statistics": lambda c, h: c.get_inference_statistics("resnet50", headers=h),
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


def test_inference_health_and_metadata_stay_open(triton):
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        assert client.is_server_ready() and client.is_model_ready("mobilenet_v3_small")
        assert client.get_model_metadata("mobilenet_v3_small").name == "mobilenet_v3_small"
        image = np.zeros((1, 3, 224, 224), np.float32)
        result = client.infer("mobilenet_v3_small", make_inputs({"input": image}))
        assert result.as_numpy("output").shape == (1, 1000)


@pytest.mark.parametrize("path", ["/v2/models/resnet50/config", "/v2/repository/index"])
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
