"""python -m bench.studies.inprocess: Triton in the caller's process (its C API) against a KServe gRPC call to it.

Both paths serve mobilenet_v3_small from the checkout's repository through the project's Python backend directory,
each from an asyncio program of its own process: `grpc`, the facade's `TritonGateway` (KServe v2 gRPC, inputs through
its shared-memory region) calling a tritonserver process; `in-process`, libtritonserver of the nvidia-pytriton wheel
loaded with ctypes into the caller, requests made with TRITONSERVER_ServerInferAsync. Every answer is checked against
ONNX Runtime here. Rounds measure each path in turn, the order alternating: c=1, then c=16 with the CPU of every
process per call; per metric the median of the per-round ratios in-process/grpc with a distribution-free interval.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import signal
import sys
import tempfile
import traceback
from contextlib import ExitStack
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import psutil
from tritonclient.grpc import service_pb2

from bench import REPOSITORY
from bench.load import loops
from bench.load.targets import CALL_TIMEOUT_S, VerificationError, close_enough
from bench.output import Gate, finish, gates_section, head, machine, median_interval, run_folder, say, settings
from bench.peers.servers import reference_outputs, sample_images
from bench.studies.facade import compare
from bench.studies.triton_capi import InProcessTriton, TritonError
from bench.usage import cpu_seconds
from tritonnx.client.facade.errors import FacadeError
from tritonnx.client.facade.gateway import TritonGateway
from tritonnx.client.facade.settings import FacadeSettings
from tritonnx.client.facade.translate import InferCall
from tritonnx.server.process import free_ports
from tritonnx.server.repository import link_models
from tritonnx.server.triton import Ports, TritonServer

MODEL = "mobilenet_v3_small"
PATHS = ("grpc", "in-process")
READY_TIMEOUT_S = 300.0  # a worker's start: Triton and its stubs, on a busy machine
# metric -> (column, whether higher is better); CPU is ms per call answered over the c=16 run, warm-up included.
METRICS = {
    "c1_p50_ms": ("c=1 p50 (ms)", False),
    "c16_rps": ("c=16 req/s", True),
    "c16_p99_ms": ("c=16 p99 (ms)", False),
    "caller_ms": ("caller process CPU", False),
    "loop_ms": ("its event-loop thread", False),
    "triton_ms": ("Triton core CPU", False),
    "stub_ms": ("stubs CPU", False),
    "total_ms": ("all CPU", False),
}


class CheckedTarget:
    """A load target whose calls take `images` in turn, every answer checked against `expected` (ONNX Runtime's)."""

    name = ""
    model, batch, timeout_s = MODEL, 1, CALL_TIMEOUT_S

    def __init__(self, images: list[np.ndarray], expected: list[np.ndarray]) -> None:
        self.images, self.expected = images, expected
        self.wrong = 0  # answers unlike ONNX Runtime's
        self._next = 0

    @property
    def is_open(self) -> bool:
        return True

    async def open(self, concurrency: int = 1) -> None:
        pass

    async def close(self) -> None:
        pass

    async def answer(self, image: np.ndarray) -> np.ndarray:
        """The model's output for `image`; raises on a failed call."""
        raise NotImplementedError

    async def verify(self) -> None:
        try:
            output = await self.answer(self.images[0])
        except (FacadeError, TritonError, asyncio.TimeoutError) as error:
            raise VerificationError(f"{self.name}: the first call failed: {error!r}") from None
        if not close_enough(output.ravel(), self.expected[0]):
            raise VerificationError(f"{self.name}: the first answer is not ONNX Runtime's")

    async def call(self) -> str | None:
        index = self._next
        self._next = (index + 1) % len(self.images)
        try:
            output = await self.answer(self.images[index])
        except FacadeError as error:
            return error.code.name
        except TritonError as error:
            return error.code
        except asyncio.TimeoutError:
            return "DEADLINE_EXCEEDED"
        if not close_enough(output.ravel(), self.expected[index]):
            self.wrong += 1
        return None


class GatewayTarget(CheckedTarget):
    """What the facade does for a call, from its model's metadata on: TritonGateway.infer over KServe v2 gRPC."""

    name = "grpc"

    def __init__(self, url: str, admin_key: str, images: list[np.ndarray], expected: list[np.ndarray]) -> None:
        super().__init__(images, expected)
        self.url, self.admin_key = url, admin_key
        self.gateway: TritonGateway | None = None

    @property
    def is_open(self) -> bool:
        return self.gateway is not None

    async def open(self, concurrency: int = 1) -> None:
        facade = FacadeSettings()  # the facade's defaults: message limit, metadata TTL, shared-memory slots
        self.gateway = TritonGateway(
            self.url,
            facade.max_message_bytes,
            facade.model_info_ttl,
            shm_slots=facade.shm_slots,
            shm_slot_bytes=facade.shm_slot_bytes,
            admin_key=self.admin_key,
        )

    async def close(self) -> None:
        if self.gateway is not None:
            await self.gateway.close()
        self.gateway = None

    async def answer(self, image: np.ndarray) -> np.ndarray:
        assert self.gateway is not None
        info = await self.gateway.model_info(MODEL, "", self.timeout_s)
        header = service_pb2.ModelInferRequest(model_name=MODEL)
        header.inputs.add(name=info.inputs[0].name, datatype=info.inputs[0].datatype, shape=image.shape)
        response = await self.gateway.infer(InferCall(header, [image.data.cast("B")]), self.timeout_s)
        return np.frombuffer(response.raw_output_contents[0], np.float32)


class InProcessTarget(CheckedTarget):
    """The same inference through the C API of a Triton in this process."""

    name = "in-process"

    def __init__(self, triton: InProcessTriton, images: list[np.ndarray], expected: list[np.ndarray]) -> None:
        super().__init__(images, expected)
        self.triton = triton
        self.input, self.output = triton.metadata["inputs"][0]["name"], triton.metadata["outputs"][0]["name"]

    async def answer(self, image: np.ndarray) -> np.ndarray:
        return (await self.triton.infer({self.input: image}, self.timeout_s))[self.output]


def worker(path: str, config: dict, images: list[np.ndarray], expected: list[np.ndarray], pipe: Connection) -> None:
    """One path's asyncio program in a process of its own: a load run per `(concurrency, seconds)` received."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the study, which stops this process
    with ExitStack() as stack:
        try:
            target: CheckedTarget
            if path == "in-process":
                repository, backends, log = (Path(config[key]) for key in ("repository", "backends", "log"))
                triton = InProcessTriton.start(repository, MODEL, backends, log)
                stack.callback(triton.stop)
                target = InProcessTarget(triton, images, expected)
            else:
                target = GatewayTarget(config["url"], config["admin_key"], images, expected)
            pipe.send({"ready": True})
            while (command := pipe.recv()) is not None:
                concurrency, seconds = command
                target.wrong = 0
                result = loops.run(target, concurrency, seconds, min(1.0, seconds / 4))
                pipe.send({**result.as_dict(), "wrong": target.wrong})
        except Exception:
            pipe.send({"error": traceback.format_exc()})


class Worker:
    """A worker process, stopped by `stack`."""

    def __init__(self, path: str, config: dict, data: tuple[list, list], stack: ExitStack) -> None:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter, nothing of this one's threads
        self.path, (self.pipe, theirs) = path, context.Pipe()
        self.process = context.Process(target=worker, args=(path, config, *data, theirs), name=f"inprocess-{path}")
        self.process.start()
        stack.callback(self.stop)

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def answer(self, timeout: float) -> dict:
        if not self.pipe.poll(timeout):
            raise RuntimeError(f"the {self.path} worker did not answer within {timeout:.0f} s")
        answer = self.pipe.recv()
        if "error" in answer:
            raise RuntimeError(f"the {self.path} worker failed:\n{answer['error']}")
        return answer

    def run(self, concurrency: int, seconds: float) -> dict:
        self.pipe.send((concurrency, seconds))
        return self.answer(seconds + 2 * CALL_TIMEOUT_S + loops.HANG_MARGIN_S)

    def stop(self) -> None:
        if self.process.is_alive():
            self.pipe.send(None)
            self.process.join(30)  # an in-process Triton unloads its model first
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


def cpu_now(caller_pid: int, server_pid: int) -> dict[str, float]:
    """CPU seconds so far of the caller process, its event-loop thread, Triton's core and its stubs, and all of them.

    In-process (`server_pid` is the caller's) Triton's core is every thread of the caller but the loop's (the
    callbacks that Triton's threads run in Python included).
    """
    caller, server = psutil.Process(caller_pid), psutil.Process(server_pid)
    used = {"caller_ms": cpu_seconds(caller)}
    used["loop_ms"] = sum(t.user_time + t.system_time for t in caller.threads() if t.id == caller_pid)
    core = used["caller_ms"] if server_pid == caller_pid else cpu_seconds(server)  # one reading of one process
    used["stub_ms"] = sum(cpu_seconds(stub) for stub in server.children(recursive=True))
    used["triton_ms"] = core - used["loop_ms"] if server_pid == caller_pid else core
    used["total_ms"] = used["caller_ms"] + used["stub_ms"] + (0.0 if server_pid == caller_pid else core)
    return used


def measure(worker: Worker, server_pid: int, seconds: float) -> dict:
    """c=1 p50; c=16 throughput, p99 and each part's CPU per call answered (warm-up included)."""
    lone = worker.run(1, seconds)
    before = cpu_now(worker.pid, server_pid)
    busy = worker.run(16, seconds)
    after, calls = cpu_now(worker.pid, server_pid), busy["requests"] + busy["warmup_requests"]
    row = {"c1_p50_ms": lone["p50_ms"], "c16_rps": busy["throughput_rps"], "c16_p99_ms": busy["p99_ms"]}
    row |= {part: 1000 * (after[part] - before[part]) / calls if calls else float("nan") for part in after}
    errors = sum(lone["errors"].values()) + sum(busy["errors"].values())
    return row | {
        "calls": lone["requests"] + busy["requests"],
        "errors": errors,
        "wrong": lone["wrong"] + busy["wrong"],
    }


def report(results: dict, judged: list[Gate]) -> str:
    rounds, n = results["rounds"], len(results["rounds"])
    k, coverage = median_interval(n)
    lines = [
        f"# Triton in the caller's process against a KServe gRPC call ({results['started']})",
        "",
        f"{MODEL}, batch-1 requests of 8 random images in turn; each path's process checks every answer against "
        "ONNX Runtime's, computed beforehand (a cost both pay). grpc: an asyncio process calling a tritonserver process through the facade's TritonGateway "
        "(its defaults: inputs through shared memory). in-process: an asyncio process holding Triton itself "
        "(libtritonserver through ctypes, bench/studies/triton_capi.py), the same options, backend directory and "
        f"config. Per round, each path in turn, the order alternating: c=1, then c=16, {results['settings']['seconds']}"
        " s each. CPU: ms per call answered over the c=16 run, warm-up included; the caller process is the whole "
        "in-process one (Triton's core is inside: its threads other than the event loop's, with the Python "
        f"callbacks Triton's threads run); grpc's Triton core is the tritonserver process. Machine: {results['machine']}.",
        "",
        "Triton's KServe ports are not in the in-process server: the HTTP and gRPC frontends are compiled into the "
        "tritonserver binary, not libtritonserver; keeping them needs those frontends built against the library (no "
        "2.51 build of them for Python exists on pip), or a KServe server of one's own over the C API.",
    ]
    for entry in rounds:
        lines += ["", f"## Round {entry['round']}", "", *head(f"path | {' | '.join(c for c, _ in METRICS.values())}")]
        lines += [f"| {path} | {' | '.join(f'{entry[path][m]:.3f}' for m in METRICS)} |" for path in entry["order"]]
    interval = f"Interval: [r_({k}), r_({n - k + 1})] of the {n} per-round ratios r, sorted: {coverage:.1%} coverage."
    lines += ["", "## In-process against grpc", "", interval, ""]
    lines += head("metric | in-process (median) | grpc (median) | ratio (median) | interval | verdict")
    for metric, (column, _) in METRICS.items():
        s = results["summary"][metric]
        figures = " | ".join(f"{s[key]:.3f}" for key in ("current", "baseline", "ratio"))
        verdict = s["verdict"].replace("current", "in-process")
        lines.append(f"| {column} | {figures} | [{s['interval'][0]:.3f}, {s['interval'][1]:.3f}] | {verdict} |")
    return "\n".join(lines) + "\n\n" + gates_section(judged)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.inprocess",
        description="Triton in the caller's process (its C API) against the facade's KServe gRPC call to tritonserver.",
        epilog="Example (about 8 minutes): python -m bench.studies.inprocess --rounds 9 --seconds 10",
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; default: %(default)s")
    parser.add_argument("--seconds", type=float, default=5.0, help="per load run; default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC time>-inprocess")
    args = parser.parse_args(argv)
    if args.rounds < 1 or not args.seconds > 0:
        parser.error("--rounds and --seconds must be positive")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped, it cleans up as on Ctrl-C
    started, out = run_folder(args.out, "inprocess")
    results: dict = {"started": started, "settings": settings(args), "machine": machine()}
    images = sample_images(8)
    data = (images, reference_outputs(REPOSITORY / MODEL / "1" / "model.onnx", images))
    rounds: list[dict] = []
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tritonnx-inprocess-")))
        repository = link_models(folder / "repository", {MODEL: REPOSITORY / MODEL})
        triton = TritonServer(
            model_repository=repository,
            ports=Ports(*free_ports(3)),
            backend_dir=folder / "backends",
            log_file=out / "tritonserver.log",
            http=False,
            startup_models=(MODEL,),
        )
        stack.callback(triton.stop)
        triton.start()
        grpc = Worker("grpc", {"url": triton.grpc_url, "admin_key": triton.admin_key}, data, stack)
        config = {"repository": str(repository), "backends": str(folder / "backends-in-process")}
        inprocess = Worker("in-process", config | {"log": str(out / "tritonserver-in-process.log")}, data, stack)
        triton.wait_ready()
        for started_worker in (grpc, inprocess):
            started_worker.answer(READY_TIMEOUT_S)
        workers = {"grpc": (grpc, triton.pid), "in-process": (inprocess, inprocess.pid)}
        say(f"tritonserver {triton.pid} at {triton.grpc_url}; in-process Triton in {inprocess.pid}")
        for number in range(1, args.rounds + 1):
            rounds.append({"round": number, "order": list(PATHS)[:: 1 if number % 2 else -1]})
            for path in rounds[-1]["order"]:
                row = rounds[-1][path] = measure(*workers[path], args.seconds)
                figures = ", ".join(f"{column} {row[metric]:.3f}" for metric, (column, _) in METRICS.items())
                say(f"round {number}/{args.rounds}, {path}: {figures}, {row['calls']} calls, {row['errors']} errors")
    pairs = {metric: [(r["in-process"][metric], r["grpc"][metric]) for r in rounds] for metric in METRICS}
    results |= {"rounds": rounds, "summary": {m: compare(pairs[m], higher) for m, (_, higher) in METRICS.items()}}
    calls, errors, wrong = ([r[path][key] for r in rounds for path in PATHS] for key in ("calls", "errors", "wrong"))
    detail = f"{sum(calls)} calls, {sum(errors)} errors, {sum(wrong)} answers unlike ONNX Runtime's"
    judged = [
        Gate(
            "every call answered, as ONNX Runtime answers, on both paths",
            all(calls) and not any(errors) and not any(wrong),
            detail,
        )
    ]
    return finish(out, report(results, judged), judged, results)


if __name__ == "__main__":
    sys.exit(main())
