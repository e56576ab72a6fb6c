"""The in-process study end to end at its smallest: Triton started inside a worker through its C API and a
tritonserver process behind the facade's gateway, each answering every call as ONNX Runtime does; the report written.

No figure is asserted beyond its presence: one round of one second says nothing about either path's cost.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench.studies.inprocess import METRICS, PATHS


def test_the_inprocess_study_serves_both_paths_and_writes_its_report(tmp_path):
    out = tmp_path / "inprocess"
    command = ["-m", "bench.studies.inprocess", "--rounds", "1", "--seconds", "1", "--out", str(out)]
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "## In-process against grpc" in (out / "report.md").read_text()
    results = json.loads((out / "results.json").read_text())
    (round_,) = results["rounds"]
    for path in PATHS:
        row = round_[path]
        assert row["calls"] > 0 and row["errors"] == 0 and row["wrong"] == 0, (path, row)
        assert row["caller_ms"] > 0 and row["stub_ms"] > 0, (path, row)  # the model ran in the stubs of each
    assert set(results["summary"]) == set(METRICS)
    assert [gate["passed"] for gate in results["gates"]] == [True]
    # The in-process Triton logged to its own file, loaded the model and unloaded it at the end.
    log = (out / "tritonserver-in-process.log").read_text()
    assert "successfully loaded 'mobilenet_v3_small'" in log and "successfully unloaded 'mobilenet_v3_small'" in log
