"""Where the stock model.py finds a model's graph: the stub's command line, the version folder, default_model_filename."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tritonnx.backend.errors import ModelConfigError
from tritonnx.backend.model_files import (
    ModelFiles,
    backend_config,
    is_python_model,
    onnx_file_name,
    parse_backend_config,
)

STUB = "/opt/tritonserver/backends/python/triton_python_backend_stub"


def version(tmp_path, *files: str):
    folder = tmp_path / "repository" / "m" / "3"
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"graph")
    return folder


def test_the_stub_command_line_names_the_version_folder(tmp_path):
    folder = version(tmp_path, "model.onnx")
    config = {"backend": "onnxruntime", "default_model_filename": "model.onnx"}
    files = ModelFiles.of_stub(config, [STUB, str(folder / "model.onnx"), "triton_onnxruntime_backend_shm_region_1"])
    assert files == ModelFiles(folder, folder / "model.onnx")
    assert files.config_file == tmp_path / "repository" / "m" / "config.pbtxt"


def test_a_default_model_filename_below_the_version_folder_is_followed_up(tmp_path):
    folder = version(tmp_path, "onnx/model.onnx")
    config = {"backend": "tritonnx", "default_model_filename": "onnx/model.onnx"}
    assert ModelFiles.of_stub(config, [STUB, str(folder / "onnx" / "model.onnx")]).version_folder == folder


def test_a_python_model_is_its_version_folders_model_onnx_whatever_model_py_is_called(tmp_path):
    folder = version(tmp_path, "model.onnx")
    config = {"backend": "python", "default_model_filename": "serve.py"}
    assert ModelFiles.of_stub(config, [STUB, str(folder / "serve.py")]).onnx_file == folder / "model.onnx"
    assert is_python_model(config) and onnx_file_name(config) == "model.onnx"


def test_a_stub_without_a_command_line_says_so():
    with pytest.raises(ModelConfigError, match="cannot tell which model folder to serve"):
        ModelFiles.of_stub({"backend": "onnxruntime"}, [])


def test_the_file_name_for_publishing_follows_the_config():
    assert onnx_file_name({"platform": "onnxruntime_onnx"}) == "model.onnx"
    assert onnx_file_name({"backend": "onnxruntime", "default_model_filename": "int8.onnx"}) == "int8.onnx"
    assert not is_python_model({"platform": "onnxruntime_onnx"}) and not is_python_model({})


def test_the_servers_backend_config_is_read_from_its_command_line():
    # A process standing in for tritonserver, with the flags a deployment gives it; the stub names its pid.
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(30)",
            "--backend-config=python,shm-default-byte-size=16777216",
            "--backend-config=default-max-batch-size=8",
            "--backend-config=onnxruntime,default-max-batch-size=16",
            # getopt takes the value as the next argument too; tritonserver's documentation writes it so.
            "--backend-config",
            "onnxruntime,enable-global-threadpool=1",
            "--backend-config",
            "intra_op_thread_count=1",
        ]
    )
    try:
        stub = [STUB, "/repo/m/1/model.onnx", "region", "16777216", "16777216", str(server.pid), "/backends/python"]
        wait_until(lambda: "--backend-config" in Path(f"/proc/{server.pid}/cmdline").read_text(), 10, "the stand-in")
        assert backend_config("onnxruntime", stub) == {
            "default-max-batch-size": "16",
            "enable-global-threadpool": "1",
            "intra_op_thread_count": "1",
        }
        # A backend named in none of them gets the global ones.
        assert backend_config("tritonnx", stub) == {"default-max-batch-size": "8", "intra_op_thread_count": "1"}
        assert backend_config("onnxruntime", ["/usr/bin/python3", "-m", "pytest"]) == {}  # not in a stub
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize(
    ("option", "parsed"),
    [
        ("onnxruntime,default-max-batch-size=16", ("onnxruntime", "default-max-batch-size", "16")),
        ("default-max-batch-size=8", ("", "default-max-batch-size", "8")),  # no comma: a global setting
        # The name ends at the first comma and the key at the first "=" after it: the value keeps the rest.
        ("python,shm-region-prefix-name=a,b=c", ("python", "shm-region-prefix-name", "a,b=c")),
        # What tritonserver refuses to start with: no "=" after the comma, nothing before it, no key, no value.
        ("enable=1,on", None),
        (",key=value", None),
        ("onnxruntime,=1", None),
        ("onnxruntime,key=", None),
    ],
)
def test_a_backend_config_value_is_split_as_tritonserver_splits_it(option, parsed):
    assert parse_backend_config(option) == parsed
