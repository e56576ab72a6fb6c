"""A demo model's layout (instances x intra-op threads, ONNX Runtime session entries) by the path the load takes.

Each arm serves the model's config.pbtxt with the arm's layout, alone, Triton direct or through the facade, and is
measured by the goodput engine with loadgen (every answer checked); rounds rotate the arms' order.

Run from the checkout:
    PYTHONPATH=. .venv/bin/python bench/reports/2026-11-29-facade-layout/layout_ab.py MODEL ROUNDS PATH ARM[,ARM...]
PATH is `facade` or `direct`; an ARM is a key of ARMS.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench import REPOSITORY
from bench.output import say
from bench.peers import goodput, servers
from tritonnx.server.repository import link_models

ENTRY = 'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
ARMS: dict[str, tuple[servers.Layout, str]] = {
    "1x2": (servers.Layout(1, 2), ""),
    "1x1": (servers.Layout(1, 1), ""),
    "2x1": (servers.Layout(2, 1), ""),
    "1x2-dynamic-block-4": (servers.Layout(1, 2), ENTRY.format(key="session.dynamic_block_base", value="4")),
    "1x2-nospin": (servers.Layout(1, 2), ENTRY.format(key="session.intra_op.allow_spinning", value="0")),
}


def main(model: str, rounds: int, facade: bool, arms: list[str]) -> None:
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    args = argparse.Namespace(step_seconds=3.0, capacity_seconds=3.0, generator="loadgen")
    single_p50, _ = goodput.single_request_ms(model, onnx_file, 3.0)
    objective = goodput.objective_ms(single_p50)
    base = (REPOSITORY / model / "config.pbtxt").read_text()
    common_rps = goodput.COMMON_RPS.get(model, 0.0)
    figures: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="layout-") as folder:
        for index in range(rounds):
            for arm in arms[index % len(arms) :] + arms[: index % len(arms)]:
                layout, entries = ARMS[arm]
                work = Path(folder) / f"{arm}-{index}"
                config = layout.apply(base) + entries
                repository = link_models(work / "repository", {model: REPOSITORY / model}, {model: config})
                server = servers.Tritonnx(repository, model, work, facade=facade)
                say(f"round {index + 1}: {arm}, {'facade' if facade else 'Triton direct'} ...")
                record = goodput.measure_open(
                    server, model, onnx_file, objective, args, (), lone_seconds=3.0, common_rps=common_rps
                )
                common = record.get("common", {})
                cpu_ms = 1000 * common.get("server_cpu_s", 0.0) / max(1, common.get("answered", 1))
                figures[arm].append(
                    goodput.figures(record) | {"common_p99_ms": common.get("p99_ms"), "common_cpu_ms": cpu_ms}
                )
    path = "facade" if facade else "Triton direct"
    print(f"\n{model}, {path}: in-process p50 {single_p50:.2f} ms, objective p99 <= {objective:.1f} ms\n")
    for arm, rows in figures.items():
        rates = [r.get("goodput_rps", 0.0) for r in rows]
        capacity = statistics.median(r.get("capacity_rps", 0.0) for r in rows)
        per_round = "; ".join(
            f"lone {r.get('lone_p50_ms', 0):.2f} ms, at {common_rps:g} req/s p99 {r['common_p99_ms'] or 0:.1f} ms "
            f"CPU {r['common_cpu_ms']:.2f} ms"
            for r in rows
        )
        goodputs = " / ".join(f"{rate:.1f}" for rate in rates)
        print(f"{arm}: goodput {goodputs} req/s; capacity {capacity:.1f} req/s (median); {per_round}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "facade", sys.argv[4].split(","))
