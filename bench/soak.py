"""python -m bench.soak: a long run at a steady fraction of capacity, watching for leaks (make soak).

Starts tritonserver (the whole model repository, as `make serve`) and the facade on free loopback
ports, then:

1. measures capacity: a closed-loop run through the facade (bench/loadgen.py) at a concurrency
   that saturates the server;
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
   and errors of the interval;
5. fits each memory series over the second half of the run (the first half holds the warm-up:
   allocator arenas, caches, first batches of each size) with a least-squares line and with the
   Theil-Sen slope (the median of the pairwise slopes: one late step, e.g. an arena grown once for
   a batch size seen for the first time, barely moves it, steady growth moves it fully), and flags
   a series when both slopes, projected to 10 minutes, exceed BOTH `GROWTH_MIB_PER_10MIN` and
   `GROWTH_FRACTION` of its mean;
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
import csv
import json
import math
import os
import platform
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psutil

from backend.process import ServerError, StopRequest
from backend.tritonserver import PROJECT_ROOT, Ports, TritonServer, free_ports
from bench import loadgen
from client.serve import FacadeProcess

REPOSITORY = PROJECT_ROOT / "model_repository"
CORES = len(os.sched_getaffinity(0))
MIB = 2**20
SHM_DIR = Path("/dev/shm")
STUB_BINARY = "triton_python_backend_stub"
STUB_REGION_PREFIX = "triton_python_backend_shm_region_"
FACADE_REGION_PREFIX = "tritonnx_facade_"
# Statuses the facade documents as load shedding (README, "The gRPC facade"): allowed, up to --max-rejected.
DOCUMENTED_REJECTIONS = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")
# A memory series "grows" when both second-half slopes, projected to 10 minutes, exceed both.
GROWTH_MIB_PER_10MIN = 10.0
GROWTH_FRACTION = 0.05
# p99 gets the same fit, reported as a warning only: on 2 shared cores it moves with the machine.
P99_GROWTH_MS_PER_10MIN = 5.0
P99_GROWTH_FRACTION = 0.5
TEN_MINUTES = 600.0


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# Stub processes and their shared memory


def stub_region(cmdline: Sequence[str]) -> str | None:
    """The Python backend shared-memory region named on a stub's command line (its /dev/shm file)."""
    return next((arg for arg in cmdline if arg.startswith(STUB_REGION_PREFIX)), None)


def stub_instance_name(cmdline: Sequence[str]) -> str | None:
    """The model instance a Triton 2.51 Python stub serves, e.g. `mobilenet_v3_small_0_1`.

    The stub is started as `<stub> <model.py> <region> <shm default> <shm growth> <parent pid>
    <backend dir> <IPC control handle> <instance name> <runtime modifier>`: the name is the argument
    after the number that follows the backend directory. None when the line is not a stub's or has
    another layout.
    """
    if not cmdline or not Path(cmdline[0]).name == STUB_BINARY:
        return None
    region = stub_region(cmdline)
    if region is None:
        return None
    rest = list(cmdline[cmdline.index(region) + 1:])
    directory = next((i for i, arg in enumerate(rest) if "/" in arg), None)
    if directory is None or directory + 2 >= len(rest) or not rest[directory + 1].isdigit():
        return None
    name = rest[directory + 2]
    return name or None


