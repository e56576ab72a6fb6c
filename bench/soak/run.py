"""The soak's run on a started stack: streams opened and checked, capacities, the burst, then the paced load.

The paced load takes a sample every --interval and publishes a version every --publish-every.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import datetime, timezone

from bench.load.loops import OpenLoop
from bench.output import say
from bench.soak.judge import DOCUMENTED_REJECTIONS
from bench.soak.load import Stream, Totals, burst, close_all, measure, open_all, split_rates, take_intervals
from bench.soak.publish import Publisher
from bench.soak.report import progress_line
from bench.usage import Watcher, gone
from tritonnx.server.process import ServerError, StopRequest


def _row(t_s: float, **columns: object) -> dict:
    """A sample row: seconds since the paced load started, the UTC clock, then the columns."""
    return {"t_s": t_s, "time": datetime.now(timezone.utc).strftime("%H:%M:%S"), **columns}


def incidents_now(watcher: Watcher, incidents: list[str]) -> None:
    """A server gone, or a stub gone that no publish replaced, into `incidents` (once each)."""
    found = [
        f"{label} exited during the run"
        for label, process in (
            ("tritonserver", watcher.triton),
            ("facade", watcher.facade),
            ("supervisor", watcher.supervisor),
        )
        if process is not None and gone(process)
    ]
    found += [f"stub process {label} is gone" for label in sorted(watcher.died())]
    incidents += [message for message in found if message not in incidents]


async def paced(
    args: argparse.Namespace,
    streams: list[Stream],
    watcher: Watcher,
    publisher: Publisher,
    stop: StopRequest,
    rows: list[dict],
    incidents: list[str],
) -> None:
    """Every stream's open loop, a publish every --publish-every and a sample row every --interval."""
    for s in streams:
        s.loop = OpenLoop(s.target, s.rate, args.max_outstanding, max_calls=int(s.rate * args.duration) + 1)
    begin = time.perf_counter()
    rows.append(_row(0.0, **await asyncio.to_thread(watcher.sample, 0.0)))
    say(progress_line(rows[-1]))
    loops = asyncio.gather(*(s.loop.run(args.duration) for s in streams if s.loop is not None))
    publishing: asyncio.Future | None = None
    due = args.publish_every
    previous, k = begin, 0

    def halt() -> None:
        for s in streams:
            if s.loop is not None:
                s.loop.stop()

    while not loops.done():
        k += 1
        wake = begin + k * args.interval
        while time.perf_counter() < wake and not loops.done():
            if stop.requested:
                halt()
            elapsed = time.perf_counter() - begin
            if elapsed >= due and due < args.duration and publishing is None:
                say(f"publishing {publisher.next_model()} again as a new version ...")
                publishing = asyncio.ensure_future(asyncio.to_thread(publisher.publish_next, round(elapsed, 2)))
                due += args.publish_every
            if publishing is not None and publishing.done():
                done = publishing.result()
                say(
                    f"  {done.model}: {f'version {done.version}, {done.serving}' if done.version else done.error}"
                    f" ({done.seconds:.1f} s)"
                )
                publishing = None
            await asyncio.sleep(min(0.2, max(0.0, wake - time.perf_counter())))
        now = time.perf_counter()
        if now - previous < args.interval / 2 and loops.done():
            break  # the run ended just after the last sample: no half-empty interval
        intervals = take_intervals(streams, now - previous)
        sample = await asyncio.to_thread(watcher.sample, now - begin)
        rows.append(_row(round(now - begin, 2), **intervals, **sample))
        previous = now
        say(progress_line(rows[-1]))
        incidents_now(watcher, incidents)
        if incidents:
            halt()
    await loops
    if publishing is not None:
        await publishing


async def load_phases(
    args: argparse.Namespace,
    streams: list[Stream],
    watcher: Watcher,
    publisher: Publisher,
    stop: StopRequest,
    rows: list[dict],
    results: dict,
    incidents: list[str],
) -> None:
    """Open and check every stream, measure capacities (unless --rate), the burst, then the paced load."""
    try:
        await open_all(streams, args.capacity_concurrency)
        if args.rate:
            for s in streams:
                s.rate = args.rate
            say(f"offering {args.rate:.1f} req/s per stream (--rate; capacity not measured)")
        else:
            for s in streams:
                if stop.requested:
                    raise ServerError("interrupted while measuring capacity")
                say(
                    f"capacity of {s.label}: closed loop, {args.capacity_concurrency} concurrent, "
                    f"{args.capacity_seconds:.0f} s ..."
                )
                s.capacity = await measure(s, args.capacity_concurrency, args.capacity_seconds)
                say(f"  {s.capacity.summary()}")
                if s.capacity.throughput_rps <= 0 or set(s.capacity.errors) - set(DOCUMENTED_REJECTIONS):
                    raise ServerError(f"capacity of {s.label} failed: {s.capacity.requests} OK, {s.capacity.errors}")
            rates = split_rates([s.capacity.throughput_rps for s in streams if s.capacity], args.load_fraction)
            for s, rate in zip(streams, rates, strict=True):
                s.rate = rate
            results["capacities"] = {s.label: s.capacity.as_dict() for s in streams if s.capacity}
        if args.burst_seconds > 0 and not stop.requested:
            say(
                f"warm-up burst: every stream at once, {args.burst_concurrency} concurrent each, "
                f"{args.burst_seconds:.0f} s ..."
            )
            done = await burst(streams, args.burst_concurrency, args.burst_seconds)
            results["burst"] = [r.as_dict() for r in done]
            results["burst_failures"] = {
                f"{s.label} {status}": count
                for s, r in zip(streams, done, strict=True)
                for status, count in r.errors.items()
                if status not in DOCUMENTED_REJECTIONS
            }
        # The load's totals are the paced load's; wrong answers of the capacity runs and the burst are kept apart.
        results["wrong_before_paced"] = {s.label: s.target.wrong for s in streams if s.target.wrong}
        for s in streams:
            s.target.wrong = 0
            s.target.versions.clear()
        say("offering " + ", ".join(f"{s.label} {s.rate:.1f}" for s in streams) + f" req/s for {args.duration:.0f} s")
        if stop.requested:
            raise ServerError("interrupted before the paced load")
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        await paced(args, streams, watcher, publisher, stop, rows, incidents)
        results["load_seconds"] = time.perf_counter() - wall_before
        results["generator_cpu"] = (time.process_time() - cpu_before) / results["load_seconds"]
        results["totals"] = Totals.of(streams, results["load_seconds"]).as_dict()
    finally:
        await close_all(streams)
