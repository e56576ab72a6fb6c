"""The open-loop goodput report (python -m bench.peers --open-loop): a table per model, plots, gates."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from bench.output import Gate, gates_section  # noqa: E402
from bench.peers.goodput import (  # noqa: E402
    CAPACITY_CONCURRENCY,
    DEADLINE_S,
    LAG_SHARE,
    LOW_STEPS,
    MAX_ERROR_SHARE,
    OVERLOADS,
    REFINEMENTS,
    STEPS,
    best_fastapi,
)


def _ms(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.1f}"


def _at(step: dict | None) -> str:
    """p50 / p99 ms, refused and timed-out share of one overload step, or n/a."""
    if step is None:
        return "n/a | n/a"
    return (
        f"{_ms(step['p50_ms'])} / {_ms(step['p99_ms'])} | {step['refused_share']:.1%} / {step['timed_out_share']:.1%}"
    )


def _steps(record: dict) -> list[dict]:
    """Every rate offered to a server: the steps and the overloads."""
    return record.get("steps", []) + list(record.get("overloads", {}).values())


def _lag(record: dict) -> str:
    steps = _steps(record)
    if not steps:
        return "n/a"
    return f"{max(s['lag_p99_ms'] for s in steps):.1f} / {max(s['lag_max_ms'] for s in steps):.1f}"


def failed_calls(data: dict) -> list[str]:
    """Calls failed with statuses other than refusals and timeouts, per server: how many, of what, in how many steps.

    A server that fails calls at any rate has no goodput above the rates where no failure happened to come.
    """
    found = []
    for name, record in data["servers"].items():
        steps = _steps(record)
        counts: dict[str, int] = {}
        for step in steps:
            for status, count in step.get("other_errors", {}).items():
                counts[status] = counts.get(status, 0) + count
        if counts:
            hit = sum(1 for step in steps if step.get("other_errors"))
            statuses = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
            found.append(f"{name}: {statuses} in {hit} of {len(steps)} steps")
    return found


def model_table(data: dict) -> list[str]:
    """One row per server: goodput, its ratio to the best FastAPI layout, and what 1.5x and 2x goodput did."""
    best = best_fastapi(data)
    header = " | ".join(f"at {factor}x goodput: p50 / p99 ms | refused / timed out" for factor in OVERLOADS)
    lines = [
        f"| server | goodput req/s | vs best FastAPI | capacity req/s (c={CAPACITY_CONCURRENCY}) | {header} | "
        "generator lag p99 / max ms |",
        "|---|---|---|---|" + "---|---|" * len(OVERLOADS) + "---|",
    ]
    for name, record in data["servers"].items():
        if "goodput_rps" not in record:
            lines.append(f"| {name} | not measured: {record.get('error', '?')} |")
            continue
        ratio = f"{record['goodput_rps'] / best[1]:.2f}x" if best and best[1] > 0 else "n/a"
        overloads = " | ".join(_at(record["overloads"].get(str(factor))) for factor in OVERLOADS)
        lines.append(
            f"| {name} | {record['goodput_rps']:.1f} | {ratio} | {record['capacity_rps']:.1f} | {overloads} | "
            f"{_lag(record)} |"
        )
    return lines


def open_report(out: Path, results: dict, judged: list[Gate]) -> str:
    """The report's text; the plots go to `out`."""
    settings = results["settings"]
    objective = results["objective"]
    lines = [
        f"# Goodput at a latency objective, open loop {results['started']}",
        "",
        f"Machine: {results['machine']}. Per model, the objective is the answered calls' p99 <= "
        f"{objective['factor']:g}x the model's in-process single-request p50 (ONNX Runtime, no server), at least "
        f"{objective['floor_ms']:g} ms ({objective['why']}). Per server: answers checked against in-process ONNX "
        f"Runtime, capacity from a closed loop at c={CAPACITY_CONCURRENCY} for {settings['capacity_seconds']:g} s, "
        f"then Poisson arrivals offered at {', '.join(f'{s:g}' for s in STEPS)}x that capacity for "
        f"{settings['step_seconds']:g} s each (then {' and '.join(f'{s:g}' for s in LOW_STEPS)}x in turn while no "
        f"step kept the objective, then {REFINEMENTS} bisections between the goodput and the next rate above it), "
        "every call timed from its scheduled send time (no coordinated "
        f"omission), with a {DEADLINE_S:g} s deadline, every answer checked. **Goodput** is the highest offered rate "
        f"whose answered p99 is within the objective with at most {MAX_ERROR_SHARE:.1%} errors (refused, timed out, "
        "wrong, failed, or not sent because the generator's bound on calls in flight was reached); "
        f"{' and '.join(f'{f:g}x' for f in OVERLOADS)} the goodput were then offered and measured. Refused: "
        "RESOURCE_EXHAUSTED / UNAVAILABLE / HTTP 429 / 503. The generator's lag is how late it sent against its "
        "own schedule (the worst step's).",
        "",
        "![goodput](goodput.png)",
        "",
    ]
    for model, data in results["models"].items():
        lines += [
            f"## {model}",
            "",
            f"In-process single request: p50 {data['single_p50_ms']:.2f} ms, p99 {data['single_p99_ms']:.2f} ms; "
            f"objective: p99 <= **{data['objective_ms']:.1f} ms**.",
            "",
            *model_table(data),
            "",
        ]
        behind = []
        for name, record in data["servers"].items():
            steps = _steps(record)
            late = [step for step in steps if step["lag_p99_ms"] > LAG_SHARE * data["objective_ms"]]
            if late:
                worst = max(late, key=lambda step: step["lag_p99_ms"])
                first = min(step["offered_rps"] for step in late)
                behind.append(
                    f"{name}: {len(late)} of {len(steps)} steps, from {first:.0f} req/s, the worst "
                    f"{worst['lag_p99_ms']:.1f} ms at {worst['offered_rps']:.0f} req/s"
                )
        if behind:
            lines += [
                f"The generator fell behind its schedule by more than {LAG_SHARE:.0%} of the objective (lag p99) in "
                "these steps, whose latencies hold its own lag too: " + "; ".join(behind) + ".",
                "",
            ]
        failed = failed_calls(data)
        if failed:
            lines += [
                "Calls failed with other statuses (each an error of its step, whatever the rate): "
                + "; ".join(failed)
                + ".",
                "",
            ]
        lines += [f"![{model}]({model}_open.png)", ""]
        plot_model(out, model, data)
    plot_goodput(out, results)
    return "\n".join([*lines, gates_section(judged)])


