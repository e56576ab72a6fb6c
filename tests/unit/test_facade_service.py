import subprocess
import sys

import grpc
import pytest

from client.facade import errors
from client.facade.admission import Admission
from client.facade.metrics import FacadeMetrics


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
