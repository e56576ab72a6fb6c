import os
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


PURE_PYTHON_PROTOBUF = """
from google.protobuf.internal import api_implementation
from client.facade import service
from client.facade.errors import InvalidArgument

assert api_implementation.Type() == "python", api_implementation.Type()
for parse, body in ((service._predict_request, b"\\x1a\\x02\\xff\\xfe"), (service._classify_request, b"\\x12\\x02\\xff\\xfe")):
    refused = parse(body)  # model_name, not UTF-8
    assert isinstance(refused, InvalidArgument), refused
    print(refused.message)
"""


def test_a_string_that_is_not_utf8_is_invalid_argument_with_protobufs_pure_python_implementation_too():
    """Found by fuzzing: onnxruntime_extensions sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python on import, under
    which such a string raises UnicodeDecodeError, not DecodeError, and the facade answered INTERNAL."""
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    done = subprocess.run([sys.executable, "-c", PURE_PYTHON_PROTOBUF], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("malformed PredictRequest: ")
    assert done.stdout.splitlines()[1].startswith("malformed ClassifyRequest: ")
