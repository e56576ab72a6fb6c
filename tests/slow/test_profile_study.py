"""The profile study end to end at its smallest: one model served, each process sampled, the report written.

No figure is asserted beyond its presence: two seconds of samples say where the CPU went, not how much it should be.
"""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_profile_study_samples_the_facade_tritonserver_and_each_stub(tmp_path):
    out = tmp_path / "profile"
    command = ["-m", "bench.studies.profile", "--models", "mobilenet_v3_small", "--seconds", "2", "--out", str(out)]
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((out / "results.json").read_text())["models"]["mobilenet_v3_small"]
    assert record["requests"] > 0
    processes = record["processes"]
    assert {"facade", "tritonserver"} < set(processes) and any(name.startswith("stub ") for name in processes)
    for name, process in processes.items():
        assert process["cpu_ms_per_request"] > 0 and process["busy"] > 0, (name, process)
    # The facade's own code and gRPC's are found in its samples; the stub runs ONNX Runtime.
    assert {"tritonnx", "cygrpc"} <= set(processes["facade"]["owners"])
    assert any("onnxruntime" in owner for stub in processes.values() for owner in stub["owners"])
    assert "## mobilenet_v3_small" in (out / "report.md").read_text()
