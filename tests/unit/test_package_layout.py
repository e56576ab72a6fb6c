"""The Python stub imports the model adapter and what it calls, and nothing of server operations."""

import json
import subprocess
import sys

from tests.unit.conftest import _real_utils_path

SERVER_SIDE = ("client", "bench", "psutil", "tritonclient", "grpc")


def test_the_stub_side_loads_no_server_operations_nor_their_dependencies():
    # A fresh interpreter, as the stub starts: Triton's real triton_python_backend_utils (pure
    # Python) on the path, then what a model.py and its instances import.
    code = (
        f"import json, sys; sys.path.insert(0, {str(_real_utils_path().parent)!r})\n"
        "import backend.triton_model, backend.runner\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert {"backend.triton_model", "backend.runner", "onnxruntime"} <= set(loaded)
    unwanted = [m for m in loaded if m.startswith("backend.server") or m.split(".")[0] in SERVER_SIDE]
    assert unwanted == []


def test_the_serving_processes_start_without_the_offline_tools_dependencies():
    """The slim images ship no onnx (publishing a version needs it; `tritonnx-models` runs beside them)."""
    code = (
        "import sys; sys.modules['onnx'] = None\n"  # an import of onnx now fails, as in the images
        "import client.serve, client.facade.__main__, backend.server.supervisor, backend.server.stack\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