def mapped_shm_files(pid: int) -> set[str]:
    """Names of the /dev/shm files a process has mapped (from /proc/<pid>/maps)."""
    names = set()
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                at = line.find(" /dev/shm/")
                if at >= 0:
                    name = line[at + len(" /dev/shm/"):].rstrip("\n")
                    names.add(name.removesuffix(" (deleted)"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return names


def shm_usage(names: set[str], directory: Path = SHM_DIR) -> tuple[int, int, int]:
    """(files present, bytes allocated, apparent bytes) of the named files in /dev/shm."""
    present = allocated = apparent = 0
    for name in names:
        try:
            stat = (directory / name).stat()
        except (FileNotFoundError, NotADirectoryError):
            continue
        present += 1
        allocated += stat.st_blocks * 512
        apparent += stat.st_size
    return present, allocated, apparent


# ---------------------------------------------------------------------------------------------
# Trend check


@dataclass
class Trend:
    series: str
    unit: str
    samples: int  # samples in the fit window (the second half of the run)
    start: float  # first sample of the whole run
    end: float  # last sample
    peak: float
    mean: float  # over the fit window
    growth_per_10min: float  # least-squares slope over the fit window x 600 s
    robust_growth_per_10min: float  # Theil-Sen slope (median of the pairwise slopes) x 600 s
    growth_fraction: float  # the smaller of the two growths / mean
    flagged: bool  # both growths above both thresholds
    note: str = ""

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in asdict(self).items()}


def least_squares_slope(times: Sequence[float], values: Sequence[float]) -> float:
    """Slope (value units per time unit) of the least-squares line; NaN for fewer than 2 distinct times."""
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    if len(t) < 2 or np.ptp(t) == 0:
        return math.nan
    t_mean = t.mean()
    return float(((t - t_mean) * (v - v.mean())).sum() / ((t - t_mean) ** 2).sum())


def theil_sen_slope(times: Sequence[float], values: Sequence[float]) -> float:
    """Median of the slopes between every pair of samples: a single step (a cache or arena filled
    once) moves it little, steady growth moves it as much as the least-squares line. NaN for fewer
    than 2 distinct times."""
    t = np.asarray(times, dtype=float)
    v = np.asarray(values, dtype=float)
    i, j = np.triu_indices(len(t), k=1)
    dt = t[j] - t[i]
    keep = dt != 0
    if not keep.any():
        return math.nan
    return float(np.median((v[j] - v[i])[keep] / dt[keep]))


def trend(series: str, times: Sequence[float], values: Sequence[float], *, unit: str = "MiB",
          abs_threshold: float = GROWTH_MIB_PER_10MIN, fraction_threshold: float = GROWTH_FRACTION,
          min_samples: int = 3) -> Trend:
    """Fit the second half of the run (samples at or after the midpoint of the first and last
    times) with least squares and with Theil-Sen; flag when both projected 10-minute growths
    exceed both thresholds (absolute, and as a fraction of the window's mean). NaN values (e.g. a
    sample of a process that was not there yet) are left out."""
    points = [(t, v) for t, v in zip(times, values) if v is not None and math.isfinite(v)]
    if not points:
        nan = math.nan
        return Trend(series, unit, 0, nan, nan, nan, nan, nan, nan, nan, False, "no samples")
    start, end = points[0][1], points[-1][1]
    peak = max(v for _, v in points)
    middle = (points[0][0] + points[-1][0]) / 2
    window_t = [t for t, _ in points if t >= middle]
    window_v = [v for t, v in points if t >= middle]
    mean = float(np.mean(window_v))
    if len(window_t) < min_samples:
        return Trend(series, unit, len(window_t), start, end, peak, mean, math.nan, math.nan, math.nan, False,
                     f"fewer than {min_samples} samples in the second half: not judged")
    growth = least_squares_slope(window_t, window_v) * TEN_MINUTES
    robust = theil_sen_slope(window_t, window_v) * TEN_MINUTES
    smaller = min(growth, robust)
    fraction = smaller / mean if mean else (math.inf if smaller > 0 else 0.0)
    over = [g > abs_threshold and (g / mean if mean else math.inf) > fraction_threshold for g in (growth, robust)]
    note = ""
    if over[0] and not over[1]:
        note = "least squares rises but the pairwise median does not: a step, not a steady trend"
    elif over[1] and not over[0]:
        note = "the pairwise median rises but least squares does not"
    return Trend(series, unit, len(window_t), start, end, peak, mean, growth, robust, fraction, all(over), note)


# ---------------------------------------------------------------------------------------------
# Open-loop load


@dataclass
class IntervalStats:
    """What the paced load saw since the last sample."""

    latencies: array = field(default_factory=lambda: array("d"))
    errors: dict[str, int] = field(default_factory=dict)
    skipped: int = 0  # calls due while --max-outstanding were pending: not sent
    max_lag: float = 0.0  # how late the generator started a call, at worst (seconds)


class OpenLoop:
    """Starts `target.call()` at a fixed rate from `start()` until `stop()`, the end time or
    `max_calls`, with at most `max_outstanding` in flight. Runs in the caller's event loop."""

    def __init__(self, target, rate: float, max_outstanding: int, max_calls: int) -> None:
        if rate <= 0 or max_outstanding < 1 or max_calls < 1:
            raise ValueError(f"rate, max_outstanding and max_calls must be positive: {rate}, {max_outstanding}, "
                             f"{max_calls}")
        self.target, self.rate, self.max_outstanding, self.max_calls = target, rate, max_outstanding, max_calls
        self.current = IntervalStats()
        self.all_latencies = array("d")
        self.errors: dict[str, int] = {}
        self.sent = self.ok = self.skipped = 0
        self.stopping = False
        self._pending: set[asyncio.Task] = set()

    def take(self) -> IntervalStats:
        taken, self.current = self.current, IntervalStats()
        return taken

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    async def _one(self) -> None:
        started = time.perf_counter()
        error = await self.target.call()
        if error is None:
            elapsed = time.perf_counter() - started
            self.ok += 1
            self.current.latencies.append(elapsed)
            self.all_latencies.append(elapsed)
        else:
            self.errors[error] = self.errors.get(error, 0) + 1
            self.current.errors[error] = self.current.errors.get(error, 0) + 1

    async def run(self, duration: float) -> None:
        perf = time.perf_counter
        period = 1.0 / self.rate
        begin = perf()
        end = begin + duration
        due = begin
        scheduled = 0
        while not self.stopping and scheduled < self.max_calls:
            now = perf()
            if now >= end:
                break
            if due > now:
                await asyncio.sleep(due - now)
                continue
            lag = now - due
            if lag > self.current.max_lag:
                self.current.max_lag = lag
            scheduled += 1
            due = begin + scheduled * period
            if len(self._pending) >= self.max_outstanding:
                self.skipped += 1
                self.current.skipped += 1
                continue
            self.sent += 1
            task = asyncio.ensure_future(self._one())
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        # Calls in flight finish within their own deadline; the margin only guards against a hang.
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=self.target.timeout_s + 10)
        for task in list(self._pending):
            task.cancel()

    def stop(self) -> None:
        self.stopping = True


