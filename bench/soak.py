"""python -m bench.soak: a long run at a steady fraction of capacity, watching for leaks (make soak).

Starts tritonserver (the whole model repository, as `make serve`) and the facade on free loopback
ports, then:

1. measures capacity: a closed-loop run through the facade (bench.load) at a concurrency that
   saturates the server;
2. runs a short closed-loop burst at `--max-outstanding` concurrent calls, so that the arenas and
   buffers sized by the peak (the largest batches, the most requests in flight) grow now rather
   than during the fit window;
3. offers `--load-fraction` of the capacity as an OPEN-loop load for `--duration` seconds: calls
   start on a fixed schedule whatever the answers do, each with a deadline, with at most
   `--max-outstanding` calls in flight (a call due while that many are pending is skipped and
   counted, never queued);
4. every `--interval` seconds samples the RSS and PSS of the facade, of tritonserver and of each
   Python stub process (named by its model instance), the bytes of the /dev/shm files that belong
   to these processes (the stubs' regions, named on their command lines, the facade's
   tritonnx_facade_<pid>, and any other /dev/shm file they map), and the throughput, p50/p99 latency
   and errors of the interval (bench.usage);
5. fits each memory series over the second half of the run and flags a series that grows
   (bench.trend: least squares and Theil-Sen, both above `GROWTH_MIB_PER_10MIN` and
   `GROWTH_FRACTION` of its mean per 10 minutes);
6. stops the servers and checks that none of their /dev/shm files is left behind.

Writes <out>/{samples.csv,results.json,report.md,memory.png,latency.png,shm.png} and the server
logs under <out>/logs/. Exit code 0 when nothing was flagged; 1 when a memory or /dev/shm series
grew, a region was left behind, a server or stub process died or restarted, a call failed with a
status other than the documented rejections (RESOURCE_EXHAUSTED, UNAVAILABLE), or those
rejections exceeded `--max-rejected`; 2 when the servers could not be started or measured; 130
when interrupted (the report is written all the same).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from backend.server.process import ServerError, StopRequest
from backend.server.stack import ServingStack
from bench import REPOSITORY
from bench.load.loops import OpenLoop, run
from bench.load.stats import Tally, percentiles
from bench.load.targets import FacadeTarget, VerificationError
from bench.output import machine, run_folder, say, settings
from bench.soak_report import fmt, progress_line, series, series_name, write_outputs
from bench.trend import GROWTH_FRACTION, GROWTH_MIB_PER_10MIN, trend
from bench.usage import SERVERS, SHM_DIR, Watcher, gone

# Statuses the facade documents as load shedding (README, "The gRPC facade"): allowed, up to --max-rejected.
DOCUMENTED_REJECTIONS = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")
# p99 gets the same fit, reported as a warning only: on 2 shared cores it moves with the machine.
P99_GROWTH_MS_PER_10MIN = 5.0
P99_GROWTH_FRACTION = 0.5


def interval_row(tally: Tally, seconds: float) -> dict:
    ok, errors = tally.count(), tally.errors
    p50, p99 = percentiles(tally.ms(), [50, 99])
    return {
        "ok": ok,
        "rps": round(ok / seconds, 2) if seconds > 0 else 0.0,
        "p50_ms": round(p50, 3),
        "p99_ms": round(p99, 3),
        "errors": sum(errors.values()),
        "errors_by_status": " ".join(f"{k}:{v}" for k, v in errors.items()),
        "skipped": tally.skipped,
        "max_lag_ms": round(tally.max_lag * 1000, 2),
    }


def _row(t_s: float, **columns: object) -> dict:
    """A sample row: seconds since the paced load started, the UTC clock, then the columns."""
    return {"t_s": t_s, "time": datetime.now(timezone.utc).strftime("%H:%M:%S"), **columns}


async def soak(
    args: argparse.Namespace,
    watcher: Watcher,
    facade_url: str,
    rate: float,
    stop: StopRequest,
    rows: list[dict],
    failures: list[str],
) -> OpenLoop:
    """The paced load and, every --interval, one sample row; returns the load's totals."""
    target = FacadeTarget(facade_url, args.model, 1, raw=True, timeout_s=args.deadline)
    await target.open(args.max_outstanding)
    loop_ = OpenLoop(target, rate, args.max_outstanding, max_calls=int(rate * args.duration) + 1)
    try:
        await target.verify()
        begin = time.perf_counter()
        rows.append(_row(0.0, **await asyncio.to_thread(watcher.sample, 0.0)))
        stubs = sorted(
            k.split(".", 1)[1] for k in rows[-1] if k.startswith("rss_mib.") and k.split(".", 1)[1] not in SERVERS
        )
        say(progress_line(rows[-1], stubs))
        paced = asyncio.ensure_future(loop_.run(args.duration))
        previous = begin
        k = 0
        while not paced.done():
            k += 1
            wake = begin + k * args.interval
            while time.perf_counter() < wake and not paced.done():
                if stop.requested:
                    loop_.stop()
                await asyncio.sleep(min(0.2, max(0.0, wake - time.perf_counter())))
            now = time.perf_counter()
            if now - previous < args.interval / 2 and paced.done():
                break  # the run ended just after the last sample: no half-empty interval
            interval = interval_row(loop_.take(), now - previous)
            sample = await asyncio.to_thread(watcher.sample, now - begin)
            rows.append(_row(round(now - begin, 2), **interval, outstanding=loop_.outstanding, **sample))
            previous = now
            say(progress_line(rows[-1], stubs))
            for label, process in (("tritonserver", watcher.triton), ("facade", watcher.facade)):
                if gone(process):
                    failures.append(f"{label} exited during the run")
            for name in sorted(watcher.missing):
                message = f"stub process of {name} is gone"
                if message not in failures:
                    failures.append(message)
            if failures:
                loop_.stop()
        await paced
    finally:
        await target.close()
    return loop_


