"""python -m bench.studies.goodput_rounds: Triton direct's goodput against FastAPI's, over repeated rounds.

One open-loop run (`python -m bench.peers --open-loop`) gives one draw of each server's goodput, and on the text model
the ratio of Triton direct's to the best FastAPI layout's moved from 0.82x to 1.52x between runs. Here the same
measurement (bench/peers/goodput.py: answers checked, capacity, Poisson steps, bisections; no overload steps) is
repeated in interleaved rounds, the servers' order rotating, at one objective fixed before the first round. Each
round gives a ratio: Triton direct's goodput over the best FastAPI layout's in that round. The median ratio comes with
a distribution-free confidence interval (order statistics of the rounds' ratios, `median_interval`), and the goal is
judged on that interval: met when its lower end reaches the goal, missed when its upper end stays below, undecided
otherwise. Where the cores went at each goodput: the CPU per answered request of the server's processes and of the
load generator, at the step that set it.

Gates (exit 1 when one fails): every server answered like in-process ONNX Runtime and was measured in every round;
the goal, judged on the interval (a missed or undecided goal fails; so does one judged on too few rounds for a
CONFIDENCE interval).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from bench import REPOSITORY
from bench.output import CORES, Gate, finish, gates_section, machine, run_folder, say, settings, write_json
from bench.peers import servers
from bench.peers.__main__ import make_servers
from bench.peers.goodput import GOALS, goodput_without_lag, measure_open, objective_ms, single_request_ms

import matplotlib  # isort: skip

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  # isort: skip

TRITON = "tritonnx, Triton direct"
CONFIDENCE = 0.9  # the least coverage asked of the interval; with 5 rounds the range of the rounds gives 94%


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """The narrowest [x(k), x(n+1-k)] of the sorted values covering their population's median with >= `confidence`.

    Distribution-free: the median lies below x(k) only if fewer than k of n independent draws fell below it, a
    binomial(n, 1/2) tail. Returns (low, high, coverage); with too few values for `confidence`, the whole range and its
    own coverage.
    """
    ordered = sorted(values)
    n = len(ordered)
    best = (ordered[0], ordered[-1], 1 - 2 * 0.5**n)
    for k in range(2, n // 2 + 1):
        coverage = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n
        if coverage < confidence:
            break
        best = (ordered[k - 1], ordered[n - k], coverage)
    return best


def ratio(round_records: dict, goodput_of: Callable[[dict], float]) -> float | None:
    """Triton direct's goodput over the best FastAPI layout's in one round (None when one was not measured)."""
    fastapi = [goodput_of(r) for name, r in round_records.items() if name.startswith("FastAPI") and "steps" in r]
    triton = round_records.get(TRITON, {})
    if not fastapi or "steps" not in triton:
        return None
    best = max(fastapi)
    return goodput_of(triton) / best if best > 0 else math.inf


def cpu_at_goodput(record: dict, seconds: float) -> dict | None:
    """At the step that set the server's goodput: CPU ms per answered request (server, generator), cores they kept busy."""
    step = next((s for s in record.get("steps", []) if s["offered_rps"] == record.get("goodput_rps")), None)
    if step is None or "server_cpu_s" not in step or not step["answered"]:
        return None
    return {
        "server_ms": 1000 * step["server_cpu_s"] / step["answered"],
        "generator_ms": 1000 * step["client_cpu_s"] / step["answered"],
        "cores": (step["server_cpu_s"] + step["client_cpu_s"]) / seconds,
    }


def summarise(results: dict) -> dict:
    """Per server its goodput per round; per round the ratio (with and without the generator's lag); the interval."""
    objective = results["objective_ms"]
    rounds = results["rounds"]
    names = list(rounds[0]) if rounds else []
    goodputs = {name: [r[name].get("goodput_rps") for r in rounds] for name in names}
    ratios = [ratio(r, lambda record: record["goodput_rps"]) for r in rounds]
    lag_free = [ratio(r, lambda record: goodput_without_lag(record, objective)) for r in rounds]
    measured = [x for x in ratios if x is not None]
    seconds = results["settings"]["step_seconds"]
    cpu = {name: [c for r in rounds if (c := cpu_at_goodput(r[name], seconds))] for name in names}
    summary: dict = {"goodputs": goodputs, "ratios": ratios, "ratios_without_lag": lag_free, "cpu": cpu}
    if measured:
        low, high, coverage = median_interval(measured)
        summary.update(median=statistics.median(measured), low=low, high=high, coverage=coverage)
    return summary


