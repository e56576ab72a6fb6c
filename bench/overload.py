"""python -m bench.overload: offer 3x a path's capacity and check that nothing breaks.

For one path at a time (the facade's Predict, or Triton's KServe ModelInfer directly, as a
tritonclient user sends it) and one model:

1. capacity: a closed loop at 48 in flight (3 full batches; keep it within the facade's
   --max-in-flight) for a few seconds -> requests/s;
2. idle memory of the servers (PSS of each process tree), after that warm-up has made them
   serve their largest batches;
3. overload: an open loop sending `--factor` x capacity requests/s for `--seconds`, each request
   one of a few images whose expected output was computed in-process with ONNX Runtime;
4. reference: a closed loop at the concurrency the accepted requests had during the overload
   (Little's law: accepted/s x mean latency), for their p99 without overload;
5. memory again, after a short settle.

Verdict, per the reliability targets: every request ends as a success or a documented rejection
(RESOURCE_EXHAUSTED from the facade, UNAVAILABLE from Triton's queue) returned within 50 ms; the
accepted requests' p99 is at most 2x the reference p99; no wrong output; the servers stay up and
their memory is back within 10% (or 64 MiB) of idle.

Every loop is bounded: the open loop sends exactly rate x seconds requests, at most
`--max-outstanding` at once, each with a deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
from tritonclient.grpc import service_pb2

from backend.supervisor import TritonSupervisor
from backend.tritonserver import PROJECT_ROOT, Ports, TritonServer, free_ports
from bench.resources import tree_memory
from client.proto import inference_pb2
from client.serve import FacadeProcess

REJECTIONS = {"facade": "RESOURCE_EXHAUSTED", "direct": "UNAVAILABLE"}
REJECTION_SECONDS = 0.05
P99_FACTOR = 2.0
CALL_TIMEOUT_S = 30.0
IMAGE_SHAPE = [1, 3, 224, 224]


def expected_outputs(onnx_file: Path, images: list[np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return [session.run(None, {name: image})[0].reshape(-1) for image in images]


def close_enough(actual: np.ndarray, expected: np.ndarray) -> bool:
    scale = float(np.abs(expected).max()) or 1.0
    return actual.shape == expected.shape and bool(np.allclose(actual, expected, rtol=1e-4, atol=1e-4 * scale))


class Route:
    """One way in: requests prebuilt as bytes, responses decoded to the flat output."""

    name: str
    method: str

    def __init__(self, url: str, model: str, images: list[np.ndarray]) -> None:
        self.url, self.model = url, model
        self.requests = [self.build(image) for image in images]
        self._channel: grpc.aio.Channel | None = None
        self._call = None

    def build(self, image: np.ndarray) -> bytes:
        raise NotImplementedError

    def output(self, response: bytes) -> np.ndarray:
        raise NotImplementedError

    async def open(self) -> None:
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        self._channel = grpc.aio.insecure_channel(self.url, options=options)
        self._call = self._channel.unary_unary(self.method, request_serializer=None, response_deserializer=None)

    async def close(self) -> None:
        await self._channel.close()

    async def send(self, index: int) -> tuple[str, np.ndarray | None]:
        try:
            response = await self._call(self.requests[index], timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            return error.code().name, None
        return "OK", self.output(response)


class FacadeRoute(Route):
    name, method = "facade", "/inference.InferenceService/Predict"

    def build(self, image: np.ndarray) -> bytes:
        return inference_pb2.PredictRequest(raw_data=image.tobytes(), shape=list(image.shape),
                                            model_name=self.model).SerializeToString()

    def output(self, response: bytes) -> np.ndarray:
        return np.array(inference_pb2.PredictResponse.FromString(response).predictions, np.float32)


class DirectRoute(Route):
    name, method = "direct", "/inference.GRPCInferenceService/ModelInfer"

    def build(self, image: np.ndarray) -> bytes:
        request = service_pb2.ModelInferRequest(model_name=self.model)
        request.inputs.add(name="input", datatype="FP32", shape=list(image.shape))
        request.raw_input_contents.append(image.tobytes())
        return request.SerializeToString()

    def output(self, response: bytes) -> np.ndarray:
        return np.frombuffer(service_pb2.ModelInferResponse.FromString(response).raw_output_contents[0], "<f4")


@dataclass
class Calls:
    """Every call of a phase: when it was sent, how long it took, how it ended."""

    sent: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    status: list[str] = field(default_factory=list)
    wrong: int = 0

    def add(self, sent: float, seconds: float, status: str) -> None:
        self.sent.append(sent)
        self.seconds.append(seconds)
        self.status.append(status)

    def latencies(self, status: str) -> np.ndarray:
        return np.array([s for s, st in zip(self.seconds, self.status) if st == status])


async def _one(route: Route, index: int, expected: list[np.ndarray], calls: Calls) -> None:
    started = time.perf_counter()
    status, output = await route.send(index)
    calls.add(started, time.perf_counter() - started, status)
    if output is not None and not close_enough(output, expected[index]):
        calls.wrong += 1


async def closed_loop(route: Route, expected: list[np.ndarray], concurrency: int, seconds: float) -> Calls:
    calls, end = Calls(), time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        count = offset
        while time.perf_counter() < end:
            await _one(route, count % len(route.requests), expected, calls)
            count += 1

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return calls


async def open_loop(route: Route, expected: list[np.ndarray], rate: float, seconds: float, max_outstanding: int) -> Calls:
    """Send rate x seconds requests on a fixed schedule; a send that would exceed
    `max_outstanding` waits (and is counted late), so the loop stays bounded."""
    calls, total = Calls(), int(rate * seconds)
    slots = asyncio.Semaphore(max_outstanding)
    tasks = []
    start = time.perf_counter()

    async def guarded(index: int) -> None:
        try:
            await _one(route, index, expected, calls)
        finally:
            slots.release()

    for number in range(total):
        delay = start + number / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await slots.acquire()
        tasks.append(asyncio.create_task(guarded(number % len(route.requests))))
    await asyncio.gather(*tasks)
    return calls


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
    problems: list[str]

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


def _pss(pids: dict[str, int]) -> dict[str, float]:
    return {name: round(tree_memory(pid).pss_mib, 1) for name, pid in pids.items()}


def _percentile_ms(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q) * 1000) if len(values) else 0.0


async def measure(
    route: Route,
    expected: list[np.ndarray],
    server_pids: dict[str, int],
    *,
    seconds: float,
    factor: float = 3.0,
    capacity_concurrency: int = 48,
    capacity_seconds: float = 8.0,
    max_outstanding: int = 1024,
    say=print,
) -> OverloadResult:
    await route.open()
    try:
        say(f"{route.name}: capacity, closed loop at {capacity_concurrency} for {capacity_seconds:.0f}s ...")
        warm = await closed_loop(route, expected, capacity_concurrency, capacity_seconds)
        capacity = warm.status.count("OK") / capacity_seconds
        if not capacity:
            raise RuntimeError(f"{route.name}: no request succeeded while measuring capacity: {dict(Counter(warm.status))}")
        idle = _pss(server_pids)
        offered = factor * capacity
        say(f"{route.name}: {capacity:.1f}/s; offering {offered:.1f}/s for {seconds:.0f}s ...")
        started = time.perf_counter()
        calls = await open_loop(route, expected, offered, seconds, max_outstanding)
        wall = time.perf_counter() - started
        accepted = calls.latencies("OK")
        concurrency = max(1, round(len(accepted) / wall * float(accepted.mean()))) if len(accepted) else 1
        say(f"{route.name}: reference, closed loop at {concurrency} (the accepted requests' concurrency) ...")
        reference = await closed_loop(route, expected, concurrency, max(capacity_seconds, 10.0))
        await asyncio.sleep(3)  # let arenas and queues settle
        after = _pss(server_pids)
    finally:
        await route.close()

    rejection = REJECTIONS[route.name]
    rejected = calls.latencies(rejection)
    statuses = Counter(calls.status)
    result = OverloadResult(
        path=route.name, model=route.model, capacity_rps=capacity, offered_rps=offered, seconds=seconds,
        statuses=dict(statuses), wrong_outputs=calls.wrong + reference.wrong + warm.wrong,
        accepted_rps=len(accepted) / wall, accepted_p50_ms=_percentile_ms(accepted, 50),
        accepted_p99_ms=_percentile_ms(accepted, 99), accepted_concurrency=concurrency,
        reference_p99_ms=_percentile_ms(reference.latencies("OK"), 99),
        rejection_max_ms=float(rejected.max() * 1000) if len(rejected) else 0.0,
        rejection_p99_ms=_percentile_ms(rejected, 99),
        late_rejections=int((rejected > REJECTION_SECONDS).sum()),
        memory_idle_mib=idle, memory_after_mib=after, problems=[],
    )
    other = {s: n for s, n in statuses.items() if s not in ("OK", rejection)}
    if other:
        result.problems.append(f"undocumented statuses {other}")
    if not len(rejected):
        result.problems.append("nothing was rejected: the load did not exceed capacity")
    if result.late_rejections:
        result.problems.append(f"{result.late_rejections} rejections took longer than {REJECTION_SECONDS * 1000:.0f} ms")
    if result.accepted_p99_ms > P99_FACTOR * result.reference_p99_ms:
        result.problems.append(f"accepted p99 {result.accepted_p99_ms:.0f} ms > {P99_FACTOR}x reference")
    if result.wrong_outputs:
        result.problems.append(f"{result.wrong_outputs} wrong outputs")
    for name, mib in after.items():
        if mib > idle[name] + max(0.1 * idle[name], 64):
            result.problems.append(f"{name} memory {idle[name]} -> {mib} MiB")
    return result


def run_stack(args: argparse.Namespace) -> list[OverloadResult]:
    """Start tritonserver (supervised) and the facade on free ports, overload each path in turn."""
    repository = PROJECT_ROOT / "model_repository"
    args.out.mkdir(parents=True, exist_ok=True)
    triton = TritonServer(model_repository=repository, ports=Ports(*free_ports(3)),
                          log_file=args.out / "tritonserver.log")
    grpc_port, http_port = free_ports(2)
    facade = FacadeProcess(grpc_port=grpc_port, http_port=http_port, triton_url=triton.grpc_url,
                           log_file=args.out / "facade.log", admin_key=triton.admin_key,
                           extra_args=["--default-model", args.model, "--health-interval", "5"])
    supervisor = TritonSupervisor(triton)
    rng = np.random.default_rng(0)
    images = [rng.standard_normal(IMAGE_SHAPE, dtype=np.float32) for _ in range(4)]
    expected = expected_outputs(repository / args.model / "1" / "model.onnx", images)
    results = []
    triton.start()
    try:
        triton.wait_ready(180)
        supervisor.start()
        facade.start()
        facade.wait_ready()
        pids = {"tritonserver": triton.process.pid, "facade": facade.process.pid}
        for name in args.paths:
            route = (FacadeRoute(facade.grpc_url, args.model, images) if name == "facade"
                    else DirectRoute(triton.grpc_url, args.model, images))
            result = asyncio.run(measure(route, expected, pids, seconds=args.seconds, factor=args.factor))
            alive = triton.process.poll() is None and facade.process.poll() is None and not supervisor.restarts
            if not alive:
                result.problems.append("a server went down")
            print(result.summary(), flush=True)
            results.append(result)
    finally:
        supervisor.stop()
        facade.stop()
        triton.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.overload",
        description="Offer several times the measured capacity through the facade and directly to Triton, and "
        "check that every request succeeds with the right output or is rejected quickly with a documented status.",
    )
    parser.add_argument("--model", default="resnet50", help="default: %(default)s")
    parser.add_argument("--paths", nargs="+", choices=["facade", "direct"], default=["facade", "direct"])
    parser.add_argument("--seconds", type=float, default=60.0, help="overload duration per path; default: %(default)s")
    parser.add_argument("--factor", type=float, default=3.0, help="offered load / capacity; default: %(default)s")
    parser.add_argument("--out", type=Path, default=Path("bench/results") / time.strftime("%Y%m%d-%H%M%S-overload"),
                        help="logs and results.json go here; default: bench/results/<timestamp>-overload")
    args = parser.parse_args(argv)
    results = run_stack(args)
    (args.out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    print(f"results: {args.out / 'results.json'}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