def judge(
    rows: list[dict],
    loop_: OpenLoop | None,
    args: argparse.Namespace,
    results: dict,
    failures: list[str],
    warnings: list[str],
) -> None:
    """Trends, error accounting and stub restarts into `results`, reasons into failures/warnings."""
    trends = []
    memory_keys: list[str] = []
    for row in rows:
        memory_keys += [k for k in row if k.startswith(("rss_mib.", "pss_mib.total")) and k not in memory_keys]
    for key in [*memory_keys, "shm_mib"]:
        t = trend(series_name(key), *series(rows, key))
        trends.append((key, t))
        if t.flagged:
            failures.append(
                f"{t.series} grows {t.growth_per_10min:.1f} MiB per 10 min (least squares; Theil-Sen "
                f"{t.robust_growth_per_10min:.1f}), {t.growth_fraction:.0%} of its mean"
            )
    for key in ("fds.facade", "fds.tritonserver", "threads.facade", "threads.tritonserver"):
        trends.append((key, trend(series_name(key), *series(rows, key), unit="count", abs_threshold=math.inf)))
    p99 = trend(
        "p99",
        *series(rows[1:], "p99_ms"),
        unit="ms",
        abs_threshold=P99_GROWTH_MS_PER_10MIN,
        fraction_threshold=P99_GROWTH_FRACTION,
    )
    trends.append(("p99_ms", p99))
    if p99.flagged:
        warnings.append(
            f"p99 rises {p99.growth_per_10min:.1f} ms per 10 min over the second half (Theil-Sen "
            f"{p99.robust_growth_per_10min:.1f})"
        )
    idle = results.get("idle_sample", {})
    results["trends"] = [{**t.as_dict(), "column": key, "idle": idle.get(key)} for key, t in trends]
    if loop_ is None:
        return
    total = loop_.total
    latencies = total.ms()
    (p50, p99_ms), load_seconds = percentiles(latencies, [50, 99]), results.get("load_seconds") or 0.0
    results["totals"] = {
        "scheduled": loop_.sent + total.skipped,
        "sent": loop_.sent,
        "ok": total.count(),
        "errors": total.errors,
        "skipped": total.skipped,
        "ok_rps": total.count() / load_seconds if load_seconds else math.nan,
        "p50_ms": p50,
        "p99_ms": p99_ms,
        "max_ms": float(latencies.max()) if len(latencies) else math.nan,
        "generator_cpu": results.get("generator_cpu", math.nan),
    }
    unexpected = {k: v for k, v in total.errors.items() if k not in DOCUMENTED_REJECTIONS}
    rejected = sum(v for k, v in total.errors.items() if k in DOCUMENTED_REJECTIONS)
    if unexpected:
        failures.append("calls failed: " + ", ".join(f"{k} {v}" for k, v in sorted(unexpected.items())))
    if loop_.sent and rejected / loop_.sent > args.max_rejected:
        failures.append(
            f"{rejected} documented rejections = {rejected / loop_.sent:.2%} of calls, above "
            f"--max-rejected {args.max_rejected:.2%}"
        )
    elif rejected:
        warnings.append(f"{rejected} documented rejections ({rejected / loop_.sent:.3%} of calls)")
    if total.skipped:
        warnings.append(f"{total.skipped} calls skipped: {args.max_outstanding} were outstanding when they were due")


