"""python -m bench.studies.cache: the facade's result cache under a skewed (Zipf) workload.

One tritonserver and two facades in front of it on free loopback ports, one with
`--cache-models <model>`, one without. The same closed loop (`--concurrency` callers) sends
`--distinct` different images, each call choosing one with Zipf probabilities (exponent `--zipf`),
through each facade in turn, `--rounds` times, interleaved. Reported: throughput of each, and the
cache's hit ratio from its own metrics. The cache starts empty in each round. Gates (exit 1 when one
fails, named in the report): no call failed, only the cached facade counted hits, and it served more
calls a second than the facade without a cache in every round.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from backend.server.facade import start_facade
from backend.server.prometheus import scrape
from backend.server.repository import link_models
from backend.server.stack import ServingStack
from bench import REPOSITORY
from bench.load.loops import run_load
from bench.load.targets import FacadeTarget
from bench.output import Gate, finish, gates_section, run_folder, say, settings, write_json


@dataclass
class CacheRun:
    cache: bool
    round: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    hit_ratio: float
    errors: dict[str, int]


def zipf_sequence(distinct: int, exponent: float, length: int, seed: int = 0) -> np.ndarray:
    """`length` choices among `distinct` items, item k (from 1) with probability proportional to k^-exponent."""
    weights = 1.0 / np.arange(1, distinct + 1) ** exponent
    return np.random.default_rng(seed).choice(distinct, size=length, p=weights / weights.sum())


def cache_counts(http_url: str, model: str) -> tuple[float, float]:
    """(hits, misses) from a facade's /metrics."""
    page = scrape(f"{http_url}/metrics")
    hits, misses = (page.value("tritonnx_facade_cache_requests_total", model=model, result=r) for r in ("hit", "miss"))
    return hits, misses


async def one_run(url: str, model: str, order: np.ndarray, images: list[np.ndarray], args: argparse.Namespace):
    target = FacadeTarget(url, model)
    await target.open(args.concurrency)
    try:
        await target.verify()
        requests = [target._image_request(image) for image in images]
        target.payloads = [requests[i] for i in order]  # the calls take them in this order
        return await run_load(target, args.concurrency, args.seconds, warmup_s=0, verify=False)
    finally:
        await target.close()


def gates(runs: list[CacheRun]) -> list[Gate]:
    pairs = [[r for r in runs if r.round == index] for index in sorted({r.round for r in runs})]
    off, on = [r for r in runs if not r.cache], [r for r in runs if r.cache]
    return [
        Gate("no call failed", not any(r.errors for r in runs), str([r.errors for r in runs if r.errors] or "none")),
        Gate("without the cache, no hits", all(r.hit_ratio == 0 for r in off), f"{[r.hit_ratio for r in off]}"),
        Gate("with the cache, hits", all(r.hit_ratio > 0 for r in on),
             f"hit ratios {[round(r.hit_ratio, 2) for r in on]}"),
        Gate("with the cache, more calls a second than without, every round",
             all(b.throughput_rps > a.throughput_rps for a, b in pairs),
             "; ".join(f"{b.throughput_rps:.1f} against {a.throughput_rps:.1f} req/s" for a, b in pairs)),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.cache",
        description="Throughput through the facade with and without its result cache, on a Zipf workload.",
    )
    parser.add_argument("--model", default="mobilenet_v3_small", help="default: %(default)s")
    parser.add_argument("--distinct", type=int, default=1000, help="different images; default: %(default)s")
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent; default: %(default)s")
    parser.add_argument("--concurrency", type=int, default=16, help="default: %(default)s")
    parser.add_argument("--seconds", type=float, default=15.0, help="per run; default: %(default)s")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; default: %(default)s")
    parser.add_argument("--cache-bytes", type=int, default=64 << 20, help="default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-cache")
    args = parser.parse_args(argv)
    _, out = run_folder(args.out, "cache")
    rng = np.random.default_rng(1)
    images = [rng.standard_normal((1, 3, 224, 224), dtype=np.float32) for _ in range(args.distinct)]
    order = zipf_sequence(args.distinct, args.zipf, 200_000)
    repository = link_models(out / "repository", {args.model: REPOSITORY / args.model})
    runs: list[CacheRun] = []
    with ServingStack(repository, out, facade_args=["--default-model", args.model]) as stack:
        assert stack.facade is not None
        for index in range(args.rounds):
            for cached in (False, True):
                facade = stack.facade
                if cached:  # a new facade each round: its cache starts empty
                    cache_args = ["--cache-models", args.model, "--cache-bytes", str(args.cache_bytes)]
                    facade = start_facade(stack.triton.grpc_url, stack.admin_key, out / f"facade-cache-{index}.log",
                                          ["--default-model", args.model, *cache_args])  # fmt: skip
                try:
                    result = asyncio.run(one_run(facade.grpc_url, args.model, order, images, args))
                    hits, misses = cache_counts(facade.http_url, args.model) if cached else (0.0, 0.0)
                finally:
                    if cached:
                        facade.stop()
                run = CacheRun(cached, index + 1, result.throughput_rps, result.p50_ms, result.p99_ms,
                               hits / max(hits + misses, 1.0), result.errors)  # fmt: skip
                say(f"round {run.round} {'with' if cached else 'without'} cache: {run.throughput_rps:.1f} req/s, "
                    f"p50 {run.p50_ms:.1f} ms, p99 {run.p99_ms:.1f} ms, hit ratio {run.hit_ratio:.2f}")  # fmt: skip
                runs.append(run)
    judged = gates(runs)
    write_json(out / "results.json", {"settings": settings(args), "runs": [asdict(r) for r in runs],
                                      "gates": [asdict(g) for g in judged]})  # fmt: skip
    lines = [
        f"# Result cache, {args.model}: {args.distinct} images, Zipf {args.zipf}, c={args.concurrency}, "
        f"{args.seconds:.0f} s runs\n",
        "| round | cache | req/s | p50 ms | p99 ms | hit ratio |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r.round} | {'on' if r.cache else 'off'} | {r.throughput_rps:.1f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | "
            f"{r.hit_ratio:.2f} |"
            for r in runs
        ),  # fmt: skip
    ]
    text = "\n".join(lines) + "\n\n" + gates_section(judged)
    return finish(out, text, judged)


if __name__ == "__main__":
    sys.exit(main())
