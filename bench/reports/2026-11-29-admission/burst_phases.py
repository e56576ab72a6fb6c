"""Where a legitimate caller's wait during `many_connections` comes from: opening the connections, or their calls.

Serves the campaign's models behind a facade of its defaults, then opens 1,000 HTTP/2 connections (8 threads), waits
2 s, and sends one header-only Predict on each (the `many_connections` attack, in two phases). A probe of a process of
its own sends a priority-1 Predict every 50 ms throughout; the facade's CPU time is read around the calls' phase.

Run from the checkout (about 30 s a round), nothing else running:
    PYTHONPATH=. .venv/bin/python bench/reports/2026-11-29-admission/burst_phases.py --rounds 3
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from bench import REPOSITORY
from bench.attacks.campaign import SERVED
from bench.attacks.h2raw import RawConnection, read_many
from bench.attacks.payloads import PREDICT
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack

PROBE = r"""
import sys, time, grpc
from bench.attacks.payloads import PREDICT, valid_predict
call = grpc.insecure_channel(sys.argv[1]).unary_unary(PREDICT, request_serializer=None, response_deserializer=None)
body, end = valid_predict(priority=1), time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    started = time.monotonic()
    try:
        call(body, timeout=2.0)
        status = "OK"
    except grpc.RpcError as error:
        status = error.code().name
    print(f"{started:.4f} {(time.monotonic() - started) * 1000:.1f} {status}", flush=True)
    time.sleep(0.05)
"""
PHASES = ("before", "connecting", "connected", "calls", "after")


def one_round(grpc_url: str, pid: int, count: int) -> tuple[dict[str, list[float]], float, int]:
    """The probe's latencies by phase, the facade's CPU seconds over the calls' phase, and probe failures."""
    host, _, port = grpc_url.rpartition(":")
    probe = subprocess.Popen([sys.executable, "-c", PROBE, grpc_url, "9"], stdout=subprocess.PIPE, text=True)
    time.sleep(1.5)
    marks = [time.monotonic()]
    with ThreadPoolExecutor(8) as pool:
        raws = list(pool.map(lambda _: RawConnection(host, int(port), read=False), range(count)))
    marks.append(time.monotonic())
    time.sleep(2)
    facade = psutil.Process(pid)
    cpu = sum(facade.cpu_times()[:2])
    marks.append(time.monotonic())
    for raw in raws:
        raw.send(raw.headers(PREDICT))
    read_many(raws, 3)
    cpu = sum(facade.cpu_times()[:2]) - cpu
    marks.append(time.monotonic())
    for raw in raws:
        raw.close()
    by_phase: dict[str, list[float]] = {phase: [] for phase in PHASES}
    failed = 0
    for line in probe.communicate()[0].splitlines():
        started, ms, status = line.split()
        phase = PHASES[sum(float(started) >= mark for mark in marks)]
        by_phase[phase].append(float(ms))
        failed += status != "OK"
    return by_phase, cpu, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=1000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="burst-phases-") as folder:
        out = Path(folder)
        repository = link_models(out / "repository", {name: REPOSITORY / name for name in SERVED})
        with ServingStack(repository, out) as stack:
            assert stack.facade is not None
            print("| round | probe slowest (ms): before / connecting / connected / calls / after | probe failed "
                  "| facade CPU over the calls (ms), per call (us) |")  # fmt: skip
            print("|---|---|---|---|")
            for index in range(1, args.rounds + 1):
                by_phase, cpu, failed = one_round(stack.facade.grpc_url, stack.facade.pid, args.connections)
                slowest = " / ".join(f"{max(by_phase[p], default=0):.0f}" for p in PHASES)
                print(f"| {index} | {slowest} | {failed} | {cpu * 1000:.0f}, {cpu * 1e6 / args.connections:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
