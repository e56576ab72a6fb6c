"""The goodput rounds judged and written up: the project's goals as gates, the report's tables and its plots.

bench/peers/goodput.py measures; this module reads its records (python -m bench.peers --open-loop).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from bench.load.generators import GENERATORS
from bench.output import Gate, gates_section, head, median_and_interval
from bench.peers.goodput import (
    CAPACITY_CONCURRENCY,
    DEADLINE_S,
    LAG_SHARE,
    LOW_STEPS,
    MAX_ERROR_SHARE,
    OVERLOADS,
    REFINEMENTS,
    STEPS,
    lagged,
)

DIRECT, FACADE = "tritonnx, Triton direct", "tritonnx facade"
GOALS = (  # (server, model, median goodput ratio to the best FastAPI layout, and its interval's low end, at least)
    (DIRECT, "mobilenet_v3_small", 1.1, 0.9),
    (DIRECT, "text_classifier", 1.0, 0.9),
    (DIRECT, "resnet50", 1.1, 0.9),
    (FACADE, "mobilenet_v3_small", 0.6, None),
    (FACADE, "text_classifier", 0.6, None),
)
# Triton direct's lone request (c=1 p50, median over the rounds): at most the in-process p50 plus this many ms.
LONE_ALLOWANCE_MS = {"mobilenet_v3_small": 1.0, "text_classifier": 1.0, "resnet50": 2.0}
# Triton direct's capacity at c=16 (median over the rounds): at least this share of the best in-process batch's.
IN_PROCESS_SHARE = {"resnet50": 0.9}
# The facade's capacity at c=16 over Triton direct's (median of the rounds' ratios): at least this.
FACADE_SHARE = {"mobilenet_v3_small": 0.85, "resnet50": 0.95}


def best_fastapi(round_figures: dict, key: str = "goodput_rps") -> tuple[str, float] | None:
    """The FastAPI layout with the highest `key` in one round, if any was measured."""
    measured = [(name, f[key]) for name, f in round_figures.items() if name.startswith("FastAPI") and key in f]
    return max(measured, key=lambda item: item[1]) if measured else None


def ratios(data: dict, server: str, key: str = "goodput_rps") -> list[float]:
    """`server`'s `key` over the best FastAPI layout's, per round where both have one (the best above 0)."""
    found = []
    for round_figures in data["rounds"]:
        best, mine = best_fastapi(round_figures, key), round_figures.get(server, {}).get(key)
        if best is not None and best[1] > 0 and mine is not None:
            found.append(mine / best[1])
    return found


def _ratio_gate(data: dict, server: str, model: str, goal: float, low_goal: float | None) -> Gate:
    name = f"{model}: {server} goodput >= {goal}x the best FastAPI layout" + (
        f", interval's low end >= {low_goal}x" if low_goal else ""
    )
    counted = ratios(data, server)
    if len(counted) < len(data["rounds"]) or not counted:
        why = f"{len(data['rounds']) - len(counted)} of {len(data['rounds'])} rounds without both goodputs"
        return Gate(name, False, f"not judged: {why}")
    median, low, high, coverage = median_and_interval(counted)
    detail = f"median {median:.2f}x, {coverage:.0%} interval {low:.2f}-{high:.2f}x over {len(counted)} rounds"
    return Gate(name, median >= goal and (low_goal is None or low >= low_goal), detail)


def _per_round(data: dict, server: str, key: str) -> list[float]:
    """`server`'s `key` in each round that has it."""
    return [f[server][key] for f in data["rounds"] if not math.isnan(f.get(server, {}).get(key, math.nan))]


