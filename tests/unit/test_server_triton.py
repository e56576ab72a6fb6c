import os
import sys
from pathlib import Path

from tritonnx.server.repository import STOCK_MODEL_PY
from tritonnx.server.triton import Ports, TritonInstall, TritonServer, assemble_backend_dir, format_model_states


def test_a_triton_in_the_ngc_layout_is_used_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONNX_TRITON_HOME", str(tmp_path))
    install = TritonInstall.find()
    assert install.binary == tmp_path / "bin" / "tritonserver"
    assert install.library_dir == tmp_path / "lib" and install.backends == tmp_path / "backends"


def test_the_wheel_is_found_in_the_venv_and_its_backend_is_assembled(monkeypatch):
    monkeypatch.delenv("TRITONNX_TRITON_HOME", raising=False)
    install = TritonInstall.find()
    assert install.backends is None and install.binary.is_file()
    assert [f.name for f in install.python_backend_files] == [
        "libtriton_python.so",
        "triton_python_backend_utils.py",
        "triton_python_backend_stub",
    ]
    assert all(f.exists() for f in install.python_backend_files)


def test_the_backend_directory_holds_the_python_backend_and_the_onnx_backends(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITONNX_TRITON_HOME", raising=False)
    install = TritonInstall.find()
    for _ in range(2):  # assembled again over the first: nothing changes
        backends = assemble_backend_dir(tmp_path / "backends", install)
    library = backends / "python" / "libtriton_python.so"
    # A copy, not a link out of the folder: Triton refuses that for a Python-based backend.
    assert not library.is_symlink() and library.read_bytes() == install.python_backend_files[0].read_bytes()
    assert (backends / "python" / "triton_python_backend_stub").resolve() == install.python_backend_files[2].resolve()
    for name in ("onnxruntime", "tritonnx"):
        assert (backends / name / "model.py").read_bytes() == STOCK_MODEL_PY.read_bytes()
    assert sorted(p.name for p in backends.rglob("*") if p.name.startswith(".")) == []  # no partial copies left


def test_the_command_carries_the_settings_a_deployment_gives(tmp_path):
    server = TritonServer(
        model_repository=tmp_path,
        ports=Ports(1, 2, 3),
        host="0.0.0.0",
        log_verbose=2,
        startup_models=(),
        http=False,
        admin_key="k",
    )
    install = TritonInstall.ngc_layout(Path("/opt/tritonserver"))
    command = server.command(install, install.backends)
    assert command[0] == "/opt/tritonserver/bin/tritonserver"
    assert "--backend-directory=/opt/tritonserver/backends" in command
    assert {
        "--grpc-address=0.0.0.0",
        "--grpc-port=2",
        "--metrics-port=3",
        "--log-verbose=2",
        "--allow-http=false",
        "--exit-on-error=false",
        "--model-control-mode=explicit",
    } <= set(command)
    assert not any(arg.startswith("--load-model") for arg in command)


def test_the_stub_runs_with_this_venv_unless_another_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin")
    install = TritonInstall.ngc_layout(Path("/opt/tritonserver"))
    own = TritonServer(model_repository=tmp_path).environment(install)["PATH"].split(os.pathsep)
    assert own == [str(Path(sys.executable).parent), "/usr/bin"]
    other = TritonServer(model_repository=tmp_path, stub_venv=tmp_path / "venv").environment(install)
    assert other["PATH"].split(os.pathsep) == [str(tmp_path / "venv" / "bin"), "/usr/bin"]
    assert other["LD_LIBRARY_PATH"].split(os.pathsep)[0] == "/opt/tritonserver/lib"


def test_the_model_table_lists_each_model_or_says_what_to_mount_when_there_is_none():
    states = [{"name": "resnet50", "version": "1", "state": "READY"},
              {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": "no model.onnx"}]  # fmt: skip
    table = format_model_states(states).splitlines()
    assert table[1].split() == ["resnet50", "1", "READY"] and table[2].endswith("UNAVAILABLE  (no model.onnx)")
    empty = format_model_states([], Path("/models"))
    assert empty.startswith("no models in /models: mount a model repository there") and "-v" in empty
