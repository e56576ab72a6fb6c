"""bench.studies.split_cores end to end at the smallest size: the processes land on the cores it says,
both targets answer, and the report is written. Speed is not asserted (see the module)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_split_cores_places_the_server_apart_from_the_facade_and_reports_both(tmp_path):
    out = tmp_path / "split"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.studies.split_cores",
            "--concurrency",
            "2",
            "--duration",
            "1",
            "--rounds",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["placed"]["tritonserver and stubs"] == results["server_cores"]
    assert results["placed"]["facade"] == results["client_cores"]
    assert not set(results["server_cores"]) & set(results["client_cores"])
    for name in ("Triton direct", "facade"):
        (run,) = results["runs"][name]
        assert run["images_per_s"] > 0 and not run["errors"], (name, run)
    assert results["facade_vs_direct"] > 0
    assert "facade / Triton direct:" in (out / "report.md").read_text()
