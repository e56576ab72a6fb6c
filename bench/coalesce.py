"""python -m bench.coalesce: what merging concurrent facade calls into one Triton request gives.

One tritonserver, two facades in front of it: the default one, and one started with `--coalesce 1`
(concurrent Predict calls of one model, shape and priority reach Triton as one batched request
once `--coalesce-depth` requests are already there). The same closed loop (`--concurrency` callers,
raw images of `--model`, outputs checked against ONNX Runtime before each run) through each in
turn, `--rounds` times, interleaved. Reported: throughput and latency of each, and how many calls
each request to Triton carried on average (the facade's `tritonnx_facade_calls_per_triton_request`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from backend.server.facade import start_facade
from backend.server.repository import link_models
from backend.server.stack import ServingStack
from bench import REPOSITORY
from bench.load.loops import run_load
from bench.load.targets import FacadeTarget
from bench.output import machine, run_folder, say, settings, write_json

CALLS_PER_REQUEST = "tritonnx_facade_calls_per_triton_request"


@dataclass
class CoalesceRun:
    round: int
    coalesce: bool
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    calls_per_triton_request: float
    errors: dict[str, int]


def calls_per_triton_request(http_url: str) -> tuple[float, float]:
    """(calls, Triton requests) so far, from a facade's /metrics."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = {"_sum": 0.0, "_count": 0.0}
    for line in text.splitlines():
        for suffix in found:
            if line.startswith(f"{CALLS_PER_REQUEST}{suffix} "):
                found[suffix] = float(line.rsplit(" ", 1)[1])
    return found["_sum"], found["_count"]


def report(runs: list[CoalesceRun], args: argparse.Namespace) -> str:
    rows = [
        f"# Facade coalescing, {args.model}, c={args.concurrency}, {args.seconds:.0f} s runs\n",
        f"Machine: {machine()}\n",
        "| round | coalesce | req/s | p50 ms | p99 ms | requests | calls per Triton request |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r.round} | {'on' if r.coalesce else 'off'} | {r.throughput_rps:.1f} | {r.p50_ms:.1f} | "
            f"{r.p99_ms:.1f} | {r.requests} | {r.calls_per_triton_request:.2f} |"
            for r in runs
        ),
        "",
        "| round | throughput on/off |",
        "|---|---|",
    ]
    for index in sorted({r.round for r in runs}):
        off, on = (next(r for r in runs if r.round == index and r.coalesce is c) for c in (False, True))
        rows.append(f"| {index} | {on.throughput_rps / off.throughput_rps:.3f} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.coalesce",
        description="Throughput through the facade with and without --coalesce, interleaved, on one tritonserver.",
    )
    parser.add_argument("--model", default="mobilenet_v3_small", help="default: %(default)s")
    parser.add_argument("--concurrency", type=int, default=16, help="default: %(default)s")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured per run; default: %(default)s")
    parser.add_argument("--warmup", type=float, default=3.0, help="per run, not measured; default: %(default)s")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; default: %(default)s")
    parser.add_argument("--depth", type=int, default=0, help="the facade's --coalesce-depth; default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-coalesce")
    args = parser.parse_args(argv)
    _, out = run_folder(args.out, "coalesce")
    repository = link_models(out / "repository", {args.model: REPOSITORY / args.model})
    common = ["--default-model", args.model, "--health-interval", "30", "--max-in-flight", "1024"]
    runs: list[CoalesceRun] = []
    with ServingStack(repository, out, facade_args=common) as stack:
        assert stack.facade is not None
        merging = start_facade(stack.triton.grpc_url, stack.admin_key, out / "facade-coalesce.log",
                               [*common, "--coalesce", "1", "--coalesce-depth", str(args.depth)])  # fmt: skip
        try:
            for index in range(1, args.rounds + 1):
                for coalesce in (False, True) if index % 2 else (True, False):
                    facade = merging if coalesce else stack.facade
                    calls_before, sent_before = calls_per_triton_request(facade.http_url)
                    target = FacadeTarget(facade.grpc_url, args.model)
                    result = asyncio.run(run_load(target, args.concurrency, args.seconds, args.warmup))
                    calls, sent = calls_per_triton_request(facade.http_url)
                    # Without coalescing each call is one ModelInfer (the histogram is left empty).
                    per_request = (calls - calls_before) / max(sent - sent_before, 1.0) if coalesce else 1.0
                    run = CoalesceRun(index, coalesce, result.throughput_rps, result.p50_ms, result.p99_ms,
                                      result.requests, per_request, result.errors)  # fmt: skip
                    say(f"round {index} coalesce {'on' if coalesce else 'off'}: {run.throughput_rps:.1f} req/s, "
                        f"p50 {run.p50_ms:.1f} ms, p99 {run.p99_ms:.1f} ms, {run.calls_per_triton_request:.2f} "
                        f"calls per Triton request, errors {run.errors or 'none'}")  # fmt: skip
                    runs.append(run)
        finally:
            merging.stop()
    write_json(out / "results.json", {"settings": settings(args), "runs": [asdict(r) for r in runs]})
    text = report(runs, args)
    (out / "report.md").write_text(text)
    print(text)
    return 0 if all(not r.errors for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
