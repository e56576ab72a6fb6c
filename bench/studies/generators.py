"""python -m bench.studies.generators: whether the Python open loop keeps up with the rates it offers.

The goodput study (`python -m bench.peers --open-loop`) drives every server with the project's Python open loop
(bench/load/offered.py), on the same 2 cores as the server; at the small models' rates it sent tens of ms behind its
schedule. Here the same Poisson rates are offered to Triton direct (the model's own config) by that generator and by
perf_analyzer (C++, asynchronous calls from a few threads), one after the other at each rate: the answered p99
against the rate offered, what each generator answered, its own CPU, the Python one's lag, and the goodput each finds
at the goodput study's objective. Triton direct only: perf_analyzer speaks KServe v2, the FastAPI baseline does not.
perf_analyzer times a call from its actual send (it reports no lag), the Python loop from its scheduled send.

Gates (exit 1 when one fails): the answers equal in-process ONNX Runtime before the steps, and every step was measured
by both generators, or ended by Triton refusing calls (perf_analyzer stops at a failed call: such a step is past the
goodput anyway).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from bench import REPOSITORY
from bench.load import loops
from bench.load.offered import MAX_OUTSTANDING, offer, summary
from bench.load.targets import KServeTarget, Target
from bench.output import Gate, finish, gates_section, machine, run_folder, say, settings, write_json
from bench.peers import servers
from bench.peers.goodput import (
    CAPACITY_CONCURRENCY,
    STEPS,
    measure_checked,
    objective_ms,
    single_request_ms,
    within,
)
from bench.perf import PerfAnalyzerError, run_perf_analyzer

import matplotlib  # isort: skip

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  # isort: skip

# Triton's refusals (a full queue, a queue timeout): perf_analyzer ends the step at the first one.
REFUSALS = ("Exceeds maximum queue size", "Request timeout expired")
PERF_THREADS = 4  # perf_analyzer's sending threads; its calls are asynchronous, so a slow answer holds none back


def perf_input_data(requests: list, folder: Path) -> str:
    """perf_analyzer's `--input-data`: the text requests' own sequences (mixed lengths) in its JSON; images: random."""
    if not requests or not isinstance(requests[0], dict):
        return "random"
    steps = [
        {name: {"content": array.ravel().tolist(), "shape": list(array.shape[1:])} for name, array in request.items()}
        for request in requests
    ]
    path = folder / "perf-input.json"
    path.write_text(json.dumps({"data": steps}))
    return str(path)


async def _python_steps(target: Target, seconds: float) -> tuple[float, list[dict]]:
    """The closed-loop capacity at c=16, then STEPS x that capacity offered by the Python open loop (with its CPU)."""
    await target.open(MAX_OUTSTANDING)
    try:
        closed = await loops.run_load(target, CAPACITY_CONCURRENCY, 3.0, warmup_s=1.0, verify=False)
        say(f"    capacity at c={CAPACITY_CONCURRENCY}: {closed.throughput_rps:.1f} req/s")
        steps = []
        for index, factor in enumerate(STEPS):
            cpu, wall = time.process_time(), time.monotonic()
            result = await offer(target, closed.throughput_rps * factor, seconds, seed=index)
            used = (time.process_time() - cpu) / (time.monotonic() - wall)
            say(f"    python: {summary(result)}; CPU {used:.2f}")
            steps.append({**result.as_dict(), "client_cpu": used})
        return closed.throughput_rps, steps
    finally:
        await target.close()


def _perf_step(model: str, url: str, rate: float, seconds: float, input_data: str) -> dict:
    try:
        # Its last 3 windows make the step, however they vary: past capacity an open loop's latency grows with
        # the queue and never "stabilises".
        point = run_perf_analyzer(model, url, PERF_THREADS, measurement_ms=int(seconds * 1000 / 3), max_trials=3,
                                  input_data=input_data, request_rate=rate, stability_percentage=1_000_000)  # fmt: skip
    except PerfAnalyzerError as error:
        text = " ".join(str(error).split())
        if any(refusal in text for refusal in REFUSALS):
            return {"offered_rps": rate, "refused": True, "error": "Triton refused calls; perf_analyzer stops there"}
        return {"offered_rps": rate, "error": text[-300:]}
    say(f"    perf_analyzer: {rate:7.1f} req/s offered: {point.throughput:.1f}/s answered, p50 {point.p50_ms:.1f} "
        f"p99 {point.p99_ms:.1f} ms; CPU {point.client_cpu:.2f}")  # fmt: skip
    return {"offered_rps": rate, **point.as_dict()}


def measure(model: str, args: argparse.Namespace, workdir: Path) -> dict:
    """One model: the objective, Triton direct's capacity, then every rate by each generator in turn."""
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    single_p50, _ = single_request_ms(model, onnx_file, args.single_seconds)
    record: dict = {"single_p50_ms": single_p50, "objective_ms": objective_ms(single_p50)}
    say(f"{model}: objective p99 <= {record['objective_ms']:.1f} ms")

    def both(target: Target, requests: list) -> dict:
        assert isinstance(target, KServeTarget)  # Triton direct
        capacity, python = asyncio.run(_python_steps(target, args.step_seconds))
        input_data = perf_input_data(requests, workdir)
        perf = [_perf_step(model, target.url, step["offered_rps"], args.step_seconds, input_data) for step in python]
        return {"capacity_rps": capacity, "python": python, "perf_analyzer": perf}

    workdir.mkdir(parents=True, exist_ok=True)
    record.update(measure_checked(servers.Tritonnx(REPOSITORY, model, workdir), model, onnx_file, both))
    return record


