import subprocess
import sys

import grpc
import pytest

from client.facade import errors
from client.facade.admission import Admission
from client.facade.metrics import FacadeMetrics
from client.facade.settings import FacadeSettings, add_arguments, from_arguments


def test_admission_refuses_beyond_the_limit_with_a_retry_hint():
    admission = Admission(limit=2, retry_after_ms=150, metrics=FacadeMetrics())
    with admission.slot(), admission.slot():
        with pytest.raises(errors.Overloaded) as caught:
            with admission.slot():
                pass
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert caught.value.trailing_metadata == (("grpc-retry-pushback-ms", "150"),)
        assert admission.in_flight == 2
    assert admission.in_flight == 0
    with admission.slot():  # freed slots are usable again
        assert admission.in_flight == 1


def test_settings_come_from_flags_then_environment_then_defaults(monkeypatch):
    import argparse

    monkeypatch.setenv("TRITONNX_MAX_IN_FLIGHT", "7")
    monkeypatch.setenv("TRITONNX_DEFAULT_MODEL", "mobilenet_v3_small")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = from_arguments(parser.parse_args(["--default-model", "text_classifier", "--health-interval", "0.5"]))
    assert settings.max_in_flight == 7 and settings.default_model == "text_classifier"
    assert settings.health_interval == 0.5 and settings.port == FacadeSettings.port


def test_generated_protobuf_code_is_current(tmp_path):
    """`make proto` output matches client/proto/inference.proto as it is now."""
    from client.proto import inference_pb2

    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            ".",
            f"--descriptor_set_out={tmp_path / 'set.pb'}",
            "client/proto/inference.proto",
        ],
        check=True,
    )
    from google.protobuf import descriptor_pb2

    fresh = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / "set.pb").read_bytes()).file[0]
    for message in fresh.message_type:  # protoc adds json_name to descriptor sets, not to generated code
        for field in message.field:
            field.ClearField("json_name")
    current = descriptor_pb2.FileDescriptorProto.FromString(inference_pb2.DESCRIPTOR.serialized_pb)
    assert current == fresh, "client/proto/inference_pb2.py is stale: run `make proto`"


def test_boolean_settings_and_a_token_that_help_never_prints(monkeypatch):
    import argparse

    monkeypatch.setenv("TRITONNX_AUTH_TOKEN", "hunter2")
    monkeypatch.setenv("TRITONNX_REFLECTION", "off")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = from_arguments(parser.parse_args([]))
    assert settings.auth_token == "hunter2" and settings.reflection is False
    assert from_arguments(parser.parse_args(["--reflection", "1"])).reflection is True
    assert "hunter2" not in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--reflection", "maybe"])
