"""Where a measurement run writes, what it says meanwhile, and its gates: one way for every command."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from bench import RESULTS

CORES = len(os.sched_getaffinity(0))
LEVEL = 0.9  # the coverage a median's interval needs for a verdict on it


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_folder(out: Path | None, kind: str) -> tuple[str, Path]:
    """The run's UTC start stamp, and its folder (created): `out`, or bench/results/<stamp>[-<kind>]."""
    started = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    folder = out or RESULTS / (f"{started}-{kind}" if kind else started)
    folder.mkdir(parents=True, exist_ok=True)
    return started, folder


def machine() -> str:
    return f"{platform.machine()}, {CORES} cores, {platform.platform()}, Python {platform.python_version()}"


def settings(args: argparse.Namespace) -> dict:
    """The command's arguments as results.json keeps them (paths as text)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def flags(options: dict[str, object]) -> list[str]:
    """A command line's options from `{"--port": 8080, ...}`: `["--port", "8080", ...]`."""
    return [str(item) for option in options.items() for item in option]


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))


@dataclass(frozen=True)
class Gate:
    """What must hold for a run's claim to stand, judged on the run's own figures (`detail` names them)."""

    name: str
    passed: bool
    detail: str = ""


def head(columns: str) -> list[str]:
    """A markdown table's header and rule: `head("a | b")`."""
    return [f"| {columns} |", "|" + "---|" * (columns.count("|") + 1)]


def gates_section(gates: list[Gate]) -> str:
    """The report's `## Gates` section: every gate, passed or FAILED, with the figures it was judged on."""
    rows = [f"| {g.name} | {'passed' if g.passed else '**FAILED**'} | {g.detail} |" for g in gates]
    return "\n".join(["## Gates", "", *head("gate | verdict | judged on"), *rows]) + "\n"


def verdict(gates: list[Gate]) -> int:
    """The command's exit code: 1 when a gate failed, each failed one said loudly first; else 0."""
    for gate in gates:
        if not gate.passed:
            say(f"GATE FAILED: {gate.name} ({gate.detail})")
    return 0 if all(g.passed for g in gates) else 1


def finish(out: Path, text: str, judged: list[Gate], results: dict | None = None) -> int:
    """Write and print the report (`text`), and `results` with the gates; the gates' exit code."""
    if results is not None:
        results["gates"] = [asdict(gate) for gate in judged]
        write_json(out / "results.json", results)
    (out / "report.md").write_text(text)
    print(text)
    print(f"report: {out / 'report.md'}")
    return verdict(judged)


def median_interval(n: int) -> tuple[int, float]:
    """The median's interval [r_(k), r_(n-k+1)] of n values as (k, its coverage from binomial(n, 0.5)).

    Distribution-free (the values' order statistics, taken as independent draws): the narrowest covering at least
    LEVEL; with too few values for that, the widest: [min, max].
    """

    def coverage(k: int) -> float:
        return sum(math.comb(n, i) for i in range(k, n - k + 1)) / 2**n

    k = max((k for k in range(1, (n + 1) // 2 + 1) if coverage(k) >= LEVEL), default=1)
    return k, coverage(k)


def median_and_interval(values: Sequence[float]) -> tuple[float, float, float, float]:
    """The median of `values`, the ends of its `median_interval` and that interval's coverage."""
    ordered = sorted(values)
    k, coverage = median_interval(len(ordered))
    return statistics.median(ordered), ordered[k - 1], ordered[-k], coverage
