"""The facade's production settings: bearer token, TLS, reflection off."""

from __future__ import annotations

import subprocess

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.serving import start_facade
from tritonnx.client.proto import inference_pb2, inference_pb2_grpc

REQUEST = inference_pb2.PredictRequest(
    raw_data=np.zeros((1, 3, 224, 224), np.float32).tobytes(), shape=[1, 3, 224, 224], model_name="mobilenet_v3_small"
)


@pytest.fixture(scope="module")
def locked_down(triton, tmp_path_factory):
    """A facade with a token, TLS and no reflection."""
    workdir = tmp_path_factory.mktemp("secure")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(workdir / "key.pem"),
            "-out",
            str(workdir / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    facade = start_facade(
        triton,
        workdir,
        "--auth-token",
        "s3cret",
        "--tls-cert",
        str(workdir / "cert.pem"),
        "--tls-key",
        str(workdir / "key.pem"),
        "--reflection",
        "0",
    )
    credentials = grpc.ssl_channel_credentials(root_certificates=(workdir / "cert.pem").read_bytes())
    channel = grpc.secure_channel(facade.grpc_url, credentials)
    yield facade, channel
    channel.close()
    facade.stop()


def test_inference_needs_the_bearer_token(locked_down):
    _, channel = locked_down
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    for metadata, words in (
        (None, "needs `authorization: Bearer <token>`"),
        ((("authorization", "Bearer nope"),), "not valid"),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(REQUEST, metadata=metadata)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED and words in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.PredictStream(iter([REQUEST])))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    response = stub.Predict(REQUEST, metadata=(("authorization", "Bearer s3cret"),))
    assert list(response.shape) == [1, 1000]


def test_health_needs_the_token_too_and_reflection_is_off(locked_down):
    _, channel = locked_down
    health = health_pb2_grpc.HealthStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        health.Check(health_pb2.HealthCheckRequest(service=""))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as caught:
        next(health.Watch(health_pb2.HealthCheckRequest(service="")))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    token = (("authorization", "Bearer s3cret"),)
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest(service=""), metadata=token).status == serving
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        next(
            reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=token
            )
        )
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_plaintext_clients_cannot_talk_to_a_tls_facade(locked_down):
    facade, _ = locked_down
    with grpc.insecure_channel(facade.grpc_url) as plain:
        with pytest.raises(grpc.RpcError) as caught:
            inference_pb2_grpc.InferenceServiceStub(plain).Predict(
                REQUEST, metadata=(("authorization", "Bearer s3cret"),), timeout=5
            )
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
