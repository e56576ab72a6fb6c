"""The README's and docs/benchmarks.md's speed sentence, made from a goodput rounds report's summary.json.

A rounds run (python -m bench.peers --open-loop --rounds N) writes summary.json beside results.json: the same without
each server's per-step record, small enough to commit with the report. `speed_sentence` states the medians of a
report's summaries; tests/unit/test_speed_claims.py holds README and docs/benchmarks.md to it, so that a claim about
speed cannot drift from the latest measurement.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.output import write_json
from bench.peers.goodput_report import DIRECT, FACADE, ratios

SUMMARY = "summary.json"
REPORTS = Path(__file__).resolve().parents[1] / "reports"
ORDER = ("mobilenet_v3_small", "text_classifier", "resnet50")  # the sentence names the models in this order
FACADE_LAYOUT = "facade_layout"  # a model's key when its run gave the facade's Triton a layout of its own


def write_summary(out: Path, results: dict) -> Path:
    """results.json without each server's per-step record and the peers' venvs: what a report commits."""
    models = {name: {k: v for k, v in data.items() if k != "servers"} for name, data in results["models"].items()}
    summary = {k: v for k, v in results.items() if k not in ("models", "venvs")} | {"models": models}
    write_json(path := out / SUMMARY, summary)
    return path


def latest_rounds(reports: Path = REPORTS) -> Path:
    """The newest committed goodput rounds report: the dated folder named *-goodput-rounds that sorts last."""
    return sorted(p for p in reports.iterdir() if p.name.endswith("-goodput-rounds"))[-1]


def read_summaries(report: Path) -> dict[str, dict]:
    """Every model's summary in a report folder (its summary.json, or its subfolders'), by model."""
    files = [report / SUMMARY] if (report / SUMMARY).exists() else sorted(report.glob(f"*/{SUMMARY}"))
    models: dict[str, dict] = {}
    for file in files:
        summary = json.loads(file.read_text())
        layout = summary.get("settings", {}).get("facade_layout")  # the run's --facade-layout, if it had one
        models |= {name: data | ({FACADE_LAYOUT: layout} if layout else {}) for name, data in summary["models"].items()}
    return models


def _join(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def speed_sentence(models: Mapping[str, dict]) -> str:
    """The rounds' medians of goodput over the best FastAPI layout's, and of the lone request against in-process."""
    names = [m for m in ORDER if m in models] + sorted(set(models) - set(ORDER))
    direct = {m: _median(ratios(models[m], DIRECT)) for m in names}
    facade = {m: _median(ratios(models[m], FACADE)) for m in names}
    counts = sorted({len(models[m]["rounds"]) for m in names})
    rounds = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"  # a run cut short keeps fewer
    with_direct = [m for m in names if direct[m] is not None]
    with_facade = [m for m in names if facade[m] is not None]
    text = (
        f"Triton direct serves {_join([f'{direct[m]:.2f}x' for m in with_direct])} the goodput of the best "
        f"hand-written FastAPI + uvicorn + ONNX Runtime layout on {_join(with_direct)} (medians of {rounds} rounds)"
    )
    if with_facade:
        text += f", the facade {_join([f'{facade[m]:.2f}x' for m in with_facade])} on {_join(with_facade)}"
        layouts = {models[m][FACADE_LAYOUT] for m in with_facade if FACADE_LAYOUT in models[m]}
        for layout in sorted(layouts):
            laid = [m for m in with_facade if models[m].get(FACADE_LAYOUT) == layout]
            text += f" ({_join(laid)} with {layout} behind the facade)"
    lone = {m: _median([f[DIRECT]["lone_p50_ms"] for f in models[m]["rounds"] if DIRECT in f]) for m in names}
    with_lone = [m for m in names if lone[m] is not None]
    if with_lone:
        served = _join([f"{lone[m]:.1f}" for m in with_lone])
        alone = _join([f"{models[m]['single_p50_ms']:.1f}" for m in with_lone])
        text += f"; a lone request takes {served} ms through Triton direct, against {alone} ms in process"
    return text + "."