def plot(results: dict, summary: dict, path: Path) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    rounds = range(1, len(results["rounds"]) + 1)
    for name, values in summary["goodputs"].items():
        left.plot(rounds, [v if v is not None else math.nan for v in values], "o-", label=name)
    left.set(title=f"{results['model']}: goodput per round", xlabel="round", ylabel="goodput req/s", ylim=(0, None))
    left.legend(fontsize="small")
    shown = [r if r is not None and math.isfinite(r) else math.nan for r in summary["ratios"]]
    right.plot(rounds, shown, "o", label="Triton direct / best FastAPI")
    if "median" in summary:
        right.axhspan(summary["low"], summary["high"], alpha=0.2,
                      label=f"{summary['coverage']:.0%} interval of the median")  # fmt: skip
        right.axhline(summary["median"], label=f"median {summary['median']:.2f}x")
    right.axhline(results["goal"], color="grey", linestyle="--", label=f"goal {results['goal']:g}x")
    right.set(title="the ratio per round", xlabel="round", ylabel="ratio", ylim=(0, None))
    right.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def judge(results: dict, summary: dict) -> list[Gate]:
    failed = [f"round {i + 1}, {name}: {record.get('error') or str(record['wrong']) + ' wrong'}"
              for i, records in enumerate(results["rounds"]) for name, record in records.items()
              if "error" in record or record.get("wrong")]  # fmt: skip
    judged = [Gate("every server answered right and was measured in every round", not failed,
                   "; ".join(failed) or f"{len(results['rounds'])} rounds")]  # fmt: skip
    goal = results["goal"]
    name = f"{results['model']}: Triton direct goodput >= {goal:g}x the best FastAPI layout's"
    if "median" not in summary:
        return [*judged, Gate(name, False, "not judged: no round measured both")]
    detail = (f"median {summary['median']:.2f}x, {summary['coverage']:.0%} interval "
              f"{summary['low']:.2f}-{summary['high']:.2f}x over {len(results['rounds'])} rounds")  # fmt: skip
    if summary["coverage"] < CONFIDENCE:
        return [*judged, Gate(name, False, f"undecided: too few rounds for a {CONFIDENCE:.0%} interval; {detail}")]
    if summary["low"] >= goal:
        return [*judged, Gate(name, True, f"met: {detail}")]
    word = "missed" if summary["high"] < goal else "undecided: the interval spans the goal"
    return [*judged, Gate(name, False, f"{word}: {detail}")]


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def report(results: dict, summary: dict, judged: list[Gate]) -> str:
    names = list(summary["goodputs"])
    lines = [
        f"# {results['model']}: Triton direct's goodput against FastAPI's over {len(results['rounds'])} rounds "
        f"{results['started']}",
        "",
        f"Machine: {results['machine']}. Objective: answered p99 <= {results['objective_ms']:.1f} ms (5x the in-process "
        f"single-request p50 of {results['single_p50_ms']:.2f} ms, at least 25 ms), fixed before the first round. "
        "Each round measures every server in turn (the order rotating) as the open-loop goodput study does: answers "
        "checked against in-process ONNX Runtime, capacity from a closed loop at c=16, Poisson steps at 0.25-2x that "
        f"capacity for {results['settings']['step_seconds']:g} s each, two bisections; goodput = the highest rate "
        "whose answered p99 kept the objective with at most 0.1% errors. Ratio = Triton direct's goodput over the best "
        "FastAPI layout's in the same round; without lag: both judged on p99 less the generator's own lag p99. The "
        "interval of the median ratio is distribution-free (order statistics; rounds taken as independent draws).",
        *[
            f"Rounds {sum(p['rounds'] for p in results['pooled'][:i]) + 1}-{sum(p['rounds'] for p in results['pooled'][: i + 1])} "
            f"come from the earlier run of {p['started']} (`--pool`)."
            for i, p in enumerate(results.get("pooled", []))
        ],
        "",
        "![goodput and ratio per round](rounds.png)",
        "",
        "| round | " + " | ".join(names) + " | ratio | ratio without lag |",
        "|---|" + "---|" * (len(names) + 2),
    ]
    for index in range(len(results["rounds"])):
        cells = [summary["goodputs"][n][index] for n in names]
        lines.append(f"| {index + 1} | " + " | ".join("n/a" if c is None else f"{c:.1f}" for c in cells)
                     + f" | {_x(summary['ratios'][index])} | {_x(summary['ratios_without_lag'][index])} |")  # fmt: skip
    medians = [statistics.median([v for v in summary["goodputs"][n] if v is not None] or [math.nan]) for n in names]
    lines.append("| median | " + " | ".join(f"{m:.1f}" for m in medians) + f" | {_x(summary.get('median'))} | |")
    if "median" in summary:
        lines += [
            "",
            f"Median ratio {summary['median']:.2f}x; {summary['coverage']:.0%} confidence interval of the median "
            f"{summary['low']:.2f}-{summary['high']:.2f}x; goal {results['goal']:g}x.",
        ]
    lines += [
        "",
        "Where the cores went at each server's goodput (the step that set it; medians over the rounds): the server's "
        "processes' CPU and the load generator's per answered request, and the cores the two used of "
        f"{CORES}.",
        "",
        "| server | server CPU ms per request | generator CPU ms per request | cores used |",
        "|---|---|---|---|",
    ]
    for name, points in summary["cpu"].items():
        if points:
            lines.append(f"| {name} | " + " | ".join(f"{statistics.median(p[key] for p in points):.2f}"
                                                     for key in ("server_ms", "generator_ms", "cores")) + " |")  # fmt: skip
    lines += ["", gates_section(judged)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    goals = {model: goal for server, model, goal in GOALS if server == TRITON}
    parser = argparse.ArgumentParser(prog="python -m bench.studies.goodput_rounds", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(goals), default="text_classifier")
    parser.add_argument("--rounds", type=int, default=5, help="default: %(default)s (the range is a 94%% interval)")
    parser.add_argument("--step-seconds", type=float, default=5.0, help="per offered rate; default: %(default)s")
    parser.add_argument("--capacity-seconds", type=float, default=3.0, help="closed loop at c=16; %(default)s")
    parser.add_argument("--single-seconds", type=float, default=3.0, help="in-process p50 window; %(default)s")
    parser.add_argument("--pool", nargs="+", type=Path, default=[], metavar="RESULTS_JSON",
                        help="earlier runs' results.json (same model): their rounds count first, their objective holds")  # fmt: skip
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC time>-goodput-rounds")
    args = parser.parse_args(argv)
    earlier = [json.loads(path.read_text()) for path in args.pool]
    if any(run["model"] != args.model or run["objective_ms"] != earlier[0]["objective_ms"] for run in earlier):
        parser.error("--pool: every earlier run must be of --model, at one objective")
    started, out = run_folder(args.out, "goodput-rounds")
    onnx_file = REPOSITORY / args.model / "1" / "model.onnx"
    if earlier:
        single_p50, objective = earlier[0]["single_p50_ms"], earlier[0]["objective_ms"]
    else:
        single_p50, _ = single_request_ms(args.model, onnx_file, args.single_seconds)
        objective = objective_ms(single_p50)
    say(f"{args.model}: in-process p50 {single_p50:.2f} ms: objective p99 <= {objective:.1f} ms")
    results: dict = {"started": started, "machine": machine(), "settings": settings(args), "model": args.model,
                     "goal": goals[args.model], "single_p50_ms": single_p50, "objective_ms": objective,
                     "pooled": [{"started": run["started"], "rounds": len(run["rounds"])} for run in earlier],
                     "rounds": [records for run in earlier for records in run["rounds"]]}  # fmt: skip
    workdir = out / "logs"
    workdir.mkdir(exist_ok=True)
    made: list[servers.Server] = make_servers(["triton", "fastapi"], args.model, workdir)
    for index in range(len(results["rounds"]), len(results["rounds"]) + args.rounds):
        records: dict = {}
        for server in made[index % len(made) :] + made[: index % len(made)]:
            say(f"round {index + 1}: {server.name} ...")
            records[server.name] = measure_open(server, args.model, onnx_file, objective, args, overloads=())
        results["rounds"].append({server.name: records[server.name] for server in made})
        write_json(out / "results.json", results)  # what is done so far survives an interruption
    summary = summarise(results)
    results["summary"] = summary
    plot(results, summary, out / "rounds.png")
    judged = judge(results, summary)
    return finish(out, report(results, summary, judged), judged, results)


if __name__ == "__main__":
    sys.exit(main())