# ---------------------------------------------------------------------------------------------
# Sampling the servers


class Watcher:
    """Finds the facade, tritonserver and its stubs; samples their memory and /dev/shm files."""

    def __init__(self, triton_pid: int, facade_pid: int) -> None:
        self.triton_pid, self.facade_pid = triton_pid, facade_pid
        self.triton = psutil.Process(triton_pid)
        self.facade = psutil.Process(facade_pid)
        self.shm_names: set[str] = {f"{FACADE_REGION_PREFIX}{facade_pid}"}
        self.stub_pids: dict[str, list[int]] = {}  # instance -> every pid seen, in order
        self.all_pids: set[int] = {triton_pid, facade_pid}
        self.missing: set[str] = set()  # stub instances seen once and absent from the last sample
        self._cpu: dict[str, float] = {}
        self._previous_elapsed: float | None = None

    def processes(self) -> dict[str, psutil.Process]:
        found = {"facade": self.facade, "tritonserver": self.triton}
        try:
            children = self.triton.children()
        except psutil.NoSuchProcess:
            children = []
        stubs = []
        for child in children:
            try:
                cmdline = child.cmdline()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            name = stub_instance_name(cmdline)
            if name is not None:
                stubs.append((name, cmdline, child))
        for name, cmdline, child in sorted(stubs, key=lambda stub: stub[0]):
            region = stub_region(cmdline)
            if region:
                self.shm_names.add(region)
            pids = self.stub_pids.setdefault(name, [])
            if not pids or pids[-1] != child.pid:
                pids.append(child.pid)
            self.all_pids.add(child.pid)
            found[name] = child
        self.missing = set(self.stub_pids) - set(found)
        return found

    def sample(self, elapsed: float) -> dict:
        row: dict = {}
        pss_total = 0.0
        processes = self.processes()
        for label, process in processes.items():
            try:
                with process.oneshot():
                    info = process.memory_full_info()
                    cpu = process.cpu_times()
                    if label in ("facade", "tritonserver"):
                        row[f"fds.{label}"] = process.num_fds()
                        row[f"threads.{label}"] = process.num_threads()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            row[f"rss_mib.{label}"] = round(info.rss / MIB, 2)
            row[f"pss_mib.{label}"] = round(info.pss / MIB, 2)
            pss_total += info.pss / MIB
            seconds = cpu.user + cpu.system
            if label in self._cpu and self._previous_elapsed is not None and elapsed > self._previous_elapsed:
                row[f"cpu.{label}"] = round((seconds - self._cpu[label]) / (elapsed - self._previous_elapsed), 3)
            self._cpu[label] = seconds
            self.shm_names |= mapped_shm_files(process.pid)
        self._previous_elapsed = elapsed
        row["pss_mib.total"] = round(pss_total, 2)
        present, allocated, apparent = shm_usage(self.shm_names)
        row["shm_files"] = present
        row["shm_mib"] = round(allocated / MIB, 3)
        row["shm_size_mib"] = round(apparent / MIB, 3)
        return row

    def alive_pids(self) -> list[int]:
        alive = []
        for pid in sorted(self.all_pids):
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive


# ---------------------------------------------------------------------------------------------
# The run


