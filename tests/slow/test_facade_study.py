"""The facade study end to end at its smallest: both trees serve in front of the fake Triton and the report is written.

No figure is asserted (one round of one second says nothing about a change); this keeps the study runnable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_facade_study_measures_both_trees_and_writes_its_report(tmp_path):
    out = tmp_path / "facade"
    command = ["-m", "bench.studies.facade", "--rounds", "1", "--seconds", "1", "--against", "HEAD", "--out", str(out)]
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "## Current against baseline" in (out / "report.md").read_text()
    results = json.loads((out / "results.json").read_text())
    (round_,) = results["rounds"]
    for tree in ("current", "baseline"):
        assert round_[tree]["calls"] > 0 and round_[tree]["errors"] == 0, (tree, round_[tree])
        assert round_[tree]["cpu_ms_per_call"] > 0, (tree, round_[tree])
    assert set(results["summary"]) == {"c1_p50_ms", "c16_rps", "c16_p99_ms", "cpu_ms_per_call"}
    assert [gate["passed"] for gate in results["gates"]] == [True]
    # The temporary worktree of the baseline is gone.
    checkout = Path(__file__).resolve().parents[2]
    worktrees = subprocess.run(["git", "-C", checkout, "worktree", "list"], capture_output=True, text=True, check=True)
    assert "tritonnx-facade-study-" not in worktrees.stdout
