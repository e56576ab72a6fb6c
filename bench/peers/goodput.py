"""Goodput at a latency objective, open loop (python -m bench.peers --open-loop): what each server sustains in time.

docs/benchmarks.md says how it is measured; goodput_report.py judges the records and writes the report.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.limit import measure_single_image
from bench.load.generators import GENERATORS, WRONG, Generator
from bench.load.offered import MAX_OUTSTANDING, summary
from bench.load.targets import Target
from bench.output import CORES, say
from bench.peers import servers
from bench.peers.servers import reference_outputs, sample_images, sample_sequences
from bench.usage import tree_cpu_seconds

OBJECTIVE_FACTOR = 5.0
# A served lone request of mobilenet_v3_small takes 3.5-4 ms (bench/reports/2026-11-26-lone-request): 5x its in-process
# 1.5 ms would leave every server without goodput. An interactive API's budget.
OBJECTIVE_FLOOR_MS = 25.0
STEPS = (0.25, 0.5, 0.7, 0.85, 1.0, 1.2, 1.5, 2.0)  # x the closed-loop capacity
LOW_STEPS = (0.125, 0.0625)  # offered in turn only while no step kept the objective: a goodput below 0.25x is found
REFINEMENTS = 2  # bisections between the goodput and the next rate above it (the grid's spacing is up to 1.4x)
OVERLOADS = (1.5, 2.0)  # x the goodput
MAX_ERROR_SHARE = 0.001
LAG_SHARE = 0.1  # a step whose generator lagged more (p99, share of the objective) measured the generator: not counted
CAPACITY_CONCURRENCY = 16
DEADLINE_S = 2.0  # every call's; past it the call counts as timed out
# Before each step the server must work off an earlier step's backlog (docs/benchmarks.md); a busy one keeps a core.
IDLE_CORES = 0.25
SETTLE_POLL_S = 0.2
SETTLE_MAX_S = 10.0
ServerCpu = Callable[[], float]  # CPU seconds the server's processes used so far


def objective_ms(single_p50_ms: float, factor: float = OBJECTIVE_FACTOR, floor_ms: float = OBJECTIVE_FLOOR_MS) -> float:
    return max(factor * single_p50_ms, floor_ms)


def lagged(step: dict, objective: float) -> bool:
    """The generator fell behind its schedule by more than LAG_SHARE of the objective: the step is not counted."""
    return step.get("lag_p99_ms", 0.0) > LAG_SHARE * objective


def within(step: dict, objective: float) -> bool:
    """Answers came, their p99 within the objective, few errors, and the generator kept its schedule."""
    kept = step["answered"] > 0 and step["p99_ms"] <= objective and step["error_share"] <= MAX_ERROR_SHARE
    return kept and not lagged(step, objective)


def goodput(steps: Sequence[dict], objective: float) -> float:
    """The highest rate of the steps that kept the objective, or 0."""
    return max((step["offered_rps"] for step in steps if within(step, objective)), default=0.0)


def single_request_ms(model: str, onnx_file: Path, seconds: float) -> tuple[float, float]:
    """In-process p50 and p99 ms of one request (an image, or the text samples' mixed lengths in turn)."""
    feeds = sample_sequences(10) if "text" in model else None
    return measure_single_image(onnx_file, threads=CORES, seconds=seconds, feeds=feeds)


async def settle(server_cpu: ServerCpu) -> float:
    """Wait until the server's processes are idle (under IDLE_CORES over a poll); the seconds waited."""
    started = time.monotonic()
    before = server_cpu()
    while time.monotonic() - started < SETTLE_MAX_S:
        await asyncio.sleep(SETTLE_POLL_S)
        now = server_cpu()
        if (now - before) / SETTLE_POLL_S < IDLE_CORES:
            break
        before = now
    return time.monotonic() - started


async def _capacity_and_steps(
    target: Target,
    args: argparse.Namespace,
    objective: float,
    server_cpu: ServerCpu,
    overloads: Sequence[float] = OVERLOADS,
    lone_seconds: float = 0.0,
    common_rps: float = 0.0,
) -> dict:
    """Measure in order: a lone request (`lone_seconds`, if any), capacity, steps, refinements, overloads, common rate."""
    generator: Generator = GENERATORS[args.generator]
    await target.open(MAX_OUTSTANDING)
    try:
        record: dict = {"generator": generator.name}
        if lone_seconds > 0:
            lone = await generator.keep(target, 1, lone_seconds, 0.5)
            record["lone"] = lone.as_dict()
            say(f"    lone request (c=1): p50 {lone.p50_ms:.2f} ms, p99 {lone.p99_ms:.2f} ms")
        closed = await generator.keep(target, CAPACITY_CONCURRENCY, args.capacity_seconds, 1.0)
        capacity = closed.throughput_rps
        say(f"    capacity at c={CAPACITY_CONCURRENCY}: {capacity:.1f} req/s (p99 {closed.p99_ms:.1f} ms)")
        record |= {"capacity": closed.as_dict(), "capacity_rps": capacity, "steps": [], "overloads": {}}
        if capacity <= 0:
            return {**record, "error": f"no capacity: errors {closed.errors}"}
        steps = record["steps"]
        for index, factor in enumerate((*STEPS, *LOW_STEPS)):
            if index >= len(STEPS) and goodput(steps, objective) > 0:
                break
            steps.append({"factor": factor, **await _step(target, capacity * factor, args, index, server_cpu)})
        await _refine(target, steps, capacity, objective, args, server_cpu)
        record["goodput_rps"] = good = goodput(steps, objective)
        say(f"    goodput {good:.1f} req/s (objective p99 <= {objective:.1f} ms)")
        for index, factor in enumerate(overloads if good > 0 else ()):
            record["overloads"][str(factor)] = await _step(target, good * factor, args, 100 + index, server_cpu)
        if common_rps > 0:
            record["common"] = await _step(target, common_rps, args, 300, server_cpu)
        return record
    finally:
        await target.close()


async def _refine(
    target: Target, steps: list[dict], capacity: float, objective: float, args: argparse.Namespace, cpu: ServerCpu
) -> None:
    """Halve the gap between the goodput and the next rate offered above it, REFINEMENTS times (steps appended)."""
    low = goodput(steps, objective)
    above = [step["offered_rps"] for step in steps if step["offered_rps"] > low]
    if low <= 0 or not above:
        return
    high = min(above)
    for index in range(REFINEMENTS):
        middle = (low + high) / 2
        step = await _step(target, middle, args, 200 + index, cpu)
        steps.append({"factor": round(middle / capacity, 3), **step})
        low, high = (middle, high) if within(step, objective) else (low, middle)


async def _step(target: Target, rate: float, args: argparse.Namespace, seed: int, server_cpu: ServerCpu) -> dict:
    """One offered rate once the server `settle`d, with the CPU seconds it and this generator used meanwhile."""
    settled = await settle(server_cpu)
    server_before = server_cpu()
    result, client_cpu_s = await GENERATORS[args.generator].offer(target, rate, args.step_seconds, seed)
    used = {"server_cpu_s": server_cpu() - server_before, "client_cpu_s": client_cpu_s, "settled_s": settled}
    say(f"    {summary(result)}; CPU server {used['server_cpu_s']:.2f} s, generator {used['client_cpu_s']:.2f} s")
    return {**result.as_dict(), **used}


def measure_open(
    server: servers.Server,
    model: str,
    onnx_file: Path,
    objective: float,
    args: argparse.Namespace,
    overloads: Sequence[float] = OVERLOADS,
    lone_seconds: float = 0.0,
    common_rps: float = 0.0,
) -> dict:
    """Capacity, the steps and the `overloads` of one server (`servers.measured`), every answer checked.

    `lone_seconds`: first a lone request's latency, a closed loop at c=1 for that long (the record's `lone`).
    `common_rps`: last, this rate (the record's `common`), offered to every server for CPU per request.
    """
    requests = sample_sequences(10) if "text" in model else sample_images()
    expected = reference_outputs(onnx_file, requests)

    def steps() -> dict:
        target = server.target(requests, expected)
        target.timeout_s = DEADLINE_S
        cpu = lambda: sum(tree_cpu_seconds(pid) for pid in server.pids)  # noqa: E731
        record = asyncio.run(_capacity_and_steps(target, args, objective, cpu, overloads, lone_seconds, common_rps))
        offered = [*record.get("steps", []), *record.get("overloads", {}).values(), record.get("common", {})]
        closed = [record.get("lone", {}), record.get("capacity", {})]
        wrong = sum(step.get("wrong", 0) for step in offered) + sum(c.get("errors", {}).get(WRONG, 0) for c in closed)
        return {**record, "wrong": wrong}

    return servers.measured(server, requests, expected, steps)


# Every server is offered this rate too, below every server's goodput, so that CPU per request compares like with like
# (at its own goodput the slower server pays its fixed costs over fewer calls).
COMMON_RPS = {"mobilenet_v3_small": 100.0, "text_classifier": 400.0, "resnet50": 6.0}


def figures(record: dict) -> dict:
    """One server's figures in one round: goodput, capacity at c=16, a lone request's p50."""
    if "goodput_rps" not in record:
        return {"error": record.get("error", "no goodput")}
    return {
        "goodput_rps": record["goodput_rps"],
        "capacity_rps": record["capacity_rps"],
        "lone_p50_ms": record.get("lone", {}).get("p50_ms", math.nan),
    }
