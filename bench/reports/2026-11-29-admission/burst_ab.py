"""`many_connections` as the campaign sends it, against two facades in turn: the count by address off and on.

Each round opens 1,000 HTTP/2 connections (8 threads) and sends one header-only Predict on each at once, while a
probe of a process of its own sends a priority-1 Predict every 50 ms; it reports the probe's slowest call during the
burst, the facade's CPU over it, and how the attack's calls ended. 12 s between rounds let the places empty.

Run from the checkout (about 45 s a round and arm), nothing else running:
    PYTHONPATH=. .venv/bin/python bench/reports/2026-11-29-admission/burst_ab.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
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

sys.path.insert(0, str(Path(__file__).parent))
from burst_phases import PROBE  # noqa: E402

ARMS = {"off": {"TRITONNX_MAX_CONNECTIONS_PER_ADDRESS": "0"}, "on": {}}


def one_round(url: str, pid: int, count: int) -> str:
    host, _, port = url.rpartition(":")
    probe = subprocess.Popen([sys.executable, "-c", PROBE, url, "6"], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    facade = psutil.Process(pid)
    cpu, started = sum(facade.cpu_times()[:2]), time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        raws = list(pool.map(lambda _: RawConnection(host, int(port), read=False), range(count)))
    for raw in raws:
        raw.send(raw.headers(PREDICT))
    read_many(raws, 3)
    cpu, ended = sum(facade.cpu_times()[:2]) - cpu, time.monotonic()
    answered, closed = sum(len(raw.ended) for raw in raws), sum(bool(raw.closed_at) for raw in raws)
    for raw in raws:
        raw.close()
    before, slowest, failed = 0.0, 0.0, 0
    for line in probe.communicate()[0].splitlines():
        at, ms, status = line.split()
        failed += status != "OK"
        if started <= float(at) <= ended:
            slowest = max(slowest, float(ms))
        elif float(at) < started:
            before = max(before, float(ms))
    return f"{before:.0f} | {slowest:.0f} | {failed} | {cpu * 1000:.0f} | {answered} | {closed}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="burst-ab-") as folder:
        out = Path(folder)
        repository = link_models(out / "repository", {name: REPOSITORY / name for name in SERVED})
        stacks: dict[str, ServingStack] = {}
        try:
            for arm, env in ARMS.items():
                saved = dict(os.environ)
                os.environ.update(env)
                (out / arm).mkdir()
                stacks[arm] = ServingStack(repository, out / arm).start()
                os.environ.clear()
                os.environ.update(saved)
            print("| round | count by address | probe slowest before (ms) | probe slowest in the burst (ms) | probe "
                  "failed | facade CPU (ms) | calls ended by the facade | connections closed |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|")
            for index in range(1, args.rounds + 1):
                for arm, stack in stacks.items():
                    assert stack.facade is not None
                    print(f"| {index} | {arm} | {one_round(stack.facade.grpc_url, stack.facade.pid, 1000)} |",
                          flush=True)  # fmt: skip
                    time.sleep(12)
        finally:
            for stack in stacks.values():
                stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
