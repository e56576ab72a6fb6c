"""The facade's CPU and page faults per call at offered rates of 25 and 100 req/s, and at 16 callers.

Serves mobilenet_v3_small behind a facade of its defaults (ServingStack), then sends one 600 KB Predict at a time on a
schedule (25, then 100 req/s, 5 s each) and 16 closed-loop callers for 5 s; reads the facade process's CPU time and
minor page faults around each run. Run it on each tree to compare, nothing else running (about 50 s with one round):

    PYTHONPATH=. .venv/bin/python bench/reports/2026-11-29-facade-trim/facade_cpu_at_rates.py --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import psutil

from bench import REPOSITORY
from tritonnx.client.proto import inference_pb2
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack

MODEL = "mobilenet_v3_small"
PREDICT = "/inference.InferenceService/Predict"
BODY = inference_pb2.PredictRequest(
    model_name=MODEL, data=np.random.default_rng(0).random(3 * 224 * 224).tolist(), shape=[1, 3, 224, 224]
).SerializeToString()
SECONDS = 5.0
TRIM_SECONDS = 5.0  # the facade's idle trim period (client/facade/server.py)


async def at_rate(url: str, rate: float) -> list[float]:
    """Each call's latency (s), calls started on a fixed schedule whatever the answers."""
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(url) as channel:
        call = channel.unary_unary(PREDICT, request_serializer=None, response_deserializer=None)

        async def one() -> None:
            started = time.monotonic()
            await call(BODY)
            latencies.append(time.monotonic() - started)

        start, tasks = time.monotonic(), []
        for index in range(int(rate * SECONDS)):
            await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.gather(*tasks)
    return sorted(latencies)


async def closed_loop(url: str, callers: int, seconds: float) -> int:
    """Calls answered by `callers` each sending its next as its last is answered."""
    answered = 0
    async with grpc.aio.insecure_channel(url) as channel:
        call = channel.unary_unary(PREDICT, request_serializer=None, response_deserializer=None)
        end = time.monotonic() + seconds

        async def caller() -> None:
            nonlocal answered
            while time.monotonic() < end:
                await call(BODY)
                answered += 1

        await asyncio.gather(*(caller() for _ in range(callers)))
    return answered


def since(process: psutil.Process, before: tuple[float, int]) -> tuple[float, int]:
    """CPU seconds and minor page faults of the process since `before` (a `usage`)."""
    cpu, faults = usage(process)
    return cpu - before[0], faults - before[1]


def usage(process: psutil.Process) -> tuple[float, int]:
    """CPU seconds and minor page faults of the process so far."""
    times = process.cpu_times()
    minor_faults = int(Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[7])
    return times.user + times.system, minor_faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    print("| round | load | facade CPU ms a call | page faults a call | p50 / p99 ms |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="facade-trim-") as folder:
        repository = link_models(Path(folder) / "repository", {MODEL: REPOSITORY / MODEL})
        with ServingStack(repository, Path(folder)) as stack:
            assert stack.facade is not None
            url, facade = stack.facade.grpc_url, psutil.Process(stack.facade.pid)
            asyncio.run(closed_loop(url, 4, 2.0))  # warm-up
            for index in range(1, args.rounds + 1):
                for rate in (25.0, 100.0):
                    before = usage(facade)
                    latencies = asyncio.run(at_rate(url, rate))
                    cpu, faults = since(facade, before)
                    calls = len(latencies)
                    p50, p99 = latencies[calls // 2] * 1000, latencies[int(calls * 0.99)] * 1000
                    print(f"| {index} | {rate:g} req/s | {cpu * 1000 / calls:.2f} | {faults / calls:.0f} | "
                          f"{p50:.1f} / {p99:.1f} |", flush=True)  # fmt: skip
                before = usage(facade)
                calls = asyncio.run(closed_loop(url, 16, SECONDS))
                cpu, faults = since(facade, before)
                print(f"| {index} | 16 callers, {calls / SECONDS:.0f} req/s | {cpu * 1000 / calls:.2f} | "
                      f"{faults / calls:.0f} | |", flush=True)  # fmt: skip
            loaded = facade.memory_info().rss
            time.sleep(2 * TRIM_SECONDS)  # the facade's idle trim runs within this
            print(f"\nfacade RSS: {loaded >> 20} MiB right after the load, {facade.memory_info().rss >> 20} MiB idle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