def plot_goodput(out: Path, results: dict) -> None:
    """Goodput per server, one group of bars per model."""
    models = list(results["models"])
    names = list(dict.fromkeys(name for data in results["models"].values() for name in data["servers"]))
    figure, axis = plt.subplots(figsize=(10, 5))
    width = 0.8 / max(len(names), 1)
    for index, name in enumerate(names):
        values = [results["models"][m]["servers"].get(name, {}).get("goodput_rps", 0.0) for m in models]
        axis.bar([i + index * width for i in range(len(models))], values, width, label=name)
    axis.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(models))], models)
    axis.set(ylabel="goodput, req / s", title="goodput at the latency objective")
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(out / "goodput.png", dpi=110)
    plt.close(figure)


def plot_model(out: Path, model: str, data: dict) -> None:
    """Answered p99 (with the objective) and the refused share against the offered rate, every server."""
    figure, (latency, refused) = plt.subplots(1, 2, figsize=(12, 5))
    for name, record in data["servers"].items():
        steps = sorted(_steps(record), key=lambda s: s["offered_rps"])
        if not steps:
            continue
        rates = [s["offered_rps"] for s in steps]
        line = latency.plot(rates, [s["p99_ms"] for s in steps], marker="o", label=name)[0]
        refused.plot(rates, [100 * s["refused_share"] for s in steps], marker="o", color=line.get_color(), label=name)
    latency.axhline(data["objective_ms"], color="black", linestyle="--", label="objective")
    latency.set(xlabel="offered req / s", ylabel="answered p99 ms (from scheduled send)", yscale="log", title=model)
    refused.set(xlabel="offered req / s", ylabel="refused, % of calls", title=f"{model}: refusals")
    latency.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out / f"{model}_open.png", dpi=110)
    plt.close(figure)
