"""python -m bench.studies.priority: 3x overload with 20% high-priority requests, and the knobs that bound their latency.

For each arm, on its own tritonserver and facade on free loopback ports, and each path (the facade's Predict with
`priority`, Triton's ModelInfer with tritonclient's `priority` parameter):

1. unloaded: high-priority requests alone, a closed loop at concurrency 1 -> their p99;
2. capacity: a closed loop at 48 in flight (the facade's limit at most);
3. overload: an open loop at `--factor` x capacity for `--seconds`, every 5th request high
   priority (1), the others at the default level.

The arms (`--arms`):
- `priorities`: the model's two priority levels, as the demo repository ships them;
- `without`: every request at the default level (the same 20% still counted apart);
- `lane`: priorities, and a latency lane: the same graph under a second name (`<model>_lane`) with one instance of
  its own, which priority-1 calls go to (the facade's `--priority-lane`; directly, the client names the lane);
- `lane_nice`: the lane, and the model's own instances at `nice` 10, so the lane's instance wins the cores when both
  compute.

Goal: the high requests keep p99 within `--p99-goal` (3) x their unloaded p99 with under 1% refused, while the
others absorb the rejections. Gates (exit 1 when one fails, named in the report): every answer equals in-process ONNX
Runtime's, the load overloaded (the others were refused), the rejections followed priority, and in each lane arm the
goal itself. Every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tritonclient.grpc import service_pb2

from backend.model_files import CONFIG_FILE
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
ARMS = ("priorities", "without", "lane", "lane_nice")
LANE_NICE = 10  # the model's instances beside the lane: any positive value puts them behind it; 10 is nice(1)'s


def lane_config(max_batch_size: int, cores: int) -> str:
    """A latency lane's policy: one instance with every core, the model's batch size (any request fits)."""
    return (
        'backend: "python"\n'
        f"max_batch_size: {max_batch_size}\n"
        "instance_group [ { kind: KIND_CPU, count: 1 } ]\n"
        f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{cores}" }} }}\n'
    )


def arm_repository(folder: Path, model: str, arm: str) -> tuple[Path, list[str]]:
    """The arm's repository, and the facade's flags for it."""
    source = REPOSITORY / model
    config = (source / CONFIG_FILE).read_text()
    if not arm.startswith("lane"):
        return link_models(folder, {model: source}), []
    if arm == "lane_nice":
        config += f'parameters {{ key: "nice" value: {{ string_value: "{LANE_NICE}" }} }}\n'
    max_batch_size = int(re.search(r"^max_batch_size:\s*(\d+)", config, re.MULTILINE)[1])  # type: ignore[index]
    lane = lane_config(max_batch_size, len(os.sched_getaffinity(0)))
    repository = link_models(folder, {model: source, f"{model}_lane": source}, {model: config, f"{model}_lane": lane})
    return repository, ["--priority-lane", f"{model}={model}_lane"]


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
    arm: str
    path: str
    model: str
    capacity_rps: float
    offered_rps: float
    unloaded_high_p99_ms: float
    high: ClassFigures
    other: ClassFigures
    wrong_outputs: int

    @property
    def ratio(self) -> float:
        """The high requests' p99 under overload over their unloaded p99."""
        return self.high.p99_ms / self.unloaded_high_p99_ms

    def summary(self) -> str:
        def line(name: str, c: ClassFigures) -> str:
            return f"{name} {c.requests} sent, {c.rejected_pct:.1f}% refused, p50 {c.p50_ms:.0f} p99 {c.p99_ms:.0f} ms"

        return (
            f"{self.arm}, {self.path}: offered {self.offered_rps:.1f}/s (capacity {self.capacity_rps:.1f}/s); "
            f"{line('high', self.high)} (unloaded p99 {self.unloaded_high_p99_ms:.0f} ms, {self.ratio:.2f}x); "
            f"{line('other', self.other)}; wrong outputs {self.wrong_outputs}"
        )


def figures(tally: Tally) -> ClassFigures:
    sent = sum(tally.statuses.values())
    p50, p99 = percentiles(tally.ms(OK), [50, 99], 0.0)
    return ClassFigures(sent, 100.0 * (sent - tally.count(OK)) / max(sent, 1), p50, p99)