def interval_row(stats: IntervalStats, seconds: float) -> dict:
    ok = len(stats.latencies)
    row = {
        "ok": ok, "rps": round(ok / seconds, 2) if seconds > 0 else 0.0,
        "p50_ms": math.nan, "p99_ms": math.nan,
        "errors": sum(stats.errors.values()),
        "errors_by_status": " ".join(f"{k}:{v}" for k, v in sorted(stats.errors.items())),
        "skipped": stats.skipped, "max_lag_ms": round(stats.max_lag * 1000, 2),
    }
    if ok:
        p50, p99 = np.percentile(np.frombuffer(stats.latencies, dtype=np.float64) * 1000.0, [50, 99])
        row["p50_ms"], row["p99_ms"] = round(float(p50), 3), round(float(p99), 3)
    return row


def progress_line(row: dict, stubs: list[str]) -> str:
    stub_rss = "/".join(f"{row.get(f'rss_mib.{s}', math.nan):.0f}" for s in stubs)
    errors = row.get("errors_by_status") or "0"
    return (
        f"t={row['t_s']:6.0f}s  {row.get('rps', 0):6.1f} req/s  p50 {row.get('p50_ms', math.nan):6.1f}  "
        f"p99 {row.get('p99_ms', math.nan):6.1f} ms  errors {errors}  skipped {row.get('skipped', 0)}  | RSS MiB "
        f"facade {row.get('rss_mib.facade', math.nan):.0f}  triton {row.get('rss_mib.tritonserver', math.nan):.0f}  "
        f"stubs {stub_rss}  PSS total {row.get('pss_mib.total', math.nan):.0f}  | /dev/shm {row['shm_mib']:.1f} MiB "
        f"in {row['shm_files']} files"
    )


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def soak(args, watcher: Watcher, facade_url: str, rate: float, stop: StopRequest, rows: list[dict],
               failures: list[str]) -> OpenLoop:
    """The paced load and, every --interval, one sample row; returns the load's totals."""
    target = loadgen.FacadeTarget(facade_url, args.model, 1, raw=True, timeout_s=args.deadline)
    await target.open(args.max_outstanding)
    loop_ = OpenLoop(target, rate, args.max_outstanding, max_calls=int(rate * args.duration) + 1)
    try:
        await target.verify()
        begin = time.perf_counter()
        row = {"t_s": 0.0, "time": datetime.now(timezone.utc).strftime("%H:%M:%S"),
               **await asyncio.to_thread(watcher.sample, 0.0)}
        rows.append(row)
        stubs = sorted(k.split(".", 1)[1] for k in row if k.startswith("rss_mib.") and k.split(".", 1)[1]
                       not in ("facade", "tritonserver"))
        say(progress_line(row, stubs))
        load = asyncio.ensure_future(loop_.run(args.duration))
        previous = begin
        k = 0
        while not load.done():
            k += 1
            wake = begin + k * args.interval
            while time.perf_counter() < wake and not load.done():
                if stop.requested:
                    loop_.stop()
                await asyncio.sleep(min(0.2, max(0.0, wake - time.perf_counter())))
            now = time.perf_counter()
            if now - previous < args.interval / 2 and load.done():
                break  # the run ended just after the last sample: no half-empty interval
            stats = loop_.take()
            row = {"t_s": round(now - begin, 2), "time": datetime.now(timezone.utc).strftime("%H:%M:%S"),
                   **interval_row(stats, now - previous), "outstanding": loop_.outstanding,
                   **await asyncio.to_thread(watcher.sample, now - begin)}
            previous = now
            rows.append(row)
            say(progress_line(row, stubs))
            for label, process in (("tritonserver", watcher.triton), ("facade", watcher.facade)):
                if _gone(process):
                    failures.append(f"{label} exited during the run")
            for name in sorted(watcher.missing):
                message = f"stub process of {name} is gone"
                if message not in failures:
                    failures.append(message)
            if failures:
                loop_.stop()
        await load
    finally:
        await target.close()
    return loop_


