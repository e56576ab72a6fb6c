"""The two load generators the goodput engine can measure with, behind one interface.

`loadgen` (bench/load/compiled.py) is the default: compiled, it neither lags nor costs the shared cores what the Python
loops do. `python` (bench/load/loops.py, offered.py) is kept to compare with it and for targets loadgen cannot drive.
Both check every answer, and both give their own CPU seconds with each offered rate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bench.load import compiled, loops, offered
from bench.load.loops import LoadResult
from bench.load.offered import OfferedResult
from bench.load.targets import Target

WRONG = compiled.OUTCOMES[compiled.WRONG]  # a closed loop's error label for answers unlike in-process ONNX Runtime


@dataclass(frozen=True)
class Generator:
    name: str
    description: str  # for reports
    # Closed loop: (target, concurrency, seconds, warm-up seconds) -> its result; the target is open.
    keep: Callable[[Target, int, float, float], Awaitable[LoadResult]]
    # Open loop: (target, rate, seconds, seed) -> its result and the generator's CPU seconds; the target is open.
    offer: Callable[[Target, float, float, int], Awaitable[tuple[OfferedResult, float]]]


async def _compiled_keep(target: Target, concurrency: int, seconds: float, warmup_s: float) -> LoadResult:
    return await asyncio.to_thread(compiled.keep, target, concurrency, seconds, warmup_s)


async def _compiled_offer(target: Target, rate: float, seconds: float, seed: int) -> tuple[OfferedResult, float]:
    return await asyncio.to_thread(compiled.offer, target, rate, seconds, seed=seed)


async def _python_keep(target: Target, concurrency: int, seconds: float, warmup_s: float) -> LoadResult:
    wrong_before = target.wrong
    result = await loops.run_load(target, concurrency, seconds, warmup_s, verify=False)
    if wrong := target.wrong - wrong_before:  # counted among its errors, as loadgen counts them
        result.errors[WRONG] = wrong
        result.requests -= wrong
    return result


async def _python_offer(target: Target, rate: float, seconds: float, seed: int) -> tuple[OfferedResult, float]:
    before = time.process_time()
    result = await offered.offer(target, rate, seconds, seed=seed)
    return result, time.process_time() - before


GENERATORS = {
    "loadgen": Generator(
        "loadgen",
        f"loadgen (bench/load/loadgen.c: compiled, epoll, gRPC through libnghttp2; scheduled {compiled.priority()})",
        _compiled_keep,
        _compiled_offer,
    ),
    "python": Generator(
        "python", "the Python loops (bench/load: asyncio, grpc.aio, aiohttp)", _python_keep, _python_offer
    ),
}  # fmt: skip