async def measure(arm: str, path: str, url: str, model: str, args: argparse.Namespace) -> PriorityResult:
    """One arm on one path: the high requests' unloaded p99, the capacity, then the overload."""
    images, expected = checked_images(model)
    # Directly, a tritonclient user names the lane; the facade routes priority 1 there by itself.
    high_model = f"{model}_lane" if arm.startswith("lane") and path == "direct" else model
    high, low = path_target(path, url, high_model, images, expected), path_target(path, url, model, images, expected)
    mix = PriorityMix(high, low)
    await mix.open(1024)
    try:
        await mix.verify()
        set_priority(high, 0 if arm == "without" else HIGH)
        say(f"{arm}, {path}: unloaded high-priority requests, closed loop at 1 for {args.unloaded_seconds:.0f}s ...")
        unloaded = await run_load(high, 1, args.unloaded_seconds, warmup_s=0.5, verify=False)
        capacity = (await run_load(low, 48, args.capacity_seconds, warmup_s=0.5, verify=False)).throughput_rps
        if not capacity:
            raise RuntimeError(f"{path}: no call sent at 48 in flight in {args.capacity_seconds:g} s came back: "
                               "nothing to overload; give it more --capacity-seconds")  # fmt: skip
        offered = args.factor * capacity
        say(f"{arm}, {path}: capacity {capacity:.1f}/s; offering {offered:.1f}/s for {args.seconds:.0f}s ...")
        load = OpenLoop(mix, offered, 1024, max_calls=max(1, int(offered * args.seconds)), wait_when_full=True)
        await load.run(args.seconds)
    finally:
        await mix.close()
    result = PriorityResult(
        arm, path, model, capacity, offered, unloaded.p99_ms,
        figures(mix.tallies["high"]), figures(mix.tallies["other"]), high.wrong + low.wrong,
    )  # fmt: skip
    say(result.summary())
    await asyncio.sleep(2)  # the queues drain before the next run
    return result


def report(results: list[PriorityResult]) -> str:
    lines = [
        "| arm | path | offered / capacity | high: refused | high p50 / p99 ms | high p99 / unloaded p99 "
        "| others: refused | others p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.arm} | {r.path} | {r.offered_rps:.1f} / {r.capacity_rps:.1f} req/s "
            f"| {r.high.rejected_pct:.1f}% | {r.high.p50_ms:.0f} / {r.high.p99_ms:.0f} "
            f"| {r.ratio:.2f}x ({r.unloaded_high_p99_ms:.0f} ms) "
            f"| {r.other.rejected_pct:.1f}% | {r.other.p50_ms:.0f} / {r.other.p99_ms:.0f} |"
        )
    return "\n".join(lines) + "\n"


def gates(results: list[PriorityResult], p99_goal: float) -> list[Gate]:
    """Per arm and path: the answers, that it overloaded, that rejections followed priority; the goal in lane arms."""
    found = []
    for r in results:
        where, high, other = f"{r.arm}, {r.path}", r.high.rejected_pct, r.other.rejected_pct
        found += [
            Gate(f"{where}: every answer equals in-process ONNX Runtime's", not r.wrong_outputs,
                 f"wrong outputs {r.wrong_outputs}"),
            Gate(f"{where}: the load overloaded (default-priority requests refused)", other > 0, f"{other:.1f}% refused"),
        ]  # fmt: skip
        if r.arm == "without":
            continue
        found += [
            Gate(f"{where}: high requests refused under 1%", high < 1.0, f"{high:.1f}%"),
            Gate(f"{where}: high requests refused less than the others", high < other, f"{high:.1f}% against {other:.1f}%"),
        ]  # fmt: skip
        if r.arm.startswith("lane"):
            found.append(Gate(f"{where}: high p99 within {p99_goal:g}x its unloaded p99", r.ratio <= p99_goal,
                              f"{r.high.p99_ms:.0f} ms, {r.ratio:.2f}x of {r.unloaded_high_p99_ms:.0f} ms"))  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.priority",
        description="Overload a model with 20%% high-priority requests, with and without priorities and with a "
        "latency lane, through the facade and directly to Triton; report each class's latency and rejections.",
    )
    parser.add_argument("--model", default="resnet50", help="default: %(default)s (slow enough to overload cheaply)")
    parser.add_argument("--paths", nargs="+", choices=["facade", "direct"], default=["facade", "direct"])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="default: all")
    parser.add_argument("--seconds", type=float, default=30.0, help="overload per run; default: %(default)s")
    parser.add_argument("--factor", type=float, default=3.0, help="offered / capacity; default: %(default)s")
    parser.add_argument("--p99-goal", type=float, default=3.0, help="high p99 / unloaded p99; default: %(default)s")
    parser.add_argument("--capacity-seconds", type=float, default=5.0, help="default: %(default)s")
    parser.add_argument("--unloaded-seconds", type=float, default=6.0, help="default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-priority")
    args = parser.parse_args(argv)
    _, out = run_folder(args.out, "priority")
    results: list[PriorityResult] = []
    for arm in args.arms:
        repository, lane_args = arm_repository(out / arm / "repository", args.model, arm)
        facade_args = ["--default-model", args.model, "--health-interval", "5", *lane_args]
        say(f"arm {arm}: starting its tritonserver and facade ...")
        with ServingStack(repository, out / arm, facade_args=facade_args) as stack:
            assert stack.facade is not None
            for path in args.paths:
                url = stack.facade.grpc_url if path == "facade" else stack.triton.grpc_url
                results.append(asyncio.run(measure(arm, path, url, args.model, args)))
    judged = gates(results, args.p99_goal)
    write_json(out / "results.json", {"settings": settings(args), "results": [asdict(r) for r in results],
                                      "gates": [asdict(g) for g in judged]})  # fmt: skip
    text = f"# Priorities under {args.factor:.0f}x overload, {args.model}\n\n{report(results)}\n{gates_section(judged)}"
    return finish(out, text, judged)


if __name__ == "__main__":
    sys.exit(main())