def gates(results: dict) -> list[Gate]:
    """The project's goals, judged on this run's figures; a goal whose figures the run lacks fails, saying why."""
    judged: list[Gate] = []
    for server, model, goal, low_goal in GOALS:
        data = results["models"].get(model)
        if data is None or server not in data["servers"] or "fastapi" not in results["settings"]["servers"]:
            continue  # not part of this run
        judged.append(_ratio_gate(data, server, model, goal, low_goal))
    for model, data in results["models"].items():
        if DIRECT not in data["servers"]:
            continue
        lone, allowance = _per_round(data, DIRECT, "lone_p50_ms"), LONE_ALLOWANCE_MS.get(model)
        if allowance is not None:
            name = f"{model}: {DIRECT} lone request p50 <= in-process + {allowance:g} ms"
            if lone:
                detail = f"median {statistics.median(lone):.2f} ms, in-process {data['single_p50_ms']:.2f} ms"
                judged.append(Gate(name, statistics.median(lone) <= data["single_p50_ms"] + allowance, detail))
            else:
                judged.append(Gate(name, False, "not judged: no lone request measured"))
        share, capacity = IN_PROCESS_SHARE.get(model), _per_round(data, DIRECT, "capacity_rps")
        if share is not None and "in_process_rps" in data:
            name = f"{model}: {DIRECT} capacity at c={CAPACITY_CONCURRENCY} >= {share:g}x the best in-process batch"
            of = statistics.median(capacity) / data["in_process_rps"] if capacity else 0.0
            judged.append(Gate(name, of >= share, f"{of:.2f}x of {data['in_process_rps']:.1f} req/s"))
        if (share := FACADE_SHARE.get(model)) is not None and FACADE in data["servers"]:
            name = f"{model}: {FACADE} capacity at c={CAPACITY_CONCURRENCY} >= {share:g}x {DIRECT}'s"
            of_direct = [
                f[FACADE]["capacity_rps"] / f[DIRECT]["capacity_rps"]
                for f in data["rounds"]
                if f.get(DIRECT, {}).get("capacity_rps") and "capacity_rps" in f.get(FACADE, {})
            ]
            if of_direct:
                median = statistics.median(of_direct)
                detail = f"median {median:.2f}x over {len(of_direct)} rounds"
                judged.append(Gate(name, median >= share, detail))
            else:
                judged.append(Gate(name, False, "not judged: no round measured both"))
    for model, data in results["models"].items():
        for server, record in data["servers"].items():
            if not server.startswith("tritonnx"):
                continue
            at_2x = record.get("overloads", {}).get("2.0")
            name = f"{model}: {server} at 2x its goodput, answered p99 <= objective (the last round)"
            if at_2x is None:
                judged.append(Gate(name, False, f"not judged: {record.get('error', 'no goodput to double')}"))
            else:
                detail = f"p99 {at_2x['p99_ms']:.1f} ms, objective {data['objective_ms']:.1f} ms"
                judged.append(Gate(name, at_2x["answered"] > 0 and at_2x["p99_ms"] <= data["objective_ms"], detail))
    return judged


def rounds_table(data: dict) -> list[str]:
    """Each round's goodput per server and tritonnx's ratios to the best FastAPI layout; the medians and intervals."""
    names = list(data["servers"])
    mine = [n for n in names if n.startswith("tritonnx")]
    lines = head(" | ".join(["round", *names, *(f"{n} / best FastAPI" for n in mine)]))
    for index, round_figures in enumerate(data["rounds"], 1):
        cells = [f"{round_figures[n]['goodput_rps']:.1f}" if "goodput_rps" in round_figures.get(n, {}) else "n/a"
                 for n in names]  # fmt: skip
        best = best_fastapi(round_figures)
        for n in mine:
            good = round_figures.get(n, {}).get("goodput_rps")
            cells.append(f"{good / best[1]:.2f}x" if best and best[1] > 0 and good is not None else "n/a")
        lines.append(f"| {index} | {' | '.join(cells)} |")
    medians = [_ms(statistics.median(v)) if (v := _per_round(data, n, "goodput_rps")) else "n/a" for n in names]
    lines += [f"| median | {' | '.join(medians)} |" + " |" * len(mine), ""]
    for n in mine:
        if counted := ratios(data, n):
            median, low, high, coverage = median_and_interval(counted)
            lines.append(f"- {n}: median ratio {median:.2f}x, {coverage:.0%} interval {low:.2f}-{high:.2f}x.")
    lone = [f"{n} {statistics.median(v):.2f} ms" for n in names if (v := _per_round(data, n, "lone_p50_ms"))]
    if lone:
        lines.append(f"- A lone request (c=1, p50, median over the rounds): {', '.join(lone)}.")
    if "in_process_rps" in data:
        capacity = [f"{n} {statistics.median(v) / data['in_process_rps']:.2f}x"
                    for n in names if (v := _per_round(data, n, "capacity_rps"))]  # fmt: skip
        lines.append(
            f"- Capacity at c={CAPACITY_CONCURRENCY} (median) over the best in-process batch's "
            f"{data['in_process_rps']:.1f} req/s: {', '.join(capacity)}."
        )
    return lines


