"""The committed protobuf modules are what protoc makes of client/proto/inference.proto now."""

import subprocess
import sys
from pathlib import Path

PROTO = Path(__file__).resolve().parents[2] / "client" / "proto"
GENERATED = ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py")


def test_the_generated_modules_match_the_proto(tmp_path):
    # As `make proto` compiles it: by its installed path, which names the generated modules' imports.
    outputs = [f"--{kind}_out={tmp_path}" for kind in ("python", "pyi", "grpc_python")]
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-Itritonnx/client/proto={PROTO}", *outputs]
    subprocess.run([*command, str(PROTO / "inference.proto")], check=True)
    fresh = tmp_path / "tritonnx" / "client" / "proto"
    stale = [name for name in GENERATED if (fresh / name).read_bytes() != (PROTO / name).read_bytes()]
    assert stale == [], f"client/proto/{stale} differ from inference.proto: run `make proto` and commit them"
