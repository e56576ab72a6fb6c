"""ONNX Runtime's spin-waiting on a served demo model: on, off, or stopped when a run ends; Triton direct and facade.

Each arm serves the model's tuned config.pbtxt plus the variant's session entries, alone, and is measured by the
goodput engine with loadgen (every answer checked); rounds rotate the arms' order.

Run from the checkout:
    PYTHONPATH=. .venv/bin/python bench/reports/2026-11-29-spinning/spinning_ab.py MODEL [ROUNDS]
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
SPIN = ENTRY.format(key="session.intra_op.allow_spinning", value="1")
VARIANTS = {
    "spin": SPIN + ENTRY.format(key="session.force_spinning_stop", value="0"),
    "nospin": ENTRY.format(key="session.intra_op.allow_spinning", value="0"),
    "stop": SPIN + ENTRY.format(key="session.force_spinning_stop", value="1"),
}


def main(model: str, rounds: int) -> None:
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    args = argparse.Namespace(step_seconds=3.0, capacity_seconds=3.0, generator="loadgen")
    single_p50, _ = goodput.single_request_ms(model, onnx_file, 3.0)
    objective = goodput.objective_ms(single_p50)
    base = (REPOSITORY / model / "config.pbtxt").read_text()
    arms = [(variant, facade) for variant in VARIANTS for facade in (False, True)]
    figures: dict[tuple[str, bool], list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="spinning-") as folder:
        for index in range(rounds):
            for variant, facade in arms[index % len(arms) :] + arms[: index % len(arms)]:
                work = Path(folder) / f"{variant}-{facade}-{index}"
                repository = link_models(
                    work / "repository", {model: REPOSITORY / model}, {model: base + VARIANTS[variant]}
                )
                server = servers.Tritonnx(repository, model, work, facade=facade)
                say(f"round {index + 1}: {variant}, {'facade' if facade else 'Triton direct'} ...")
                common_rps = goodput.COMMON_RPS.get(model, 0.0)
                record = goodput.measure_open(
                    server, model, onnx_file, objective, args, (), lone_seconds=3.0, common_rps=common_rps
                )
                common = record.get("common", {})
                cpu_ms = 1000 * common.get("server_cpu_s", 0.0) / max(1, common.get("answered", 1))
                figures[(variant, facade)].append(
                    goodput.figures(record) | {"common_p99_ms": common.get("p99_ms"), "common_cpu_ms": cpu_ms}
                )
    print(f"\n{model}: in-process p50 {single_p50:.2f} ms, objective p99 <= {objective:.1f} ms, {rounds} rounds\n")
    for (variant, facade), rows in figures.items():
        capacity = statistics.median(r["capacity_rps"] for r in rows if "capacity_rps" in r)
        per_round = "; ".join(
            f"goodput {r.get('goodput_rps', 0):.1f}, lone {r.get('lone_p50_ms', 0):.2f} ms, "
            f"at {goodput.COMMON_RPS.get(model, 0):g} req/s p99 {r['common_p99_ms'] or 0:.1f} ms "
            f"CPU {r['common_cpu_ms']:.2f} ms"
            for r in rows
        )
        print(f"{'facade' if facade else 'direct'}, {variant}: capacity {capacity:.1f} req/s (median); {per_round}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