def _facade_layout(settings: dict) -> str:
    """What the facade's Triton ran, when `--facade-layout` set it apart from Triton direct's config."""
    layout = settings.get("facade_layout")
    if not layout:
        return ""
    return (
        f" The facade's Triton ran each model with {layout} in place of its config's (`--facade-layout`, the layout "
        "`make tune --path facade` chose), Triton direct with the config's."
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.1f}"


def _at(step: dict | None) -> str:
    """p50 / p99 ms, refused and timed-out share of one overload step, or n/a."""
    if step is None:
        return "n/a | n/a"
    shares = f"{step['refused_share']:.1%} / {step['timed_out_share']:.1%}"
    return f"{_ms(step['p50_ms'])} / {_ms(step['p99_ms'])} | {shares}"


def _steps(record: dict) -> list[dict]:
    """Every rate offered to a server: the steps and the overloads."""
    return record.get("steps", []) + list(record.get("overloads", {}).values())


def _cpu(step: dict | None) -> str:
    """The server's and the generator's CPU ms per answered request in one step, or n/a."""
    if not step or not step.get("answered") or "server_cpu_s" not in step:
        return "n/a"
    return (
        f"{1000 * step['server_cpu_s'] / step['answered']:.2f} / {1000 * step['client_cpu_s'] / step['answered']:.2f}"
    )


def _cpu_at(record: dict) -> str:
    """`_cpu` in the step that set the goodput."""
    return _cpu(next((s for s in record["steps"] if s["offered_rps"] == record["goodput_rps"]), None))


