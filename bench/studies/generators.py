"""python -m bench.studies.generators: whether the Python open loop keeps up with the rates it offers.

The goodput study (`python -m bench.peers --open-loop`) drives every server with the project's Python open loop
(bench/load/offered.py), on the same 2 cores as the server; at the small models' rates it sent tens of ms behind its
schedule. Here the same Poisson rates are offered by that generator and by a compiled one, one after the other at
each rate: to Triton direct (the model's own config) by perf_analyzer (C++, KServe v2, asynchronous calls from a few
threads), and to the FastAPI baseline (its 2x1 layout) by poisson-http (C, bench/load/poisson_http.c: one keep-alive
connection per call in flight, every answer checked). Reported: the answered p99 against the rate offered, what each
generator answered, its own CPU, its lag where it reports one, and the goodput each finds at the goodput study's
objective. perf_analyzer times a call from its actual send (it reports no lag); the Python loop and poisson-http from
its scheduled send. Every step starts once the server is idle (`goodput.settle`): after an overload, a server that
queues without bound is still working off the calls its caller gave up on.

Gates (exit 1 when one fails): the answers equal in-process ONNX Runtime before the steps (and, for poisson-http, every
answer in them), and every step was measured by both generators, or ended by Triton refusing calls (perf_analyzer stops
at a failed call: such a step is past the goodput anyway).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from bench import REPOSITORY
from bench.baseline.workers import setups
from bench.load import loops
from bench.load.compiled import offer_http
from bench.load.http import HttpTarget
from bench.load.offered import MAX_OUTSTANDING, offer, summary
from bench.load.targets import KServeTarget, Target
from bench.output import CORES, Gate, finish, gates_section, machine, run_folder, say, settings, write_json
from bench.peers import servers
from bench.peers.goodput import (
    CAPACITY_CONCURRENCY,
    STEPS,
    ServerCpu,
    cpu_reader,
    measure_checked,
    objective_ms,
    settle,
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
COMPILED = {"triton": "perf_analyzer", "fastapi": "poisson-http"}  # each server's compiled generator


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


async def _python_steps(target: Target, seconds: float, server_cpu: ServerCpu) -> tuple[float, list[dict]]:
    """The closed-loop capacity at c=16, then STEPS x that capacity by the Python open loop (with its CPU), settled."""
    await target.open(MAX_OUTSTANDING)
    try:
        closed = await loops.run_load(target, CAPACITY_CONCURRENCY, 3.0, warmup_s=1.0, verify=False)
        say(f"    capacity at c={CAPACITY_CONCURRENCY}: {closed.throughput_rps:.1f} req/s")
        steps = []
        for index, factor in enumerate(STEPS):
            await settle(server_cpu)
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
    return {"offered_rps": rate, "answered_rps": point.throughput, **point.as_dict()}


def _poisson_step(target: HttpTarget, rate: float, seconds: float, seed: int) -> dict:
    result, cpu = offer_http(target, rate, seconds, seed=seed)
    say(f"    poisson-http: {summary(result)}; CPU {cpu:.2f}")
    return {**result.as_dict(), "client_cpu": cpu}


def the_server(key: str, model: str, workdir: Path) -> servers.Server:
    """Triton direct with the model's own config, or the FastAPI baseline's one-worker-per-core layout."""
    if key == "triton":
        return servers.Tritonnx(REPOSITORY, model, workdir)
    layout = next(setup for setup in setups(CORES) if setup.workers == CORES)
    return servers.FastApi(REPOSITORY / model / "1" / "model.onnx", layout, workdir)


def measure(model: str, keys: list[str], args: argparse.Namespace, workdir: Path) -> dict:
    """One model: the objective, then per server its capacity and every rate by each generator in turn."""
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    single_p50, _ = single_request_ms(model, onnx_file, args.single_seconds)
    record: dict = {"single_p50_ms": single_p50, "objective_ms": objective_ms(single_p50), "servers": {}}
    say(f"{model}: objective p99 <= {record['objective_ms']:.1f} ms")
    workdir.mkdir(parents=True, exist_ok=True)
    for key in keys:
        server = the_server(key, model, workdir)
        say(f"{model}: {server.name} ...")

        def both(target: Target, requests: list, server: servers.Server = server) -> dict:
            server_cpu = cpu_reader(server)
            capacity, python = asyncio.run(_python_steps(target, args.step_seconds, server_cpu))
            compiled = []
            for index, step in enumerate(python):
                asyncio.run(settle(server_cpu))
                if isinstance(target, KServeTarget):
                    input_data = perf_input_data(requests, workdir)
                    compiled.append(_perf_step(model, target.url, step["offered_rps"], args.step_seconds, input_data))
                else:
                    assert isinstance(target, HttpTarget)
                    compiled.append(_poisson_step(target, step["offered_rps"], args.step_seconds, seed=index))
            return {"capacity_rps": capacity, "python": python, "compiled": compiled}

        measured = measure_checked(server, model, onnx_file, both)
        record["servers"][server.name] = {"generator": COMPILED[key], **measured}
    return record


def compiled_kept(step: dict, objective: float) -> bool:
    """poisson-http's step as the Python loop's; perf_analyzer stops on a failed call, so a step it measured had none."""
    if "error_share" in step:
        return within(step, objective)
    return "error" not in step and step["p99_ms"] <= objective


def goodputs(record: dict, objective: float) -> dict[str, float]:
    """The goodput each generator found on one server."""
    return {
        "Python open loop": max((s["offered_rps"] for s in record["python"] if within(s, objective)), default=0),
        record["generator"]: max(
            (s["offered_rps"] for s in record["compiled"] if compiled_kept(s, objective)), default=0
        ),
    }


def measured(results: dict) -> list[tuple[str, str, dict]]:
    """(model, server, record) of every server measured."""
    return [(model, name, record) for model, data in results["models"].items()
            for name, record in data.get("servers", {}).items() if "python" in record]  # fmt: skip


def plot(results: dict, path: Path) -> None:
    panels = measured(results)
    figure, axes = plt.subplots(1, max(1, len(panels)), figsize=(6 * max(1, len(panels)), 4.5), squeeze=False)
    for axis, (model, name, record) in zip(axes[0], panels, strict=False):
        python = record["python"]
        compiled = [s for s in record["compiled"] if "error" not in s]
        axis.plot([s["offered_rps"] for s in python], [s["p99_ms"] for s in python], "o-", label="Python open loop")
        axis.plot([s["offered_rps"] for s in python], [s["lag_p99_ms"] for s in python], "o:", label="its lag p99")
        axis.plot([s["offered_rps"] for s in compiled], [s["p99_ms"] for s in compiled], "s-",
                  label=record["generator"])  # fmt: skip
        if compiled and "lag_p99_ms" in compiled[0]:
            axis.plot([s["offered_rps"] for s in compiled], [s["lag_p99_ms"] for s in compiled], "s:",
                      label="its lag p99")  # fmt: skip
        axis.axhline(results["models"][model]["objective_ms"], color="grey", linestyle="--", label="objective")
        axis.set(title=f"{model}, {name}", xlabel="offered req/s (Poisson)", ylabel="answered p99 ms", yscale="log")
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _compiled_cells(step: dict) -> str:
    if "error" in step:
        return f"{step['error']} | | | |"
    lag = f"{step['lag_p99_ms']:.1f}" if "lag_p99_ms" in step else "n/a"
    errors = f"{step['error_share']:.1%}" if "error_share" in step else "0 (it stops at one)"
    return (f"{step['answered_rps']:.1f} | {step['p50_ms']:.1f} / {step['p99_ms']:.1f} | {lag} | {errors} | "
            f"{step['client_cpu']:.2f} |")  # fmt: skip


def report(results: dict, judged: list[Gate]) -> str:
    lines = [
        f"# The Python open loop against compiled generators, the same Poisson rates {results['started']}",
        "",
        f"Machine: {results['machine']}. Per model: the goodput study's objective (answered p99 <= 5x the in-process "
        "single-request p50, at least 25 ms); per server its capacity from the Python closed loop at "
        f"c={CAPACITY_CONCURRENCY}, then {', '.join(f'{f:g}' for f in STEPS)}x that capacity offered for "
        f"{results['settings']['step_seconds']:g} s each, first by the Python open loop (every answer checked, every "
        "call timed from its scheduled send), then by the server's compiled generator: for Triton direct (the model's "
        f"own config) perf_analyzer (asynchronous calls from {PERF_THREADS} threads, its last 3 windows merged, answers "
        "not checked, calls timed from their actual send, no lag reported), for the FastAPI baseline (one worker per "
        "core) poisson-http (bench/load/poisson_http.c: a keep-alive connection per call in flight, every answer "
        "checked, calls timed from their scheduled send). CPU: the generator's own CPU seconds per second (1.0 = one of "
        "the 2 cores).",
        "",
        "![p99 against the rate offered](generators.png)",
        "",
    ]
    for model, data in results["models"].items():
        lines += [f"## {model}", "", f"Objective: p99 <= {data['objective_ms']:.1f} ms.", ""]
        for name, record in data["servers"].items():
            lines += [f"### {name}", ""]
            if "error" in record:
                lines += [f"Not measured: {record['error']}", ""]
                continue
            found = goodputs(record, data["objective_ms"])
            generator = record["generator"]
            lines += [
                f"Capacity (c={CAPACITY_CONCURRENCY}): {record['capacity_rps']:.1f} req/s. Goodput: Python open loop "
                f"{found['Python open loop']:.1f}, {generator} {found[generator]:.1f} req/s.",
                "",
                f"| offered req/s | Python: answered/s | p50 / p99 ms | lag p99 ms | errors | CPU | {generator}: "
                "answered/s | p50 / p99 ms | lag p99 ms | errors | CPU |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            for py, theirs in zip(record["python"], record["compiled"], strict=True):
                lines.append(
                    f"| {py['offered_rps']:.1f} | {py['answered_rps']:.1f} | {py['p50_ms']:.1f} / {py['p99_ms']:.1f} | "
                    f"{py['lag_p99_ms']:.1f} | {py['error_share']:.1%} | {py['client_cpu']:.2f} | "
                    + _compiled_cells(theirs)
                )
            lines.append("")
    lines.append(gates_section(judged))
    return "\n".join(lines)


def judge(results: dict) -> list[Gate]:
    records = [(f"{model}, {name}", record) for model, data in results["models"].items()
               for name, record in data["servers"].items()]  # fmt: skip
    wrong = [f"{where}: {r['error']}" for where, r in records if "error" in r] + [
        f"{where}: {r['wrong']} wrong" for where, r in records if r.get("wrong")
    ] + [f"{where} at {s['offered_rps']:.0f}/s: {s['wrong']} wrong from {r['generator']}" for where, r in records
         for s in r.get("compiled", []) if s.get("wrong")]  # fmt: skip
    unmeasured = [f"{where} at {s['offered_rps']:.0f}/s: {s['error']}" for where, r in records
                  for s in r.get("compiled", []) if "error" in s and not s.get("refused")]  # fmt: skip
    return [
        Gate(
            "every answer checked was like in-process ONNX Runtime's, every server measured",
            not wrong,
            "; ".join(wrong) or "all",
        ),  # fmt: skip
        Gate(
            "every rate measured by both generators (or refused by Triton)",
            not unmeasured,
            "; ".join(unmeasured) or "all",
        ),  # fmt: skip
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.generators", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet_v3_small", "text_classifier"])
    parser.add_argument("--servers", nargs="+", choices=sorted(COMPILED), default=["triton", "fastapi"],
                        help="Triton direct (perf_analyzer) and the FastAPI baseline (poisson-http); %(default)s")  # fmt: skip
    parser.add_argument("--step-seconds", type=float, default=5.0, help="per rate and generator; %(default)s")
    parser.add_argument("--single-seconds", type=float, default=3.0, help="in-process p50 window; %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC time>-generators")
    args = parser.parse_args(argv)
    started, out = run_folder(args.out, "generators")
    results: dict = {"started": started, "machine": machine(), "settings": settings(args), "models": {}}
    for model in args.models:
        results["models"][model] = data = measure(model, args.servers, args, out / "logs" / model)
        for record in data["servers"].values():
            if "python" in record:
                record["goodput_rps"] = goodputs(record, data["objective_ms"])
        write_json(out / "results.json", results)
    plot(results, out / "generators.png")
    judged = judge(results)
    return finish(out, report(results, judged), judged, results)


if __name__ == "__main__":
    sys.exit(main())