def perf_kept(step: dict, objective: float) -> bool:
    """perf_analyzer stops on a failed call: a step it measured had none."""
    return "error" not in step and step["p99_ms"] <= objective


def goodputs(record: dict) -> dict[str, float]:
    objective = record["objective_ms"]
    return {
        "Python open loop": max((s["offered_rps"] for s in record["python"] if within(s, objective)), default=0),
        "perf_analyzer": max((s["offered_rps"] for s in record["perf_analyzer"] if perf_kept(s, objective)), default=0),
    }


def plot(results: dict, path: Path) -> None:
    models = [(m, r) for m, r in results["models"].items() if "python" in r]
    figure, axes = plt.subplots(1, max(1, len(models)), figsize=(6 * max(1, len(models)), 4.5), squeeze=False)
    for axis, (model, record) in zip(axes[0], models, strict=False):
        python = record["python"]
        perf = [s for s in record["perf_analyzer"] if "error" not in s]
        axis.plot([s["offered_rps"] for s in python], [s["p99_ms"] for s in python], "o-", label="Python open loop")
        axis.plot([s["offered_rps"] for s in python], [s["lag_p99_ms"] for s in python], "o:", label="its lag p99")
        axis.plot([s["offered_rps"] for s in perf], [s["p99_ms"] for s in perf], "s-", label="perf_analyzer")
        axis.axhline(record["objective_ms"], color="grey", linestyle="--", label="objective")
        axis.set(title=f"{model}, Triton direct", xlabel="offered req/s (Poisson)", ylabel="answered p99 ms",
                 yscale="log")  # fmt: skip
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def report(results: dict, judged: list[Gate]) -> str:
    lines = [
        f"# The Python open loop against perf_analyzer, the same Poisson rates to Triton direct {results['started']}",
        "",
        f"Machine: {results['machine']}. Per model: the goodput study's objective (answered p99 <= 5x the in-process "
        "single-request p50, at least 25 ms), Triton direct with the model's own config, its capacity from the Python "
        f"closed loop at c={CAPACITY_CONCURRENCY}, then {', '.join(f'{f:g}' for f in STEPS)}x that capacity offered "
        f"for {results['settings']['step_seconds']:g} s each, first by the Python open loop (every answer checked, "
        "every call timed from its scheduled send), then by perf_analyzer (asynchronous calls from "
        f"{PERF_THREADS} threads, its last 3 windows merged, answers not checked, calls timed from their actual send). CPU: the "
        "generator's own CPU seconds per second (1.0 = one of the 2 cores).",
        "",
        "![p99 against the rate offered](generators.png)",
        "",
    ]
    for model, record in results["models"].items():
        lines += [f"## {model}", ""]
        if "error" in record:
            lines += [f"Not measured: {record['error']}", ""]
            continue
        found = goodputs(record)
        lines += [
            f"Objective: p99 <= {record['objective_ms']:.1f} ms. Capacity (c={CAPACITY_CONCURRENCY}): "
            f"{record['capacity_rps']:.1f} req/s. Goodput: Python open loop {found['Python open loop']:.1f}, "
            f"perf_analyzer {found['perf_analyzer']:.1f} req/s.",
            "",
            "| offered req/s | Python: answered/s | p50 / p99 ms | lag p99 ms | errors | CPU | perf_analyzer: "
            "answered/s | p50 / p99 ms | CPU |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for py, pa in zip(record["python"], record["perf_analyzer"], strict=True):
            theirs = (
                f"{pa['error']} | | |"
                if "error" in pa
                else f"{pa['throughput']:.1f} | {pa['p50_ms']:.1f} / {pa['p99_ms']:.1f} | {pa['client_cpu']:.2f} |"
            )
            lines.append(
                f"| {py['offered_rps']:.1f} | {py['answered_rps']:.1f} | {py['p50_ms']:.1f} / {py['p99_ms']:.1f} | "
                f"{py['lag_p99_ms']:.1f} | {py['error_share']:.1%} | {py['client_cpu']:.2f} | {theirs}"
            )
        lines.append("")
    lines.append(gates_section(judged))
    return "\n".join(lines)


def judge(results: dict) -> list[Gate]:
    records = results["models"].items()
    wrong = [f"{m}: {r['error']}" for m, r in records if "error" in r] + [
        f"{m}: {r['wrong']} wrong" for m, r in records if r.get("wrong")
    ]
    unmeasured = [f"{m} at {s['offered_rps']:.0f}/s: {s['error']}" for m, r in records
                  for s in r.get("perf_analyzer", []) if "error" in s and not s.get("refused")]  # fmt: skip
    return [
        Gate(
            "every model answered like in-process ONNX Runtime and was measured", not wrong, "; ".join(wrong) or "all"
        ),
        Gate(
            "every rate measured by both generators (or refused by Triton)",
            not unmeasured,
            "; ".join(unmeasured) or "all",
        ),  # fmt: skip
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.generators", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet_v3_small", "text_classifier"])
    parser.add_argument("--step-seconds", type=float, default=5.0, help="per rate and generator; %(default)s")
    parser.add_argument("--single-seconds", type=float, default=3.0, help="in-process p50 window; %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC time>-generators")
    args = parser.parse_args(argv)
    started, out = run_folder(args.out, "generators")
    results: dict = {"started": started, "machine": machine(), "settings": settings(args), "models": {}}
    for model in args.models:
        results["models"][model] = record = measure(model, args, out / "logs" / model)
        if "python" in record:
            record["goodput_rps"] = goodputs(record)
        write_json(out / "results.json", results)
    plot(results, out / "generators.png")
    judged = judge(results)
    return finish(out, report(results, judged), judged, results)


if __name__ == "__main__":
    sys.exit(main())