def write_outputs(out: Path, results: dict, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    with open(out / "samples.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    if rows:
        plot(out, rows, results)
    (out / "report.md").write_text(report(results, rows))


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    times = [row["t_s"] for row in rows if key in row and row[key] != ""]
    values = [float(row[key]) for row in rows if key in row and row[key] != ""]
    return times, values


def plot(out: Path, rows: list[dict], results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    title = f"{results['settings']['model']} soak at {results['offered_rps']:.0f} req/s"
    figure, (axis, total) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, height_ratios=(3, 1))
    labels = []
    for row in rows:
        labels += [k.split(".", 1)[1] for k in row if k.startswith("rss_mib.") and k.split(".", 1)[1] not in labels]
    for label in labels:
        axis.plot(*_series(rows, f"rss_mib.{label}"), marker=".", label=label)
    axis.set(ylabel="RSS MiB", title=f"{title}: memory of each process")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    total.plot(*_series(rows, "pss_mib.total"), color="black", marker=".", label="PSS, all processes")
    total.set(xlabel="seconds since the paced load started", ylabel="PSS total MiB")
    total.grid(alpha=0.3)
    total.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(out / "memory.png", dpi=110)
    plt.close(figure)

    load_rows = rows[1:]
    figure, axis = plt.subplots(figsize=(9, 5))
    axis.plot(*_series(load_rows, "p50_ms"), marker=".", label="p50")
    axis.plot(*_series(load_rows, "p99_ms"), marker=".", label="p99")
    axis.set(xlabel="seconds since the paced load started", ylabel="latency ms (per interval)",
             title=f"{title}: latency and throughput")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    right = axis.twinx()
    right.plot(*_series(load_rows, "rps"), color="grey", linestyle=":", label="throughput (OK req/s)")
    right.set(ylabel="OK requests / s")
    right.set_ylim(bottom=0)
    handles = axis.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    axis.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(out / "latency.png", dpi=110)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(9, 4))
    axis.plot(*_series(rows, "shm_mib"), marker=".", label="allocated")
    axis.plot(*_series(rows, "shm_size_mib"), linestyle="--", label="file sizes")
    axis.set(xlabel="seconds since the paced load started", ylabel="MiB",
             title=f"{title}: /dev/shm files of these servers")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "shm.png", dpi=110)
    plt.close(figure)