def load_phases(
    args: argparse.Namespace,
    facade_url: str,
    watcher: Watcher,
    stop: StopRequest,
    rows: list[dict],
    results: dict,
    failures: list[str],
) -> OpenLoop:
    """Capacity (unless --rate), the warm-up burst, then the paced load with its samples."""
    if args.rate:
        rate = args.rate
        say(f"offering {rate:.1f} req/s (--rate; capacity not measured)")
    else:
        say(
            f"capacity: closed loop through the facade, {args.capacity_concurrency} concurrent, "
            f"{args.capacity_seconds:.0f} s ..."
        )
        capacity = run(
            FacadeTarget(facade_url, args.model, 1, raw=True),
            args.capacity_concurrency,
            duration_s=args.capacity_seconds,
            warmup_s=2.0,
        )
        results["capacity"] = capacity.as_dict()
        say(f"  {capacity.summary()}")
        if capacity.throughput_rps <= 0 or capacity.errors:
            raise ServerError(f"capacity run failed: {capacity.requests} OK, errors {capacity.errors}")
        rate = capacity.throughput_rps * args.load_fraction
    if args.burst_seconds > 0 and not stop.requested:
        # Every stub meets the largest batches and Triton and the facade their most requests in flight
        # now, so that arenas and buffers sized once by that peak do not read as growth later.
        say(f"warm-up burst: closed loop, {args.max_outstanding} concurrent, {args.burst_seconds:.0f} s ...")
        burst = run(
            FacadeTarget(facade_url, args.model, 1, raw=True, timeout_s=args.deadline),
            args.max_outstanding,
            duration_s=args.burst_seconds,
            warmup_s=0.0,
        )
        results["burst"] = burst.as_dict()
        say(f"  {burst.summary()}")
        unexpected = {k: v for k, v in burst.errors.items() if k not in DOCUMENTED_REJECTIONS}
        if unexpected:
            failures.append(f"warm-up burst calls failed: {unexpected}")
    say(
        f"offering {rate:.1f} req/s"
        + (f" ({args.load_fraction:.0%} of capacity)" if not args.rate else "")
        + f" open loop for {args.duration:.0f} s, a sample every {args.interval:.0f} s"
    )
    results["offered_rps"] = rate
    if stop.requested:
        raise ServerError("interrupted before the paced load")
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    loop_ = asyncio.run(soak(args, watcher, facade_url, rate, stop, rows, failures))
    results["load_seconds"] = time.perf_counter() - wall_before
    results["generator_cpu"] = (time.process_time() - cpu_before) / results["load_seconds"]
    return loop_


