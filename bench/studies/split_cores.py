"""python -m bench.studies.split_cores: the facade against Triton direct when they do not share cores.

`make bench` runs the client, the facade and tritonserver on the same cores, so every
millisecond of CPU the facade spends is taken from the server and its ratio to Triton direct is
its CPU cost. A deployment with cores to spare gives the facade its own. This measures that
layout on the same machine:

- tritonserver and its stubs run on the first half of the cores;
- the facade and the load generator run on the rest.

Then the same load generator drives Triton direct and the facade in interleaved rounds.
Writes bench/results/<UTC time>-split/{report.md,results.json}. Gates (exit 1 when one fails, named in
the report): every thread ran where the layout puts it, and no call failed. The facade / direct ratio
is reported, not gated.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

import psutil

from backend.server.repository import link_models
from backend.server.stack import ServingStack
from bench import REPOSITORY, RESULTS
from bench.load import loops
from bench.load.targets import FacadeTarget, KServeTarget
from bench.output import Gate, gates_section, verdict, write_json

T = TypeVar("T")


def split(cores: set[int]) -> tuple[set[int], set[int]]:
    """(server cores, facade and client cores): the first half, and the rest."""
    ordered = sorted(cores)
    if len(ordered) < 2:
        raise SystemExit("bench.studies.split_cores needs at least 2 cores to split")
    half = len(ordered) // 2
    return set(ordered[:half]), set(ordered[half:])


def _started_on(cores: set[int], start: Callable[[], T]) -> T:
    """Run `start()` with this process pinned to `cores`, and restore its own cores after.

    The processes it spawns, and all their threads, inherit `cores`.
    """
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        return start()
    finally:
        os.sched_setaffinity(0, own)


def _cores_of(pids: list[int]) -> list[int]:
    """The cores any thread of these processes may run on."""
    cores: set[int] = set()
    for pid in pids:
        for thread in psutil.Process(pid).threads():
            cores |= os.sched_getaffinity(thread.id)
    return sorted(cores)


def _throughputs(points: list[dict]) -> str:
    return ", ".join(f"{point['images_per_s']:.1f}" for point in points)


def gates(placed: dict[str, list[int]], server: set[int], client: set[int], runs: dict[str, list[dict]]) -> list[Gate]:
    errors = {name: [p["errors"] for p in points if p["errors"]] for name, points in runs.items()}
    return [
        Gate("tritonserver and its stubs ran on the server cores only",
             placed["tritonserver and stubs"] == sorted(server), f"{placed['tritonserver and stubs']}"),
        Gate("the facade ran on the other cores only", placed["facade"] == sorted(client), f"{placed['facade']}"),
        Gate("no call failed", not any(errors.values()), str({k: v for k, v in errors.items() if v} or "none")),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.split_cores",
        description="Facade vs Triton direct with tritonserver on its own cores and the facade and load generator on "
        "the others (the layout of a deployment with cores to spare), same load generator, interleaved rounds.",
        epilog="Example: python -m bench.studies.split_cores --model mobilenet_v3_small --concurrency 16 --rounds 3",
    )
    parser.add_argument("--model", default="mobilenet_v3_small")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per run; default: %(default)s")
    parser.add_argument("--rounds", type=int, default=3, help="direct + facade runs, interleaved; default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC time>-split")
    args = parser.parse_args(argv)

    server_cores, client_cores = split(os.sched_getaffinity(0))
    started = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or RESULTS / f"{started}-split"
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="tritonnx-split-"))
    stack = ServingStack(
        link_models(workdir / "repo", {args.model: REPOSITORY / args.model}),
        out,
        backend_dir=workdir / "backends",
        facade_args=["--default-model", args.model, "--health-interval", "30", "--max-in-flight", "1024"],
    )
    print(
        f"tritonserver on cores {sorted(server_cores)}, facade and load generator on {sorted(client_cores)}", flush=True
    )
    runs: dict[str, list[dict]] = {"Triton direct": [], "facade": []}
    own = os.sched_getaffinity(0)
    try:
        triton = _started_on(server_cores, stack.start_triton)
        facade = _started_on(client_cores, stack.start_facade)
        os.sched_setaffinity(0, client_cores)  # the load generator runs in this process
        # Where the processes really run (every thread of each): the layout, checked.
        placed = {
            "tritonserver and stubs": _cores_of([triton.pid, *(c.pid for c in psutil.Process(triton.pid).children())]),
            "facade": _cores_of([facade.pid]),
        }
        targets = {
            "Triton direct": lambda: KServeTarget(triton.grpc_url, args.model, 1),
            "facade": lambda: FacadeTarget(facade.grpc_url, args.model, 1),
        }
        for round_ in range(1, args.rounds + 1):
            for name, make_target in targets.items():
                result = loops.run(make_target(), args.concurrency, duration_s=args.duration, warmup_s=1.0)
                runs[name].append(result.as_dict())
                print(f"[round {round_}/{args.rounds}] {result.summary()}", flush=True)
    finally:
        os.sched_setaffinity(0, own)
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    median = {name: statistics.median(p["images_per_s"] for p in points) for name, points in runs.items()}
    p50 = {name: statistics.median(p["p50_ms"] for p in points) for name, points in runs.items()}
    ratio = median["facade"] / median["Triton direct"] if median["Triton direct"] else 0.0
    results = {
        "started": started,
        "model": args.model,
        "concurrency": args.concurrency,
        "server_cores": sorted(server_cores),
        "client_cores": sorted(client_cores),
        "placed": placed,
        "runs": runs,
        "median_images_per_s": median,
        "median_p50_ms": p50,
        "facade_vs_direct": round(ratio, 3),
    }
    judged = gates(placed, server_cores, client_cores, runs)
    write_json(out / "results.json", {**results, "gates": [asdict(g) for g in judged]})
    lines = [
        f"# Facade vs Triton direct on split cores, {started}",
        "",
        f"{args.model}, c={args.concurrency}. tritonserver and its stubs ran on cores {sorted(server_cores)}; the "
        f"facade and the load generator on {sorted(client_cores)}. {args.rounds} interleaved rounds of "
        f"{args.duration:g} s each, same load generator.",
        "",
        "| target | median img/s | median p50 ms | runs (img/s) |",
        "|---|---|---|---|",
        *(f"| {name} | {median[name]:.1f} | {p50[name]:.2f} | {_throughputs(runs[name])} |" for name in runs),
        "",
        f"facade / Triton direct: {ratio:.2f}x; p50 {p50['facade'] - p50['Triton direct']:+.2f} ms.",
        "",
        gates_section(judged),
    ]
    (out / "report.md").write_text("\n".join(lines))
    print(
        f"facade / Triton direct: {ratio:.2f}x, p50 {p50['facade'] - p50['Triton direct']:+.2f} ms; report: {out / 'report.md'}",
        flush=True,
    )
    return verdict(judged)


if __name__ == "__main__":
    sys.exit(main())