def _fmt(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def report(results: dict, rows: list[dict]) -> str:
    s = results["settings"]
    lines = [
        f"# tritonnx soak {results['started']}",
        "",
        f"Machine: {results['machine']}. Command: `{results['command']}`.",
        "",
        f"**Verdict: {results['verdict']}**" + (": " + "; ".join(results["failures"]) if results["failures"] else ""),
        "",
    ]
    if results.get("warnings"):
        lines += ["Warnings: " + "; ".join(results["warnings"]), ""]
    capacity = results.get("capacity")
    if capacity:
        lines += [
            f"Capacity through the facade (closed loop, {capacity['concurrency']} concurrent, "
            f"{capacity['seconds']:.0f} s): {capacity['throughput_rps']:.1f} req/s, p50 {capacity['p50_ms']:.1f} ms, "
            f"p99 {capacity['p99_ms']:.1f} ms, errors {capacity['errors'] or 'none'}. "
            f"Offered: {results['offered_rps']:.1f} req/s "
            f"({s['load_fraction']:.0%}) open loop for {_fmt(results.get('load_seconds'), 0)} s, each call with a "
            f"{s['deadline']:.0f} s deadline, at most {s['max_outstanding']} outstanding.",
            "",
        ]
    burst = results.get("burst")
    if burst:
        lines += [
            f"Warm-up burst before it (closed loop, {burst['concurrency']} concurrent, {burst['seconds']:.0f} s): "
            f"{burst['throughput_rps']:.1f} req/s, p99 {burst['p99_ms']:.1f} ms, errors {burst['errors'] or 'none'}.",
            "",
        ]
    totals = results.get("totals")
    if totals:
        errors = ", ".join(f"{k} {v}" for k, v in sorted(totals["errors"].items())) or "none"
        lines += [
            f"Calls: {totals['scheduled']} scheduled, {totals['sent']} sent, {totals['ok']} OK, errors by status: "
            f"{errors}; {totals['skipped']} skipped at the outstanding cap. Whole-run latency of OK calls: p50 "
            f"{_fmt(totals['p50_ms'], 2)} ms, p99 {_fmt(totals['p99_ms'], 2)} ms, max {_fmt(totals['max_ms'], 1)} ms. "
            f"Achieved {_fmt(totals['ok_rps'])} OK req/s. Generator CPU {_fmt(totals['generator_cpu'], 2)} of a "
            "core.",
            "",
        ]
    lines += [
        "Growth check: the second half of the run is fitted with a least-squares line and with the Theil-Sen "
        "slope (median of the pairwise slopes, which one step such as an arena filled once barely moves), both "
        f"projected to 10 minutes; a memory series is flagged when BOTH grow more than {GROWTH_MIB_PER_10MIN:.0f} "
        f"MiB AND more than {GROWTH_FRACTION:.0%} of its mean per 10 minutes (p99: a warning above "
        f"{P99_GROWTH_MS_PER_10MIN:.0f} ms and {P99_GROWTH_FRACTION:.0%}; fds and threads: reported only). Short "
        "runs project a short window to 10 minutes: read their slopes as noise. PSS splits shared pages among "
        "every process mapping the same files, other servers on the machine included, so it also moves when "
        "those start or stop; RSS is the per-process signal.",
        "",
        "`idle` is after start-up, before any load; `start` is the first sample of the paced load (after the "
        "capacity run and the burst).",
        "",
        "| series | idle | start | end | peak | 2nd-half mean | growth / 10 min: least squares | Theil-Sen "
        "| % of mean | flagged |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in results.get("trends", []):
        fraction = t["growth_fraction"]
        lines.append(
            f"| {t['series']} ({t['unit']}) | {_fmt(t.get('idle'))} | {_fmt(t['start'])} | {_fmt(t['end'])} | "
            f"{_fmt(t['peak'])} | "
            f"{_fmt(t['mean'])} | {_fmt(t['growth_per_10min'], 2)} | {_fmt(t['robust_growth_per_10min'], 2)} | "
            f"{_fmt(fraction * 100 if isinstance(fraction, float) else None, 1)} | "
            f"{'**yes**' if t['flagged'] else 'no'}{' (' + t['note'] + ')' if t.get('note') else ''} |"
        )
    leftover = results.get("leftover_shm")
    lines += [
        "",
        f"/dev/shm files of these processes seen during the run: {len(results.get('shm_files_seen', []))}; "
        + ("left after shutdown: **" + ", ".join(leftover) + "**" if leftover else
           "none left after shutdown" if leftover is not None else "not checked (run did not get that far)")
        + ".",
        "",
        "Stub processes: " + (", ".join(f"{name} pid {'→'.join(map(str, pids))}" for name, pids in
                                        sorted(results.get("stub_pids", {}).items())) or "none seen"),
        "",
        "## Samples",
        "",
        "| t s | OK req/s | p50 ms | p99 ms | errors | skipped | RSS facade | RSS triton | PSS total | /dev/shm MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['t_s']:.0f} | {_fmt(row.get('rps'))} | {_fmt(row.get('p50_ms'), 2)} | "
            f"{_fmt(row.get('p99_ms'), 2)} | "
            f"{row.get('errors_by_status') or row.get('errors', '')} | {row.get('skipped', '')} | "
            f"{_fmt(row.get('rss_mib.facade'))} | {_fmt(row.get('rss_mib.tritonserver'))} | "
            f"{_fmt(row.get('pss_mib.total'))} | {_fmt(row.get('shm_mib'), 2)} |"
        )
    lines += ["", "![memory](memory.png)", "", "![latency](latency.png)", "", "![shm](shm.png)", ""]
    return "\n".join(lines)


def series_name(column: str) -> str:
    """`rss_mib.facade` -> `RSS facade`, `shm_mib` -> `/dev/shm`."""
    if column == "shm_mib":
        return "/dev/shm allocated"
    kind, _, label = column.partition(".")
    kind = {"rss_mib": "RSS", "pss_mib": "PSS", "fds": "open fds", "threads": "threads"}.get(kind, kind)
    return f"{kind} {label}".strip()


def judge(rows: list[dict], loop_: OpenLoop | None, args, results: dict, failures: list[str],
          warnings: list[str]) -> None:
    """Trends, error accounting and stub restarts into `results`, reasons into failures/warnings."""
    trends: list[tuple[str, Trend]] = []
    memory_keys = []
    for row in rows:
        memory_keys += [k for k in row if k.startswith(("rss_mib.", "pss_mib.total")) and k not in memory_keys]
    for key in [*memory_keys, "shm_mib"]:
        t = trend(series_name(key), *_series(rows, key))
        trends.append((key, t))
        if t.flagged:
            failures.append(f"{t.series} grows {t.growth_per_10min:.1f} MiB per 10 min (least squares; Theil-Sen "
                            f"{t.robust_growth_per_10min:.1f}), {t.growth_fraction:.0%} of its mean")
    for key in ("fds.facade", "fds.tritonserver", "threads.facade", "threads.tritonserver"):
        t = trend(series_name(key), *_series(rows, key), unit="count", abs_threshold=math.inf)
        trends.append((key, t))
    load_rows = rows[1:]
    p99 = trend("p99", *_series(load_rows, "p99_ms"), unit="ms", abs_threshold=P99_GROWTH_MS_PER_10MIN,
                fraction_threshold=P99_GROWTH_FRACTION)
    trends.append(("p99_ms", p99))
    if p99.flagged:
        warnings.append(f"p99 rises {p99.growth_per_10min:.1f} ms per 10 min over the second half (Theil-Sen "
                        f"{p99.robust_growth_per_10min:.1f})")
    idle = results.get("idle_sample", {})
    results["trends"] = [{**t.as_dict(), "column": key, "idle": idle.get(key)} for key, t in trends]
    if loop_ is None:
        return
    latencies = np.frombuffer(loop_.all_latencies, dtype=np.float64) * 1000.0 if loop_.ok else None
    load_seconds = results.get("load_seconds") or 0.0
    results["totals"] = {
        "scheduled": loop_.sent + loop_.skipped, "sent": loop_.sent, "ok": loop_.ok,
        "errors": dict(sorted(loop_.errors.items())), "skipped": loop_.skipped,
        "ok_rps": loop_.ok / load_seconds if load_seconds else math.nan,
        "p50_ms": float(np.percentile(latencies, 50)) if latencies is not None else math.nan,
        "p99_ms": float(np.percentile(latencies, 99)) if latencies is not None else math.nan,
        "max_ms": float(latencies.max()) if latencies is not None else math.nan,
        "generator_cpu": results.get("generator_cpu", math.nan),
    }
    unexpected = {k: v for k, v in loop_.errors.items() if k not in DOCUMENTED_REJECTIONS}
    rejected = sum(v for k, v in loop_.errors.items() if k in DOCUMENTED_REJECTIONS)
    if unexpected:
        failures.append("calls failed: " + ", ".join(f"{k} {v}" for k, v in sorted(unexpected.items())))
    if loop_.sent and rejected / loop_.sent > args.max_rejected:
        failures.append(f"{rejected} documented rejections = {rejected / loop_.sent:.2%} of calls, above "
                        f"--max-rejected {args.max_rejected:.2%}")
    elif rejected:
        warnings.append(f"{rejected} documented rejections ({rejected / loop_.sent:.3%} of calls)")
    if loop_.skipped:
        warnings.append(f"{loop_.skipped} calls skipped: {args.max_outstanding} were outstanding when they were due")


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
    parser.add_argument("--load-fraction", type=float, default=0.7,
                        help="share of the measured capacity to offer; default: %(default)s")
    parser.add_argument("--rate", type=float,
                        help="offer this many requests/s instead, and skip the capacity measurement")
    parser.add_argument("--capacity-concurrency", type=int, default=16,
                        help="concurrency of the closed-loop capacity run; default: %(default)s")
    parser.add_argument("--capacity-seconds", type=float, default=15.0,
                        help="measured seconds of the capacity run (after 2 s of warm-up); default: %(default)s")
    parser.add_argument("--burst-seconds", type=float, default=10.0,
                        help="before the paced load, a closed-loop burst at --max-outstanding concurrent calls so "
                        "that buffers sized by the peak are grown before the fit window (0: none); "
                        "default: %(default)s")
    parser.add_argument("--deadline", type=float, default=10.0,
                        help="deadline of every call, seconds; default: %(default)s")
    parser.add_argument("--max-outstanding", type=int, default=64,
                        help="calls in flight at most; a call due beyond it is skipped and counted; "
                        "default: %(default)s")
    parser.add_argument("--max-rejected", type=float, default=0.01,
                        help="fail when RESOURCE_EXHAUSTED + UNAVAILABLE exceed this share of calls; "
                        "default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-soak/")
    args = parser.parse_args(argv)
    if not (args.duration > 0 and args.interval > 0 and 0 < args.load_fraction <= 1.5 and args.deadline > 0
            and args.max_outstanding >= 1 and args.capacity_concurrency >= 1 and args.capacity_seconds > 0
            and args.burst_seconds >= 0 and (args.rate is None or args.rate > 0)):
        parser.error("durations, the interval, the deadline, --load-fraction (0-1.5) and the counts must be positive")
    if args.interval > args.duration:
        parser.error("--interval must not exceed --duration")
    if not (REPOSITORY / args.model / "1" / "model.onnx").exists():
        parser.error(f"{REPOSITORY / args.model / '1' / 'model.onnx'} is missing: run `make models`")

    started = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or PROJECT_ROOT / "bench" / "results" / f"{started}-soak"
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "started": started,
        "command": " ".join(["python -m bench.soak", *(sys.argv[1:] if argv is None else argv)]),
        "machine": f"{platform.machine()}, {CORES} cores, {platform.platform()}, Python {platform.python_version()}",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "thresholds": {"growth_mib_per_10min": GROWTH_MIB_PER_10MIN, "growth_fraction": GROWTH_FRACTION,
                       "p99_growth_ms_per_10min": P99_GROWTH_MS_PER_10MIN, "p99_growth_fraction": P99_GROWTH_FRACTION,
                       "documented_rejections": list(DOCUMENTED_REJECTIONS)},
        "offered_rps": args.rate or math.nan,
    }
    rows: list[dict] = []
    failures: list[str] = []
    warnings: list[str] = []
    stop = StopRequest()
    loop_: OpenLoop | None = None
    watcher: Watcher | None = None
    setup_failed = False

    triton = TritonServer(model_repository=REPOSITORY, ports=Ports(*free_ports(3)), backend_dir=logs / "backends",
                          log_file=logs / "tritonserver.log")
    grpc_port, http_port = free_ports(2)
    facade = FacadeProcess(
        grpc_port=grpc_port, http_port=http_port, triton_url=triton.grpc_url, log_file=logs / "facade.log",
        admin_key=triton.admin_key,
        # Production defaults otherwise (--max-in-flight 64, a health probe every 2 s), the probe on this model.
        extra_args=["--default-model", args.model],
    )
    say(f"starting tritonserver ({REPOSITORY}) and the facade; logs in {logs}")
    try:
        triton.start()
        triton.wait_ready(180)
        facade.start()
        facade.wait_ready(120)
        watcher = Watcher(triton.process.pid, facade.process.pid)
        results["idle_sample"] = watcher.sample(0.0)  # after start-up, before any load
        stubs = sorted(n for n in watcher.processes() if n not in ("facade", "tritonserver"))
        say(f"tritonserver pid {triton.process.pid} ({triton.grpc_url}), facade pid {facade.process.pid} "
            f"({facade.grpc_url}), stubs: {', '.join(stubs)}")
        if stop.requested:
            raise ServerError("interrupted before the load")
        if args.rate:
            rate = args.rate
            say(f"offering {rate:.1f} req/s (--rate; capacity not measured)")
        else:
            say(f"capacity: closed loop through the facade, {args.capacity_concurrency} concurrent, "
                f"{args.capacity_seconds:.0f} s ...")
            capacity = loadgen.run(loadgen.FacadeTarget(facade.grpc_url, args.model, 1, raw=True),
                                   args.capacity_concurrency, duration_s=args.capacity_seconds, warmup_s=2.0)
            results["capacity"] = capacity.as_dict()
            say(f"  {capacity.summary()}")
            if capacity.throughput_rps <= 0 or capacity.errors:
                raise ServerError(f"capacity run failed: {capacity.requests} OK, errors {capacity.errors}")
            rate = capacity.throughput_rps * args.load_fraction
        if args.burst_seconds > 0 and not stop.requested:
            # Every stub meets the largest batches and Triton and the facade their most requests in flight
            # now, so that arenas and buffers sized once by that peak do not read as growth later.
            say(f"warm-up burst: closed loop, {args.max_outstanding} concurrent, {args.burst_seconds:.0f} s ...")
            burst = loadgen.run(loadgen.FacadeTarget(facade.grpc_url, args.model, 1, raw=True, timeout_s=args.deadline),
                                args.max_outstanding, duration_s=args.burst_seconds, warmup_s=0.0)
            results["burst"] = burst.as_dict()
            say(f"  {burst.summary()}")
            unexpected = {k: v for k, v in burst.errors.items() if k not in DOCUMENTED_REJECTIONS}
            if unexpected:
                failures.append(f"warm-up burst calls failed: {unexpected}")
        say(f"offering {rate:.1f} req/s" + (f" ({args.load_fraction:.0%} of capacity)" if not args.rate else "")
            + f" open loop for {args.duration:.0f} s, a sample every {args.interval:.0f} s")
        results["offered_rps"] = rate
        if stop.requested:
            raise ServerError("interrupted before the paced load")
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        loop_ = asyncio.run(soak(args, watcher, facade.grpc_url, rate, stop, rows, failures))
        results["load_seconds"] = time.perf_counter() - wall_before
        results["generator_cpu"] = (time.process_time() - cpu_before) / results["load_seconds"]
    except (ServerError, loadgen.VerificationError) as error:
        say(f"error: {error}")
        failures.append(f"setup: {error}")
        setup_failed = True
    finally:
        say("stopping the facade, then tritonserver ...")
        facade_code, triton_code = facade.stop(), triton.stop()
        results["exit_codes"] = {"facade": facade_code, "tritonserver": triton_code}
        say(f"  facade exit code {facade_code}, tritonserver exit code {triton_code}")

    if watcher is not None:
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
        say(f"/dev/shm files of these processes: {len(watcher.shm_names)} seen, left after shutdown: "
            f"{', '.join(leftover) or 'none'}")
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
        say(f"  {t['series']:<32} start {_fmt(t['start']):>7} end {_fmt(t['end']):>7} peak {_fmt(t['peak']):>7} "
            f"{t['unit']:<5} growth/10 min: LSQ {_fmt(t['growth_per_10min'], 1):>7} Theil-Sen "
            f"{_fmt(t['robust_growth_per_10min'], 1):>7}{'  FLAGGED' if t['flagged'] else ''}")
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
