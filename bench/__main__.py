"""python -m bench: the whole benchmark in one run (make bench); docs/benchmarks.md says what it measures.

Each model's measurements are interleaved (the limit before and after the servers) so that the machine's drift shows.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import REPOSITORY
from bench.baseline.workers import setups
from bench.cpu import images_inferred, measured, perf_analyzer_with_cpu
from bench.floor import measure_floor
from bench.limit import measure_limit, measure_single_image
from bench.load import loops
from bench.load.targets import FacadeTarget, KServeTarget, Target
from bench.output import CORES, machine, run_folder, say, settings
from bench.peers import servers
from bench.report import write_report
from bench.usage import tree_memory
from tritonnx.server.process import free_ports
from tritonnx.server.repository import link_models
from tritonnx.server.stack import ServingStack
from tritonnx.server.triton import Ports, TritonServer


def sweep(
    label: str, target: Callable[[], Target], concurrencies: list[int], duration: float, cpu_of: Callable
) -> list:
    """One load generator run per concurrency, with the CPU per image `cpu_of(run)` measured while it ran."""
    points = []
    for concurrency in concurrencies:

        def run(concurrency: int = concurrency) -> loops.LoadResult:
            return loops.run(target(), concurrency, duration_s=duration, warmup_s=min(1.0, duration / 4))

        result, cpu = cpu_of(run)
        points.append(servers.said(label, {**result.as_dict(), "cpu_ms_per_image": cpu}))
    return points


def triton_and_facade(model: str, args: argparse.Namespace, workdir: Path, data: dict) -> None:
    """perf_analyzer on Triton direct, then the load generator on it and the facade (CPU per image); their memory."""
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    stack = ServingStack(
        REPOSITORY,
        workdir / model,
        backend_dir=workdir / "backends",
        facade_args=["--default-model", model, "--health-interval", "30", "--max-in-flight", "1024"],
    )
    try:
        triton = stack.start_triton()
        inferred = images_inferred(triton, model)
        data["perf_analyzer"] = []
        for concurrency in args.concurrency:
            # At c=1 the in-process reference for a lone request is measured just before and just after it.
            beside = [measure_single_image(onnx_file, CORES, args.limit_seconds / 2)] if concurrency == 1 else []
            point = perf_analyzer_with_cpu(triton, model, concurrency, int(args.duration * 1000), CORES)
            data["perf_analyzer"].append(point)
            if beside:
                beside.append(measure_single_image(onnx_file, CORES, args.limit_seconds / 2))
                data["single_image_beside_c1"] = {
                    "p50_ms": (beside[0][0] + beside[1][0]) / 2,
                    "p99_ms": (beside[0][1] + beside[1][1]) / 2,
                    "before_p50_ms": beside[0][0],
                    "after_p50_ms": beside[1][0],
                }
            say(
                f"  perf_analyzer c={concurrency}: {point['throughput']:.1f} img/s, p50 {point['p50_ms']:.2f} ms, "
                f"p99 {point['p99_ms']:.2f} ms, queue {point['server_queue_ms']:.2f} ms, avg batch {point['avg_batch']:.2f}"
            )
        # Only now: perf_analyzer unregisters every shared-memory region when it exits, the facade's among them.
        facade = stack.start_facade()
        for key, label, make, others in (
            ("loadgen_kserve", "Triton direct", lambda: KServeTarget(triton.grpc_url, model, 1), {}),
            ("facade", "facade", lambda: FacadeTarget(facade.grpc_url, model, 1), {"facade": facade.pid}),
        ):
            cpu_of = lambda run, others=others: measured(run, triton.pid, inferred, CORES, others, "client")  # noqa: E731
            data[key] = sweep(label, make, args.concurrency, args.duration, cpu_of)
        data["servers"]["tritonserver (all models, after load)"] = tree_memory(triton.pid).as_dict()
        data["servers"]["facade (after load)"] = tree_memory(facade.pid).as_dict()
    finally:
        stack.stop()


def bench_model(model: str, args: argparse.Namespace, workdir: Path) -> dict:
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    data: dict = {"servers": {}, "peers": {}}
    say(f"{model}: limit (in-process ONNX Runtime, {CORES} threads) ...")
    before = measure_limit(onnx_file, model, threads=CORES, seconds=args.limit_seconds)
    say(f"  best {before.best[1]:.1f} img/s ({before.best[0]}), single image p50 {before.single_p50_ms:.2f} ms")
    say(f"{model}: Triton direct and the facade ...")
    triton_and_facade(model, args, workdir, data)

    # The same server and config with a model that computes nothing: what serving costs by itself.
    # At the lowest concurrency and where the CPU table is read (c=16, else the highest).
    floor_at = sorted({min(args.concurrency), 16 if 16 in args.concurrency else max(args.concurrency)})
    say(f"{model}: the serving floor (same config, inputs and outputs, no compute) at c={floor_at} ...")
    data["floor"] = measure_floor(model, REPOSITORY, workdir, floor_at, int(args.duration * 1000), CORES)
    for point in data["floor"]:
        say(
            f"  floor c={point['concurrency']}: {point['throughput']:.1f} img/s, p50 {point['p50_ms']:.2f} ms, "
            f"CPU {point['cpu_ms_per_image'].get('total', 0):.2f} ms per image"
        )

    peers: list[servers.Server] = [servers.FastApi(onnx_file, setup, workdir) for setup in setups(CORES)]
    if not args.skip_pytriton:
        peers.append(servers.peer("pytriton", model, onnx_file, servers.Policy.of(REPOSITORY / model, CORES), workdir))
    for server in peers:
        say(f"{model}: {server.name} ({server.description}) ...")
        record = servers.closed_loop(server, onnx_file, args.concurrency, args.duration)
        if "error" in record:
            say(f"  {server.name} left out: {record['error']}")
        data["peers"][server.name] = {"setup": server.description, "rounds": [record]}

    say(f"{model}: limit again ...")
    after = measure_limit(onnx_file, model, threads=CORES, seconds=args.limit_seconds)
    say(f"  best {after.best[1]:.1f} img/s ({after.best[0]})")
    data["limit"] = {  # each figure the mean of the two
        "before": before.best[1],
        "after": after.best[1],
        "images_per_s": (before.best[1] + after.best[1]) / 2,
        "layout": before.best[0],
        "cores": CORES,
        "details": [before.as_dict(), after.as_dict()],
        "single_p50_ms": (before.single_p50_ms + after.single_p50_ms) / 2,
        "single_p99_ms": (before.single_p99_ms + after.single_p99_ms) / 2,
        "cpu_ms_per_image": (before.cpu_ms_per_image[before.best[0]] + after.cpu_ms_per_image[after.best[0]]) / 2,
    }
    # Twice: the first start reads the model files from wherever the kernel left them (a machine
    # that reclaims idle page cache makes it a cold start); the second finds them in memory.
    say(f"{model}: tritonserver start-up with only this model (twice: as found, then warm) ...")
    first, startup = triton_startup(model), triton_startup(model)
    data["servers"][f"tritonserver ({model} only, idle)"] = {**startup, "first_ready_seconds": first["ready_seconds"]}
    say(f"  READY after {first['ready_seconds']:.2f}s, then {startup['ready_seconds']:.2f}s; {startup['pss_mib']} MiB")
    return data


def triton_startup(model: str, timeout: float = 180) -> dict:
    """Seconds from the start of a tritonserver serving only `model` until it answers (polled every 0.1 s); its memory."""
    with tempfile.TemporaryDirectory(prefix="tritonnx-startup-") as tmp:
        workdir = Path(tmp)
        server = TritonServer(
            model_repository=link_models(workdir / "repo", {model: REPOSITORY / model}),
            ports=Ports(*free_ports(3)),
            backend_dir=workdir / "backends",
            log_file=workdir / "tritonserver.log",
        )
        started = time.perf_counter()
        with server:
            server.wait_ready(timeout)
            ready = time.perf_counter() - started
            time.sleep(1.0)  # let the stubs settle before reading memory
            return {"ready_seconds": round(ready, 2), **tree_memory(server.pid).as_dict()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark tritonnx against in-process ONNX Runtime, a FastAPI baseline and PyTriton, in one run.",
        epilog="Example: python -m bench --models mobilenet_v3_small --concurrency 1 4 16 --duration 5",
    )
    parser.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v3_small"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measured point; default: %(default)s")
    parser.add_argument("--limit-seconds", type=float, default=4.0, help="per in-process point; default: %(default)s")
    parser.add_argument("--skip-pytriton", action="store_true", help="leave out PyTriton (a venv under build/peers/)")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>")
    args = parser.parse_args(argv)

    started, out = run_folder(args.out, "")
    results: dict[str, Any] = {"started": started, "machine": machine(), "settings": settings(args), "models": {}}
    for model in args.models:
        results["models"][model] = bench_model(model, args, out / "logs")
        write_report(out, results)  # a partial report survives an interrupted run
    say(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