def model_table(data: dict) -> list[str]:
    """The last round, one row per server: goodput, its ratio to the best FastAPI layout, what 1.5x and 2x did."""
    best = best_fastapi(data["rounds"][-1])
    header = " | ".join(f"at {factor}x goodput: p50 / p99 ms | refused / timed out" for factor in OVERLOADS)
    common = next((r["common"]["offered_rps"] for r in data["servers"].values() if "common" in r), None)
    lines = [
        f"| server | goodput req/s | vs best FastAPI | capacity req/s (c={CAPACITY_CONCURRENCY}) | {header} | "
        "generator lag p99 / max ms | CPU ms per request at goodput: server / generator | "
        f"at {_ms(common)} req/s: p99 ms, CPU ms per request: server / generator |",
        "|---|---|---|---|" + "---|---|" * len(OVERLOADS) + "---|---|---|",
    ]
    for name, record in data["servers"].items():
        if "goodput_rps" not in record:
            lines.append(f"| {name} | not measured: {record.get('error', '?')} |")
            continue
        ratio = f"{record['goodput_rps'] / best[1]:.2f}x" if best and best[1] > 0 else "n/a"
        overloads = " | ".join(_at(record["overloads"].get(str(factor))) for factor in OVERLOADS)
        steps = _steps(record)
        lag = f"{max(s['lag_p99_ms'] for s in steps):.1f} / {max(s['lag_max_ms'] for s in steps):.1f}" if steps else ""
        good, capacity = f"{record['goodput_rps']:.1f}", f"{record['capacity_rps']:.1f}"
        at_common = record.get("common")
        common_cells = f"{_ms(at_common['p99_ms'])}, {_cpu(at_common)}" if at_common else "n/a"
        lines.append(
            f"| {name} | {good} | {ratio} | {capacity} | {overloads} | {lag or 'n/a'} | {_cpu_at(record)} | "
            f"{common_cells} |"
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
        f"{objective['factor']:g}x the model's in-process single-request p50, at least {objective['floor_ms']:g} ms "
        f"({objective['why']}). Per server: capacity from a closed loop at c={CAPACITY_CONCURRENCY} for "
        f"{settings['capacity_seconds']:g} s, then Poisson arrivals at {', '.join(f'{s:g}' for s in STEPS)}x it for "
        f"{settings['step_seconds']:g} s each (then {' and '.join(f'{s:g}' for s in LOW_STEPS)}x while no step kept "
        f"the objective, then {REFINEMENTS} bisections), every call timed from its scheduled send, with a "
        f"{DEADLINE_S:g} s deadline, every answer checked against in-process ONNX Runtime. **Goodput** is the highest "
        f"rate whose answered p99 is within the objective with at most {MAX_ERROR_SHARE:.1%} errors (refused, timed "
        f"out, wrong, failed or not sent); {' and '.join(f'{f:g}x' for f in OVERLOADS)} it were then measured. "
        "Refused: RESOURCE_EXHAUSTED / UNAVAILABLE / HTTP 429 / 503. The generator's lag: how late it sent against its "
        f"schedule (the worst step's); a step where its p99 passed {LAG_SHARE:.0%} of the objective measured the "
        "generator, not the server, and is not counted. Every figure here, the lone request's and the capacity's "
        f"too, was measured by one generator, {GENERATORS[settings['generator']].description}; its CPU per request is "
        f"beside the server's. Last, every server was offered the same rate (COMMON_RPS), so that CPU per request "
        f"compares at equal load. {settings['rounds']} round(s); each measures every server in turn, the order "
        "rotating, each started afresh, first with a lone request (c=1, closed loop, as long as the capacity). "
        "The ratios' intervals are distribution-free (the rounds' order statistics). The method: docs/benchmarks.md."
        + _facade_layout(settings),
        "",
        "![goodput, the median over the rounds](goodput.png)",
        "",
    ]
    for model, data in results["models"].items():
        lines += [
            f"## {model}",
            "",
            f"In-process single request: p50 {data['single_p50_ms']:.2f} ms, p99 {data['single_p99_ms']:.2f} ms; "
            f"objective: p99 <= **{data['objective_ms']:.1f} ms**.",
            "",
            *rounds_table(data),
            "",
            f"The last round, {len(data['rounds'])}:",
            "",
            *model_table(data),
            "",
        ]
        behind, failed = [], []
        for name, record in data["servers"].items():
            steps = _steps(record)
            late = [step for step in steps if lagged(step, data["objective_ms"])]
            if late:
                worst, first = max(late, key=lambda step: step["lag_p99_ms"]), min(s["offered_rps"] for s in late)
                behind.append(
                    f"{name}: {len(late)} of {len(steps)} steps, from {first:.0f} req/s, the worst "
                    f"{worst['lag_p99_ms']:.1f} ms at {worst['offered_rps']:.0f} req/s"
                )
            # A server that fails calls at any rate has no goodput above the rates where no failure happened to come.
            counts: Counter[str] = Counter()
            for step in steps:
                counts.update(step.get("other_errors", {}))
            if counts:
                hit = sum(1 for step in steps if step.get("other_errors"))
                statuses = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
                failed.append(f"{name}: {statuses} in {hit} of {len(steps)} steps")
        if behind:
            lines += [
                f"The generator fell behind its schedule by more than {LAG_SHARE:.0%} of the objective (lag p99) "
                f"in these steps, which were not counted: {'; '.join(behind)}.",
                "",
            ]
        if failed:
            lines += [
                f"Calls failed with other statuses (each an error of its step, whatever the rate): {'; '.join(failed)}.",
                "",
            ]
        lines += [f"![{model}]({model}_open.png)", ""]
        plot_model(out, model, data)
    plot_goodput(out, results)
    return "\n".join([*lines, gates_section(judged)])


def plot_goodput(out: Path, results: dict) -> None:
    """Goodput per server (the median over the rounds), one group of bars per model."""
    models = list(results["models"])
    names = list(dict.fromkeys(name for data in results["models"].values() for name in data["servers"]))
    figure, axis = plt.subplots(figsize=(10, 5))
    width = 0.8 / max(len(names), 1)
    for index, name in enumerate(names):
        values = [statistics.median(_per_round(results["models"][m], name, "goodput_rps") or [0.0]) for m in models]
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
