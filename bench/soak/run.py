"""The soak's run on a started stack: streams opened and checked, capacities, then the paced load.

The publishes go through tritonnx.server.versions.publish as `tritonnx-models publish` does; the answers stay the
same, so the load's checks hold across the swap.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from bench.load.loops import OpenLoop, run_load
from bench.output import say
from bench.soak.judge import DOCUMENTED_REJECTIONS
from bench.soak.load import MAX_OUTSTANDING, Stream, split_rates, take_intervals, totals
from bench.soak.report import progress_line
from bench.usage import Watcher, gone
from tritonnx.client.model_control import ControlError, TritonControl
from tritonnx.server.process import ServerError, StopRequest
from tritonnx.server.versions import ModelFolder, VersionError, publish


@dataclass
class Published:
    """One publish: when (seconds into the paced load), which model, the version it became, how long it took."""

    t_s: float
    model: str
    version: int | None
    seconds: float
    error: str = ""
    serving: str = ""


class Publisher:
    """Publishes `models` in turn into `repository` (a scratch copy), each from `source`'s version 1."""

    def __init__(self, repository: Path, source: Path, models: Sequence[str], triton_url: str, admin_key: str) -> None:
        self.repository, self.source, self.models = repository, source, list(models)
        self.triton_url, self.admin_key = triton_url, admin_key
        self.done: list[Published] = []

    def next_model(self) -> str:
        return self.models[len(self.done) % len(self.models)]

    def publish_next(self, t_s: float) -> Published:
        """Publish the next model of the rotation (blocking: run it in a thread beside the load)."""
        model, started = self.next_model(), time.perf_counter()
        lines: list[str] = []
        try:
            with TritonControl(self.triton_url, self.admin_key) as control:
                onnx_file = self.source / model / "1" / "model.onnx"
                outcome = publish(ModelFolder.find(self.repository, model), onnx_file, control, log=lines.append)
            done = Published(t_s, model, outcome.version, time.perf_counter() - started, serving=outcome.serving)
        except (VersionError, ControlError, OSError) as error:
            done = Published(t_s, model, None, time.perf_counter() - started, error=f"{error} ({'; '.join(lines)})")
        self.done.append(done)
        return done


def _row(t_s: float, **columns: object) -> dict:
    """A sample row: seconds since the paced load started, the UTC clock, then the columns."""
    return {"t_s": t_s, "time": datetime.now(timezone.utc).strftime("%H:%M:%S"), **columns}


def incidents_now(watcher: Watcher, incidents: list[str]) -> None:
    """A server gone, or a stub gone that no publish replaced, into `incidents` (once each)."""
    servers = {"tritonserver": watcher.triton, "facade": watcher.facade, "supervisor": watcher.supervisor}
    found = [
        f"{label} exited during the run" for label, process in servers.items() if process is not None and gone(process)
    ]
    found += [f"stub process {label} is gone" for label in sorted(watcher.died())]
    incidents += [message for message in found if message not in incidents]


@dataclass
class Soak:
    """One soak on a started stack: its options, streams, watcher and publisher, and what it found so far."""

    args: argparse.Namespace
    streams: list[Stream]
    watcher: Watcher
    publisher: Publisher
    stop: StopRequest
    rows: list[dict]  # a sample every --interval
    results: dict
    incidents: list[str]  # a process that died, or was left behind


async def paced(soak: Soak) -> None:
    """Every stream's open loop, a publish every --publish-every and a sample row every --interval."""
    args, streams, watcher, publisher, rows = soak.args, soak.streams, soak.watcher, soak.publisher, soak.rows
    loops = [OpenLoop(s.target, s.rate, MAX_OUTSTANDING, max_calls=int(s.rate * args.duration) + 1) for s in streams]
    for s, loop in zip(streams, loops, strict=True):
        s.loop = loop
    begin = time.perf_counter()
    rows.append(_row(0.0, **await asyncio.to_thread(watcher.sample, 0.0)))
    say(progress_line(rows[-1]))
    running = asyncio.gather(*(loop.run(args.duration) for loop in loops))
    publishing: asyncio.Future | None = None
    due = args.publish_every
    previous, k = begin, 0
    while not running.done():
        k += 1
        wake = begin + k * args.interval
        while time.perf_counter() < wake and not running.done():
            if soak.stop.requested:
                for loop in loops:
                    loop.stop()
            elapsed = time.perf_counter() - begin
            if elapsed >= due and due < args.duration and publishing is None:
                say(f"publishing {publisher.next_model()} again as a new version ...")
                publishing = asyncio.ensure_future(asyncio.to_thread(publisher.publish_next, round(elapsed, 2)))
                due += args.publish_every
            if publishing is not None and publishing.done():
                done = publishing.result()
                outcome = f"version {done.version}, {done.serving}" if done.version else done.error
                say(f"  {done.model}: {outcome} ({done.seconds:.1f} s)")
                publishing = None
            await asyncio.sleep(min(0.2, max(0.0, wake - time.perf_counter())))
        now = time.perf_counter()
        if now - previous < args.interval / 2 and running.done():
            break  # the run ended just after the last sample: no half-empty interval
        intervals = take_intervals(streams, now - previous)
        sample = await asyncio.to_thread(watcher.sample, now - begin)
        rows.append(_row(round(now - begin, 2), **intervals, **sample))
        previous = now
        say(progress_line(rows[-1]))
        incidents_now(watcher, soak.incidents)
        if soak.incidents:
            for loop in loops:
                loop.stop()
    await running
    if publishing is not None:
        await publishing


async def load_phases(soak: Soak) -> None:
    """Open and check every stream, measure each one's capacity alone, then the paced load."""
    args, streams, stop, results = soak.args, soak.streams, soak.stop, soak.results
    try:
        for s in streams:
            await s.target.open(args.capacity_concurrency)
            await s.target.verify()
        for s in streams:
            if stop.requested:
                raise ServerError("interrupted while measuring capacity")
            concurrency, seconds = args.capacity_concurrency, args.capacity_seconds
            say(f"capacity of {s.label}: closed loop, {concurrency} concurrent, {seconds:.0f} s ...")
            s.capacity = capacity = await run_load(s.target, concurrency, seconds, min(2.0, seconds), verify=False)
            say(f"  {capacity.throughput_rps:.1f} req/s, p99 {capacity.p99_ms:.1f} ms, errors {capacity.errors}")
            if capacity.throughput_rps <= 0 or set(capacity.errors) - set(DOCUMENTED_REJECTIONS):
                raise ServerError(f"capacity of {s.label} failed: {capacity.requests} OK, {capacity.errors}")
        capacities = {s.label: s.capacity for s in streams if s.capacity}
        rates = split_rates([c.throughput_rps for c in capacities.values()], args.load_fraction)
        for s, rate in zip(streams, rates, strict=True):
            s.rate = rate
        results["capacities"] = {label: capacity.as_dict() for label, capacity in capacities.items()}
        # The load's totals are the paced load's; wrong answers of the capacity runs are kept apart.
        results["wrong_before_paced"] = {s.label: s.target.wrong for s in streams if s.target.wrong}
        for s in streams:
            s.target.wrong = 0
            s.target.versions.clear()
        say("offering " + ", ".join(f"{s.label} {s.rate:.1f}" for s in streams) + f" req/s for {args.duration:.0f} s")
        if stop.requested:
            raise ServerError("interrupted before the paced load")
        wall_before = time.perf_counter()
        await paced(soak)
        results["load_seconds"] = time.perf_counter() - wall_before
        results["totals"] = totals(streams, results["load_seconds"])
    finally:
        for s in streams:
            await s.target.close()
