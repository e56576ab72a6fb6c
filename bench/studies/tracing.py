"""python -m bench.studies.tracing: what OpenTelemetry tracing costs the facade path.

The same closed loop (`--concurrency` callers, raw images of `--model`) through the facade and
Triton, with tracing off and with tracing on at `--ratio` (the facade's spans and tritonserver's
for the traced calls, both exported to an OTLP receiver in this process), `--rounds` times,
interleaved (off/on, then on/off) so that the machine's drift falls on both. Each run has a
serving stack of its own: tritonserver's tracing is set when it starts. Reported: throughput and
latency per run, the overhead per round (1 - on/off), and the traces received, which show tracing
was on. Gates (exit 1 when one fails, named in the report): no call failed, and every run with tracing
on received traces joined with Triton's. The overhead is reported, not gated.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from backend.server.repository import link_models
from backend.server.stack import ServingStack
from bench import REPOSITORY
from bench.load.loops import run_load
from bench.load.targets import FacadeTarget
from bench.output import Gate, finish, gates_section, machine, run_folder, say, settings, write_json
from client.traces import OtlpReceiver


@dataclass
class TracingRun:
    round: int
    tracing: bool
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    traces: int  # traces received whose calls went through Triton (facade and tritonserver spans)
    errors: dict[str, int]


def one_run(
    repository: Path, workdir: Path, args: argparse.Namespace, receiver: OtlpReceiver | None, round_: int
) -> TracingRun:
    tracing = receiver is not None
    before = {s.trace_id for s in receiver.spans()} if receiver else set()
    with ServingStack(
        repository,
        workdir / f"round{round_}-{'on' if tracing else 'off'}",
        facade_args=["--default-model", args.model],
        otlp_endpoint=receiver.endpoint if receiver else "",
        trace_ratio=args.ratio,
    ) as stack:
        assert stack.facade is not None
        result = asyncio.run(
            run_load(FacadeTarget(stack.facade.grpc_url, args.model), args.concurrency, args.seconds, args.warmup)
        )
    # The stack stopped: both processes sent what they still held.
    joined = 0
    if receiver is not None:
        spans = [s for s in receiver.spans() if s.trace_id not in before]
        facade = {s.trace_id for s in spans if s.name == "ModelInfer"}
        joined = len(facade & {s.trace_id for s in spans if s.service == "tritonserver"})
    run = TracingRun(round_, tracing, result.throughput_rps, result.p50_ms, result.p99_ms, result.requests, joined,
                     result.errors)  # fmt: skip
    say(
        f"round {round_} tracing {'on' if tracing else 'off'}: {run.throughput_rps:.1f} req/s, p50 {run.p50_ms:.1f} "
        f"ms, p99 {run.p99_ms:.1f} ms, {run.traces} traces through Triton, errors {run.errors or 'none'}"
    )
    return run


def report(runs: list[TracingRun], args: argparse.Namespace) -> str:
    rows = [
        f"# Tracing overhead, {args.model}, facade path, c={args.concurrency}, {args.seconds:.0f} s runs, "
        f"ratio {args.ratio}\n",
        f"Machine: {machine()}\n",
        "| round | tracing | req/s | p50 ms | p99 ms | requests | traces joined with Triton's |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r.round} | {'on' if r.tracing else 'off'} | {r.throughput_rps:.1f} | {r.p50_ms:.1f} | "
            f"{r.p99_ms:.1f} | {r.requests} | {r.traces if r.tracing else '-'} |"
            for r in runs
        ),
        "",
        "| round | throughput on/off | overhead |",
        "|---|---|---|",
    ]
    ratios = []
    for index in sorted({r.round for r in runs}):
        off, on = (next(r for r in runs if r.round == index and r.tracing is t) for t in (False, True))
        ratios.append(on.throughput_rps / off.throughput_rps)
        rows.append(f"| {index} | {ratios[-1]:.3f} | {1 - ratios[-1]:+.1%} |")
    total_on = sum(r.throughput_rps for r in runs if r.tracing)
    total_off = sum(r.throughput_rps for r in runs if not r.tracing)
    rows += [
        "",
        f"Median overhead per round {1 - statistics.median(ratios):+.1%}; over all rounds "
        f"{1 - total_on / total_off:+.1%} (negative: tracing on measured faster, i.e. within the noise).",
    ]
    return "\n".join(rows) + "\n"


def gates(runs: list[TracingRun]) -> list[Gate]:
    on = [r for r in runs if r.tracing]
    return [
        Gate("no call failed", not any(r.errors for r in runs), str([r.errors for r in runs if r.errors] or "none")),
        Gate("tracing on: traces joined with Triton's in every run", all(r.traces for r in on),
             f"traces per run {[r.traces for r in on]}"),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.tracing",
        description="Throughput through the facade and Triton with OpenTelemetry tracing off and on, interleaved.",
    )
    parser.add_argument("--model", default="mobilenet_v3_small", help="default: %(default)s")
    parser.add_argument("--ratio", type=float, default=0.1, help="share of calls traced; default: %(default)s")
    parser.add_argument("--concurrency", type=int, default=16, help="default: %(default)s")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured per run; default: %(default)s")
    parser.add_argument("--warmup", type=float, default=3.0, help="per run, not measured; default: %(default)s")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-tracing")
    args = parser.parse_args(argv)
    _, out = run_folder(args.out, "tracing")
    repository = link_models(out / "repository", {args.model: REPOSITORY / args.model})
    runs: list[TracingRun] = []
    with OtlpReceiver() as receiver:
        for index in range(1, args.rounds + 1):
            order = (False, True) if index % 2 else (True, False)
            for tracing in order:
                runs.append(one_run(repository, out, args, receiver if tracing else None, index))
    judged = gates(runs)
    write_json(out / "results.json", {"settings": settings(args), "runs": [asdict(r) for r in runs],
                                      "gates": [asdict(g) for g in judged]})  # fmt: skip
    text = report(runs, args) + "\n" + gates_section(judged)
    return finish(out, text, judged)


if __name__ == "__main__":
    sys.exit(main())