def check_shutdown(watcher: Watcher, results: dict, failures: list[str]) -> None:
    """After stop: no process of ours alive, no /dev/shm file of theirs left, no stub restarted."""
    deadline = time.monotonic() + 10  # our processes are gone within it, or the check says so
    while watcher.alive_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    lingering = watcher.alive_pids()
    if lingering:
        failures.append(f"processes still alive after stop: {lingering}")
    leftover = sorted(name for name in watcher.shm_names if (SHM_DIR / name).exists())
    results["shm_files_seen"] = sorted(watcher.shm_names)
    results["leftover_shm"] = leftover
    results["stub_pids"] = watcher.stub_pids
    if leftover:
        failures.append(f"{len(leftover)} /dev/shm file(s) left after shutdown: {', '.join(leftover)}")
    restarted = {name: pids for name, pids in watcher.stub_pids.items() if len(pids) > 1}
    if restarted:
        failures.append("stub processes restarted: " + ", ".join(f"{n} {p}" for n, p in sorted(restarted.items())))
    say(
        f"/dev/shm files of these processes: {len(watcher.shm_names)} seen, left after shutdown: "
        f"{', '.join(leftover) or 'none'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=(
            "Soak test: serve the model repository with tritonserver and the facade on free loopback ports, "
            "measure the facade's capacity with a short closed-loop run, then offer --load-fraction of it as a "
            "paced open-loop load for --duration seconds. Every --interval seconds it samples RSS/PSS of the "
            "facade, tritonserver and each Python stub, the /dev/shm files of these processes, and the "
            "interval's throughput, p50/p99 and errors. Afterwards it fits each memory series over the second "
            f"half of the run and flags growth above {GROWTH_MIB_PER_10MIN:.0f} MiB and {GROWTH_FRACTION:.0%} of "
            "the mean per 10 minutes, stops the servers and checks that no /dev/shm file of theirs is left."
        ),
        epilog=(
            "Writes samples.csv, results.json, report.md and memory.png, latency.png, shm.png (server logs in "
            "logs/). Exit code: 0 pass; 1 growth, leftover /dev/shm, a server or stub died, calls failed with a "
            "status other than RESOURCE_EXHAUSTED/UNAVAILABLE, or those exceeded --max-rejected; 2 servers could "
            "not start or be measured; 130 interrupted.  Example (a quick check): python -m bench.soak "
            "--duration 60 --interval 5"
        ),
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of paced load; default: %(default)s")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples; default: %(default)s")
    parser.add_argument("--model", default="mobilenet_v3_small", help="model to load; default: %(default)s")
    parser.add_argument(
        "--load-fraction", type=float, default=0.7, help="share of the measured capacity to offer; default: %(default)s"
    )
    parser.add_argument(
        "--rate", type=float, help="offer this many requests/s instead, and skip the capacity measurement"
    )
    parser.add_argument(
        "--capacity-concurrency",
        type=int,
        default=16,
        help="concurrency of the closed-loop capacity run; default: %(default)s",
    )
    parser.add_argument(
        "--capacity-seconds",
        type=float,
        default=15.0,
        help="measured seconds of the capacity run (after 2 s of warm-up); default: %(default)s",
    )
    parser.add_argument(
        "--burst-seconds",
        type=float,
        default=10.0,
        help="before the paced load, a closed-loop burst at --max-outstanding concurrent calls so "
        "that buffers sized by the peak are grown before the fit window (0: none); "
        "default: %(default)s",
    )
    parser.add_argument(
        "--deadline", type=float, default=10.0, help="deadline of every call, seconds; default: %(default)s"
    )
    parser.add_argument(
        "--max-outstanding",
        type=int,
        default=64,
        help="calls in flight at most; a call due beyond it is skipped and counted; default: %(default)s",
    )
    parser.add_argument(
        "--max-rejected",
        type=float,
        default=0.01,
        help="fail when RESOURCE_EXHAUSTED + UNAVAILABLE exceed this share of calls; default: %(default)s",
    )
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-soak/")
    args = parser.parse_args(argv)
    if not (
        args.duration > 0
        and args.interval > 0
        and 0 < args.load_fraction <= 1.5
        and args.deadline > 0
        and args.max_outstanding >= 1
        and args.capacity_concurrency >= 1
        and args.capacity_seconds > 0
        and args.burst_seconds >= 0
        and (args.rate is None or args.rate > 0)
    ):
        parser.error("durations, the interval, the deadline, --load-fraction (0-1.5) and the counts must be positive")
    if args.interval > args.duration:
        parser.error("--interval must not exceed --duration")
    if not (REPOSITORY / args.model / "1" / "model.onnx").exists():
        parser.error(f"{REPOSITORY / args.model / '1' / 'model.onnx'} is missing: run `make models`")

    started, out = run_folder(args.out, "soak")
    logs = out / "logs"
    results: dict = {
        "started": started,
        "command": " ".join(["python -m bench.soak", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine(),
        "settings": settings(args),
        "thresholds": {
            "growth_mib_per_10min": GROWTH_MIB_PER_10MIN,
            "growth_fraction": GROWTH_FRACTION,
            "p99_growth_ms_per_10min": P99_GROWTH_MS_PER_10MIN,
            "p99_growth_fraction": P99_GROWTH_FRACTION,
            "documented_rejections": list(DOCUMENTED_REJECTIONS),
        },
        "offered_rps": args.rate or math.nan,
    }
    rows: list[dict] = []
    failures: list[str] = []
    warnings: list[str] = []
    stop = StopRequest()
    loop_: OpenLoop | None = None
    watcher: Watcher | None = None
    setup_failed = False

    # Production defaults otherwise (--max-in-flight 64, a health probe every 2 s), the probe on this model.
    stack = ServingStack(REPOSITORY, logs, facade_args=["--default-model", args.model])
    say(f"starting tritonserver ({REPOSITORY}) and the facade; logs in {logs}")
    try:
        stack.start()
        triton, facade = stack.triton, stack.facade
        assert facade is not None  # started with the stack
        watcher = Watcher(triton.pid, facade.pid)
        results["idle_sample"] = watcher.sample(0.0)  # after start-up, before any load
        stubs = sorted(n for n in watcher.processes() if n not in SERVERS)
        say(
            f"tritonserver pid {triton.pid} ({triton.grpc_url}), facade pid {facade.pid} "
            f"({facade.grpc_url}), stubs: {', '.join(stubs)}"
        )
        if stop.requested:
            raise ServerError("interrupted before the load")
        loop_ = load_phases(args, facade.grpc_url, watcher, stop, rows, results, failures)
    except (ServerError, VerificationError) as error:
        say(f"error: {error}")
        failures.append(f"setup: {error}")
        setup_failed = True
    finally:
        say("stopping the facade, then tritonserver ...")
        results["exit_codes"] = stack.stop()
        say(
            f"  facade exit code {results['exit_codes']['facade']}, "
            f"tritonserver exit code {results['exit_codes']['tritonserver']}"
        )

    if watcher is not None:
        check_shutdown(watcher, results, failures)
    if rows:
        judge(rows, loop_, args, results, failures, warnings)
    interrupted = stop.requested
    if interrupted:
        failures.append("interrupted")
    results["failures"], results["warnings"] = failures, warnings
    results["verdict"] = "INTERRUPTED" if interrupted else "FAIL" if failures else "PASS"
    results["samples"] = rows
    write_outputs(out, results, rows)
    for t in results.get("trends", []):
        say(
            f"  {t['series']:<32} start {fmt(t['start']):>7} end {fmt(t['end']):>7} peak {fmt(t['peak']):>7} "
            f"{t['unit']:<5} growth/10 min: LSQ {fmt(t['growth_per_10min'], 1):>7} Theil-Sen "
            f"{fmt(t['robust_growth_per_10min'], 1):>7}{'  FLAGGED' if t['flagged'] else ''}"
        )
    for warning in warnings:
        say(f"warning: {warning}")
    say(f"verdict: {results['verdict']}" + (f" ({'; '.join(failures)})" if failures else ""))
    say(f"report: {out / 'report.md'}")
    if interrupted:
        return 130
    if setup_failed:
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
