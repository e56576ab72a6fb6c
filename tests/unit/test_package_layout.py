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
