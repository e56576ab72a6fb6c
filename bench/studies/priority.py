"""python -m bench.studies.priority: 3x overload with 20% high-priority requests, with and without priorities.

For each path (the facade's Predict with `priority`, Triton's ModelInfer with tritonclient's
`priority` parameter) and model, on its own tritonserver and facade on free loopback ports:

1. unloaded: high-priority requests alone, a closed loop at concurrency 1 -> their p99;
2. capacity: a closed loop at 48 in flight (the facade's limit at most);
3. overload: an open loop at `--factor` x capacity for `--seconds`, every 5th request high
   priority (1), the others at the default level; then the same with every request at the default
   level ("without"), the same 20% still counted apart.

Goal: with priorities, the high requests keep p99 within 1.5x of their unloaded p99 and under 1%
rejected, while the others absorb the rejections. The gates (exit 1 when one fails, named in the
report) are the rejection goals, that the load did overload (the others were refused), and that
every answer equals in-process ONNX Runtime's; the latency goal is reported, not gated (Triton does
not preempt a running batch: bench/reports/2026-11-24-priority/). Every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tritonclient.grpc import service_pb2

from backend.server.repository import link_models
from backend.server.stack import ServingStack
from bench import REPOSITORY
from bench.load.loops import OpenLoop, run_load
from bench.load.stats import OK, Tally, percentiles
from bench.load.targets import FacadeTarget, GrpcTarget
from bench.output import Gate, finish, gates_section, run_folder, say, settings, write_json
from bench.overload import checked_images, path_target
from client.proto import inference_pb2

HIGH = 1
EVERY = 5  # one request in 5 is high priority: 20%


def set_priority(target: GrpcTarget, priority: int) -> None:
    """Rewrite the target's prepared requests with `priority` (0: none, the model's default level)."""
    rewritten = []
    for payload in target.payloads:
        if isinstance(target, FacadeTarget):
            predict = inference_pb2.PredictRequest.FromString(payload)
            predict.priority = priority
            rewritten.append(predict.SerializeToString())
        else:
            infer = service_pb2.ModelInferRequest.FromString(payload)
            infer.parameters.pop("priority", None)
            if priority:
                infer.parameters["priority"].uint64_param = priority
            rewritten.append(infer.SerializeToString())
    target.payloads = rewritten


class PriorityMix:
    """A target that sends every EVERY-th call through `high`, the others through `low`, timing each class."""

    def __init__(self, high: GrpcTarget, low: GrpcTarget) -> None:
        self.high, self.low = high, low
        self.name, self.model, self.batch, self.timeout_s = "mix", low.model, low.batch, low.timeout_s
        self.tallies = {"high": Tally(), "other": Tally()}
        self._count = 0

    @property
    def is_open(self) -> bool:
        return self.low.is_open

    async def open(self, concurrency: int = 1) -> None:
        await self.high.open(concurrency)
        await self.low.open(concurrency)

    async def verify(self) -> None:
        await self.low.verify()

    async def call(self) -> str | None:
        self._count += 1
        kind = "high" if self._count % EVERY == 0 else "other"
        target = self.high if kind == "high" else self.low
        started = time.perf_counter()
        error = await target.call()
        self.tallies[kind].add(error or OK, time.perf_counter() - started)
        return error

    async def close(self) -> None:
        await self.high.close()
        await self.low.close()


@dataclass
class ClassFigures:
    requests: int
    rejected_pct: float
    p50_ms: float
    p99_ms: float


@dataclass
class PriorityResult:
    path: str
    model: str
    priorities: bool
    capacity_rps: float
    offered_rps: float
    unloaded_high_p99_ms: float
    high: ClassFigures
    other: ClassFigures
    wrong_outputs: int

    def summary(self) -> str:
        def line(name: str, c: ClassFigures) -> str:
            return f"{name} {c.requests} sent, {c.rejected_pct:.1f}% refused, p50 {c.p50_ms:.0f} p99 {c.p99_ms:.0f} ms"

        return (
            f"{self.path} {'with' if self.priorities else 'without'} priorities: offered {self.offered_rps:.1f}/s "
            f"(capacity {self.capacity_rps:.1f}/s); {line('high', self.high)} (unloaded p99 "
            f"{self.unloaded_high_p99_ms:.0f} ms, {self.high.p99_ms / self.unloaded_high_p99_ms:.2f}x); "
            f"{line('other', self.other)}; wrong outputs {self.wrong_outputs}"
        )


def figures(tally: Tally) -> ClassFigures:
    sent = sum(tally.statuses.values())
    p50, p99 = percentiles(tally.ms(OK), [50, 99], 0.0)
    return ClassFigures(sent, 100.0 * (sent - tally.count(OK)) / max(sent, 1), p50, p99)


async def measure(path: str, url: str, model: str, images: list, expected: list, args: argparse.Namespace) -> list:
    results = []
    for priorities in (True, False):
        high, low = (path_target(path, url, model, images, expected) for _ in range(2))
        mix = PriorityMix(high, low)
        await mix.open(1024)
        try:
            await mix.verify()
            set_priority(high, HIGH if priorities else 0)
            say(f"{path}: unloaded high-priority requests, closed loop at 1 for {args.unloaded_seconds:.0f}s ...")
            unloaded = await run_load(high, 1, args.unloaded_seconds, warmup_s=0.5, verify=False)
            capacity = (await run_load(low, 48, args.capacity_seconds, warmup_s=0.5, verify=False)).throughput_rps
            if not capacity:
                raise RuntimeError(f"{path}: no call sent at 48 in flight in {args.capacity_seconds:g} s came back: "
                                   "nothing to overload; give it more --capacity-seconds")  # fmt: skip
            offered = args.factor * capacity
            say(f"{path}: capacity {capacity:.1f}/s; offering {offered:.1f}/s for {args.seconds:.0f}s ...")
            load = OpenLoop(mix, offered, 1024, max_calls=max(1, int(offered * args.seconds)), wait_when_full=True)
            await load.run(args.seconds)
        finally:
            await mix.close()
        result = PriorityResult(
            path, model, priorities, capacity, offered, unloaded.p99_ms,
            figures(mix.tallies["high"]), figures(mix.tallies["other"]), high.wrong + low.wrong,
        )  # fmt: skip
        say(result.summary())
        results.append(result)
        await asyncio.sleep(2)  # the queues drain before the next run
    return results


def report(results: list[PriorityResult]) -> str:
    lines = [
        "| path | priorities | offered / capacity | high: refused | high p50 / p99 ms | high p99 / unloaded p99 "
        "| others: refused | others p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.path} | {'with' if r.priorities else 'without'} | {r.offered_rps:.1f} / {r.capacity_rps:.1f} req/s "
            f"| {r.high.rejected_pct:.1f}% | {r.high.p50_ms:.0f} / {r.high.p99_ms:.0f} "
            f"| {r.high.p99_ms / r.unloaded_high_p99_ms:.2f}x ({r.unloaded_high_p99_ms:.0f} ms) "
            f"| {r.other.rejected_pct:.1f}% | {r.other.p50_ms:.0f} / {r.other.p99_ms:.0f} |"
        )
    return "\n".join(lines) + "\n"


def gates(results: list[PriorityResult]) -> list[Gate]:
    """Per path: the answers, that it overloaded, and that rejections followed priority."""
    found = []
    for path in dict.fromkeys(r.path for r in results):
        on, off = (next(r for r in results if r.path == path and r.priorities is p) for p in (True, False))
        high, other, high_off = on.high.rejected_pct, on.other.rejected_pct, off.high.rejected_pct
        found += [
            Gate(f"{path}: every answer equals in-process ONNX Runtime's",
                 not on.wrong_outputs and not off.wrong_outputs,
                 f"wrong outputs {on.wrong_outputs} with, {off.wrong_outputs} without priorities"),
            Gate(f"{path}: the load overloaded (default-priority requests refused)", other > 0,
                 f"{other:.1f}% refused"),
            Gate(f"{path}: with priorities, high requests refused under 1%", high < 1.0, f"{high:.1f}%"),
            Gate(f"{path}: with priorities, high requests refused less than the others", high < other,
                 f"{high:.1f}% against {other:.1f}%"),
            Gate(f"{path}: high requests refused less with priorities than without", high < high_off,
                 f"{high:.1f}% against {high_off:.1f}%"),
        ]  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.priority",
        description="Overload a model with 20%% high-priority requests, with and without priorities, through the "
        "facade and directly to Triton; report each class's latency and rejections.",
    )
    parser.add_argument("--model", default="resnet50", help="default: %(default)s (slow enough to overload cheaply)")
    parser.add_argument("--paths", nargs="+", choices=["facade", "direct"], default=["facade", "direct"])
    parser.add_argument("--seconds", type=float, default=30.0, help="overload per run; default: %(default)s")
    parser.add_argument("--factor", type=float, default=3.0, help="offered / capacity; default: %(default)s")
    parser.add_argument("--capacity-seconds", type=float, default=5.0, help="default: %(default)s")
    parser.add_argument("--unloaded-seconds", type=float, default=6.0, help="default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-priority")
    args = parser.parse_args(argv)
    _, out = run_folder(args.out, "priority")
    images, expected = checked_images(args.model)
    repository = link_models(out / "repository", {args.model: REPOSITORY / args.model})
    results: list[PriorityResult] = []
    with ServingStack(repository, out, facade_args=["--default-model", args.model, "--health-interval", "5"]) as stack:
        assert stack.facade is not None
        for path in args.paths:
            url = stack.facade.grpc_url if path == "facade" else stack.triton.grpc_url
            results += asyncio.run(measure(path, url, args.model, images, expected, args))
    judged = gates(results)
    write_json(out / "results.json", {"settings": settings(args), "results": [asdict(r) for r in results],
                                      "gates": [asdict(g) for g in judged]})  # fmt: skip
    text = f"# Priorities under {args.factor:.0f}x overload, {args.model}\n\n{report(results)}\n{gates_section(judged)}"
    return finish(out, text, judged)


if __name__ == "__main__":
    sys.exit(main())
