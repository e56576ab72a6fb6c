"""python -m bench.overload: offer 3x a path's capacity and check that nothing breaks.

For one path at a time (the facade's Predict, or Triton's KServe ModelInfer directly) and one model: its capacity from
a closed loop, after as long a warm-up, holding as many requests as the path admits (the facade's share for
default-priority requests, 3/4 of its in-flight limit; for the direct path its queue bound and a full batch per
instance); the servers' idle memory (PSS of each process tree) once that loop made them hold the most requests and
serve the largest batches the overload will; then an
open loop sending `--factor` x capacity for `--seconds`, each request one of a few images with its expected output
from in-process ONNX Runtime; then a closed loop at the concurrency the accepted requests had (Little's law), for
their p99 without overload; then the memory again.

Verdict, per the reliability targets: every request ends as a success or a documented rejection (RESOURCE_EXHAUSTED
from the facade, UNAVAILABLE from Triton's queue) returned within 50 ms; the accepted requests' p99 is at most 2x the
reference p99; no wrong output; the servers stay up and their memory is back within 10% (or 64 MiB) of idle.

The demo models run a plain batcher, which bounds nothing: the facade's admission protects the facade's path. Triton's
own ports are protected by a queue policy in the model's config (docs/models.md), so the direct path is measured on
the model with one and two single-threaded instances (`bounded`), as docs/models.md configures a deployment that
exposes those ports.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bench import REPOSITORY
from bench.load.loops import OpenLoop, run_load
from bench.load.offered import MAX_OUTSTANDING
from bench.load.stats import OK, percentiles
from bench.load.targets import FacadeTarget, GrpcTarget, KServeTarget
from bench.output import run_folder, say, write_json
from bench.peers.servers import reference_outputs as expected_outputs
from bench.peers.servers import sample_images
from bench.usage import tree_memory
from tritonnx.server.repository import CONFIG_FILE, link_models
from tritonnx.server.stack import ServingStack

REJECTIONS = {"facade": "RESOURCE_EXHAUSTED", "direct": "UNAVAILABLE"}
REJECTION_SECONDS = 0.05
P99_FACTOR = 2.0
# The direct path's queue policy: requests past this many waiting, or waiting longer, are refused.
QUEUE_BOUND, QUEUE_TIMEOUT_US = 64, 10_000_000
# With a queue policy Triton forms the next batch only once an instance is idle: a second instance computes meanwhile
# (docs/models.md gives a queue policy two instances of one intra-op thread each).
BOUNDED_INSTANCES, BOUNDED_THREADS = 2, 1
# The facade's capacity loop: its share for default-priority requests, 3/4 of its 64 in flight.
FACADE_CAPACITY_CONCURRENCY = 48


_INSTANCE_COUNT = r"(instance_group\s*\[\s*\{[^}]*count:\s*)(\d+)"


def _set(config: str, pattern: str, value: object) -> str:
    config, found = re.subn(pattern, rf"\g<1>{value}", config)
    if found != 1:
        raise ValueError(f"the config has no single match of {pattern!r}")
    return config


def _read(config: str, pattern: str) -> int:
    match = re.search(pattern, config)
    if match is None:
        raise ValueError(f"the config has no match of {pattern!r}")
    return int(match[match.lastindex or 0])


def bounded(config: str, size: int = QUEUE_BOUND) -> str:
    """A model config whose dynamic batcher refuses requests past `size` waiting, or waiting too long (UNAVAILABLE).

    In front of `BOUNDED_INSTANCES` instances of `BOUNDED_THREADS` intra-op threads each.
    """
    policy = (
        f"  default_queue_policy {{ max_queue_size: {size} timeout_action: REJECT "
        f"default_timeout_microseconds: {QUEUE_TIMEOUT_US} allow_timeout_override: true }}\n"
    )
    if "dynamic_batching {\n" not in config:
        raise ValueError("the config has no dynamic_batching block")
    config = _set(config, _INSTANCE_COUNT, BOUNDED_INSTANCES)
    config = _set(config, r'(key:\s*"intra_op_thread_count"\s*value:\s*\{\s*string_value:\s*")(\d+)', BOUNDED_THREADS)
    return config.replace("dynamic_batching {\n", "dynamic_batching {\n" + policy, 1)


def held_requests(config: str) -> int:
    """The most requests a `bounded` model holds: its queue bound, and a full batch on each instance.

    The capacity loop holds that many, so the idle memory measured after it counts the buffers the overload needs.
    """
    size = _read(config, r"max_queue_size:\s*(\d+)")
    return size + _read(config, _INSTANCE_COUNT) * _read(config, r"max_batch_size:\s*(\d+)")


def bounded_repository(directory: Path, model: str) -> Path:
    """A repository serving `model` of the demo repository with a bounded queue (`bounded`)."""
    config = bounded((REPOSITORY / model / CONFIG_FILE).read_text())
    return link_models(directory, {model: REPOSITORY / model}, {model: config})


def checked_images(model: str, count: int = 4, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """`count` random single images for a demo model, and its in-process outputs for each."""
    images = sample_images(count, seed)
    return images, expected_outputs(REPOSITORY / model / "1" / "model.onnx", images)


def path_target(path: str, url: str, model: str, images: list[np.ndarray], expected: list[np.ndarray]) -> GrpcTarget:
    """The target of a path ("facade" or "direct") sending `images` in turn, every answer checked."""
    kind = FacadeTarget if path == "facade" else KServeTarget
    return kind(url, model, len(images[0]), images=images, expected=expected)


@dataclass
class OverloadResult:
    path: str
    model: str
    capacity_rps: float
    offered_rps: float
    seconds: float
    statuses: dict[str, int]
    wrong_outputs: int
    accepted_rps: float
    accepted_p50_ms: float
    accepted_p99_ms: float
    accepted_concurrency: float
    reference_p99_ms: float
    rejection_max_ms: float
    rejection_p99_ms: float
    late_rejections: int
    memory_idle_mib: dict[str, float]
    memory_after_mib: dict[str, float]
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return (
            f"{self.path} {self.model}: capacity {self.capacity_rps:.1f}/s, offered {self.offered_rps:.1f}/s for "
            f"{self.seconds:.0f}s: {dict(self.statuses)}, wrong outputs {self.wrong_outputs}; accepted "
            f"{self.accepted_rps:.1f}/s p50 {self.accepted_p50_ms:.0f} ms p99 {self.accepted_p99_ms:.0f} ms at "
            f"~{self.accepted_concurrency:.0f} in flight (reference p99 {self.reference_p99_ms:.0f} ms); rejections "
            f"p99 {self.rejection_p99_ms:.1f} ms, max {self.rejection_max_ms:.1f} ms; memory idle "
            f"{self.memory_idle_mib} -> after {self.memory_after_mib}"
            + ("" if self.passed else "\n  PROBLEMS: " + "; ".join(self.problems))
        )

    def judge(self) -> None:
        """Add a problem for every reliability target missed (memory: the servers' PSS trees)."""
        rejection = REJECTIONS[self.path]
        other = {s: n for s, n in self.statuses.items() if s not in (OK, rejection)}
        if other:
            self.problems.append(f"undocumented statuses {other}")
        if not self.statuses.get(rejection):
            self.problems.append("nothing was rejected: the load did not exceed capacity")
        if self.late_rejections:
            self.problems.append(f"{self.late_rejections} rejections took over {REJECTION_SECONDS * 1000:.0f} ms")
        if self.accepted_p99_ms > P99_FACTOR * self.reference_p99_ms:
            self.problems.append(f"accepted p99 {self.accepted_p99_ms:.0f} ms > {P99_FACTOR}x reference")
        if self.wrong_outputs:
            self.problems.append(f"{self.wrong_outputs} wrong outputs")
        for name, mib in self.memory_after_mib.items():
            idle = self.memory_idle_mib[name]
            if mib > idle + max(0.1 * idle, 64):
                self.problems.append(f"{name} memory {idle} -> {mib} MiB")


def _pss(pids: dict[str, int]) -> dict[str, float]:
    return {name: round(tree_memory(pid).pss_mib, 1) for name, pid in pids.items()}


async def measure(
    path: str,
    target: GrpcTarget,
    server_pids: dict[str, int],
    *,
    seconds: float,
    factor: float = 3.0,
    capacity_concurrency: int,
    capacity_seconds: float = 8.0,
    reference_seconds: float = 10.0,
) -> OverloadResult:
    """Capacity, overload and reference of one path (`target` from `path_target`), judged."""
    await target.open(MAX_OUTSTANDING)
    try:
        await target.verify()  # once: after it, every answer is compared with its expected output
        say(
            f"{path}: capacity, closed loop at {capacity_concurrency} for {capacity_seconds:.0f}s after as long a warm-up ..."
        )
        # The window counts the calls sent in it: without a warm-up it would count the loop's first `concurrency`
        # calls too, and overstate the capacity by concurrency / seconds (96 / 5 s on resnet50's bounded queue).
        warm = await run_load(target, capacity_concurrency, capacity_seconds, warmup_s=capacity_seconds, verify=False)
        capacity = warm.throughput_rps
        if not capacity:
            raise RuntimeError(f"{path}: no request succeeded while measuring capacity: {warm.errors}")
        idle = _pss(server_pids)
        offered = factor * capacity
        say(f"{path}: {capacity:.1f}/s; offering {offered:.1f}/s for {seconds:.0f}s ...")
        load = OpenLoop(target, offered, MAX_OUTSTANDING, max_calls=max(1, int(offered * seconds)), wait_when_full=True)
        started = time.perf_counter()
        await load.run(seconds)
        wall = time.perf_counter() - started
        accepted = load.total.ms(OK)
        concurrency = max(1, round(len(accepted) / wall * float(accepted.mean()) / 1000)) if len(accepted) else 1
        say(f"{path}: reference, closed loop at {concurrency} (the accepted requests' concurrency) ...")
        reference = await run_load(target, concurrency, reference_seconds, warmup_s=0, verify=False)
        await asyncio.sleep(3)  # let arenas and queues settle
        after = _pss(server_pids)
    finally:
        await target.close()

    rejected = load.total.ms(REJECTIONS[path])
    accepted_p50, accepted_p99 = percentiles(accepted, [50, 99], 0.0)
    (rejection_p99,) = percentiles(rejected, [99], 0.0)
    result = OverloadResult(
        path=path,
        model=target.model,
        capacity_rps=capacity,
        offered_rps=offered,
        seconds=seconds,
        statuses=load.total.statuses,
        wrong_outputs=target.wrong,
        accepted_rps=len(accepted) / wall,
        accepted_p50_ms=accepted_p50,
        accepted_p99_ms=accepted_p99,
        accepted_concurrency=concurrency,
        reference_p99_ms=reference.p99_ms if reference.requests else 0.0,
        rejection_max_ms=float(rejected.max()) if len(rejected) else 0.0,
        rejection_p99_ms=rejection_p99,
        late_rejections=int((rejected > REJECTION_SECONDS * 1000).sum()),
        memory_idle_mib=idle,
        memory_after_mib=after,
    )
    result.judge()
    return result


def run_stack(args: argparse.Namespace, out: Path) -> list[OverloadResult]:
    """For each path, start tritonserver (supervised) and the facade on free ports and overload the path."""
    facade_args = ["--default-model", args.model, "--health-interval", "5"]
    images, expected = checked_images(args.model)
    results = []
    for path in args.paths:
        repository = REPOSITORY if path == "facade" else bounded_repository(out / "bounded", args.model)
        with ServingStack(repository, out / path, supervised=True, facade_args=facade_args) as stack:
            triton, facade, supervisor = stack.triton, stack.facade, stack.supervisor
            assert facade is not None and supervisor is not None  # a supervised stack with a facade
            pids = {"tritonserver": triton.pid, "facade": facade.pid}
            url = facade.grpc_url if path == "facade" else triton.grpc_url
            target = path_target(path, url, args.model, images, expected)
            concurrency = (
                FACADE_CAPACITY_CONCURRENCY
                if path == "facade"
                else held_requests((repository / args.model / CONFIG_FILE).read_text())
            )
            result = asyncio.run(
                measure(
                    path,
                    target,
                    pids,
                    seconds=args.seconds,
                    factor=args.factor,
                    capacity_concurrency=concurrency,
                )
            )
            running = all(s.process is not None and s.process.poll() is None for s in (triton, facade))
            if not running or supervisor.restarts:
                result.problems.append("a server went down")
            print(result.summary(), flush=True)
            results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.overload",
        description="Offer several times the measured capacity through the facade and directly to Triton, and "
        "check that every request succeeds with the right output or is rejected quickly with a documented status.",
    )
    add = parser.add_argument
    add("--model", default="resnet50", help="default: %(default)s")
    add("--paths", nargs="+", choices=["facade", "direct"], default=["facade", "direct"])
    add("--seconds", type=float, default=60.0, help="overload duration per path; default: %(default)s")
    add("--factor", type=float, default=3.0, help="offered load / capacity; default: %(default)s")
    add("--out", type=Path, help="logs and results.json go here; default: bench/results/<UTC timestamp>-overload")
    args = parser.parse_args(argv)
    _, out = run_folder(args.out, "overload")
    results = run_stack(args, out)
    write_json(out / "results.json", [asdict(r) for r in results])
    print(f"results: {out / 'results.json'}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
