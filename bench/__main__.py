"""python -m bench: the whole benchmark in one run (make bench).

For each model, interleaved so that the machine's drift shows: the in-process limit, Triton
direct (perf_analyzer, and the project's load generator), the facade, the FastAPI baseline in
its documented layouts (each run's CPU split over its workers checked), PyTriton (from its own venv),
the limit again; then start-up time and memory of each server. Every server's answers are checked
against in-process ONNX Runtime before it is measured. Writes
bench/results/<timestamp>/{report.md,results.json,*.png}.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import REPOSITORY, RESULTS
from bench.baseline.server import FastApiBaseline
from bench.baseline.workers import measured_split, setups
from bench.cpu import images_inferred, measured, perf_analyzer_with_cpu
from bench.floor import measure_floor
from bench.limit import measure_limit, measure_single_image
from bench.load import loops
from bench.load.http import HttpTarget
from bench.load.targets import FacadeTarget, KServeTarget, VerificationError
from bench.output import CORES, machine, say, settings
from bench.peers.reference import check_answers, reference_outputs, sample_images
from bench.peers.servers import Policy, peer
from bench.peers.venvs import VenvError
from bench.report import write_report
from bench.startup import measure_triton_startup
from bench.usage import tree_memory
from tritonnx.server.process import ServerError, free_ports
from tritonnx.server.stack import ServingStack
from tritonnx.server.triton import Ports


def sweep(
    label: str, make_target, concurrencies: list[int], duration: float, cpu_of=None, key: str = "cpu_ms_per_image"
) -> list[dict]:
    """One load generator run per concurrency.

    `cpu_of(run)` (or `cpu_of(run, concurrency)` for another `key`) runs it and measures where the CPU went (see
    bench.cpu), for servers whose processes the benchmark can see; it is kept in the point under `key`.
    """
    points = []
    for concurrency in concurrencies:

        def run(concurrency=concurrency):
            return loops.run(make_target(), concurrency, duration_s=duration, warmup_s=min(1.0, duration / 4))

        if cpu_of is None:
            result, cpu = run(), None
        else:
            result, cpu = cpu_of(run) if key == "cpu_ms_per_image" else cpu_of(run, concurrency)
        point = result.as_dict()
        if cpu:
            point[key] = cpu
        points.append(point)
        say(
            f"  {label} c={concurrency}: {point['images_per_s']:.1f} img/s, p50 {point['p50_ms']:.2f} ms, "
            f"p99 {point['p99_ms']:.2f} ms, client CPU {point['client_cpu']:.2f}, errors {sum(point['errors'].values())}"
        )
    return points


def bench_model(model: str, args: argparse.Namespace, workdir: Path) -> dict:
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    data: dict = {"servers": {}}
    say(f"{model}: limit (in-process ONNX Runtime, {CORES} threads) ...")
    before = measure_limit(onnx_file, model, threads=CORES, seconds=args.limit_seconds)
    say(f"  best {before.best[1]:.1f} img/s ({before.best[0]}), single image p50 {before.single_p50_ms:.2f} ms")

    stack = ServingStack(
        REPOSITORY,
        workdir / model,
        backend_dir=workdir / "backends",
        # The health probe runs real inferences: keep it rare and on the model under test.
        facade_args=["--default-model", model, "--health-interval", "30", "--max-in-flight", "1024"],
    )
    say(f"{model}: Triton direct and the facade ...")
    try:
        triton = stack.start_triton()
        inferred = images_inferred(triton, model)

        def cpu_of(run, others=None, own_role=None):
            return measured(run, triton.pid, inferred, CORES, others, own_role)

        data["perf_analyzer"] = []
        for concurrency in args.concurrency:
            if concurrency == 1:  # the in-process reference for a lone request, just before it
                single_before = measure_single_image(onnx_file, CORES, seconds=args.limit_seconds / 2)
            point = perf_analyzer_with_cpu(triton, model, concurrency, int(args.duration * 1000), CORES)
            data["perf_analyzer"].append(point)
            if concurrency == 1:  # ... and just after it, tritonserver idle meanwhile
                single_after = measure_single_image(onnx_file, CORES, seconds=args.limit_seconds / 2)
                data["single_image_beside_c1"] = {
                    "p50_ms": (single_before[0] + single_after[0]) / 2,
                    "p99_ms": (single_before[1] + single_after[1]) / 2,
                    "before_p50_ms": single_before[0],
                    "after_p50_ms": single_after[0],
                }
            say(
                f"  perf_analyzer c={concurrency}: {point['throughput']:.1f} img/s, p50 {point['p50_ms']:.2f} ms, "
                f"p99 {point['p99_ms']:.2f} ms, queue {point['server_queue_ms']:.2f} ms, avg batch {point['avg_batch']:.2f}"
            )
        # Only now: perf_analyzer unregisters every shared-memory region when it exits, the
        # facade's among them.
        facade = stack.start_facade()
        data["loadgen_kserve"] = sweep(
            "Triton direct",
            lambda: KServeTarget(triton.grpc_url, model, 1),
            args.concurrency,
            args.duration,
            lambda run: cpu_of(run, own_role="client"),
        )
        data["facade"] = sweep(
            "facade",
            lambda: FacadeTarget(facade.grpc_url, model, 1),
            args.concurrency,
            args.duration,
            lambda run: cpu_of(run, {"facade": facade.pid}, own_role="client"),
        )
        data["servers"]["tritonserver (all models, after load)"] = tree_memory(triton.pid).as_dict()
        data["servers"]["facade (after load)"] = tree_memory(facade.pid).as_dict()
    finally:
        stack.stop()

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

    data["fastapi"] = {}
    if not args.skip_fastapi:
        data["fastapi"] = bench_fastapi(model, onnx_file, args, workdir, data["servers"])
    if not args.skip_pytriton:
        data["pytriton"] = bench_pytriton(model, onnx_file, args, workdir, data["servers"])

    say(f"{model}: limit again ...")
    after = measure_limit(onnx_file, model, threads=CORES, seconds=args.limit_seconds)
    say(f"  best {after.best[1]:.1f} img/s ({after.best[0]})")
    data["limit"] = {
        "before": before.best[1],
        "after": after.best[1],
        "images_per_s": (before.best[1] + after.best[1]) / 2,
        "layout": before.best[0],
        "single_p50_ms": (before.single_p50_ms + after.single_p50_ms) / 2,
        "cpu_ms_per_image": (before.cpu_ms_per_image[before.best[0]] + after.cpu_ms_per_image[after.best[0]]) / 2,
        "cores": CORES,
        "single_p99_ms": (before.single_p99_ms + after.single_p99_ms) / 2,
        "details": [before.as_dict(), after.as_dict()],
    }
    # Twice: the first start reads the model files from wherever the kernel left them (a machine
    # that reclaims idle page cache makes it a cold start); the second finds them in memory.
    say(f"{model}: tritonserver start-up with only this model (twice: as found, then warm) ...")
    first = measure_triton_startup(model, Ports(*free_ports(3)))
    startup = measure_triton_startup(model, Ports(*free_ports(3)))
    data["servers"][f"tritonserver ({model} only, idle)"] = {
        **startup.as_dict(),
        "first_ready_seconds": round(first.ready_seconds, 2),
    }
    say(
        f"  READY after {first.ready_seconds:.2f}s, then {startup.ready_seconds:.2f}s; PSS {startup.memory.pss_mib:.0f} MiB"
    )
    return data


def bench_fastapi(model: str, onnx_file: Path, args: argparse.Namespace, workdir: Path, servers: dict) -> dict:
    """Each documented layout of the FastAPI baseline, with every run's CPU split over its workers."""
    results = {}
    for setup in setups(CORES):
        say(f"{model}: FastAPI baseline, {setup.name} ({setup.why}) ...")
        log = workdir / f"fastapi-{model}-{setup.workers}x{setup.threads}.log"
        baseline = FastApiBaseline(onnx_file=onnx_file, port=free_ports(1)[0], workers=setup.workers,
                                   intra_op_threads=setup.threads, log_file=log)  # fmt: skip
        with baseline as server:
            images = sample_images()
            check_answers(HttpTarget(server.url, 1, images=images, expected=reference_outputs(onnx_file, images)),
                          len(images))  # fmt: skip
            memory = tree_memory(server.pid).as_dict()
            points = sweep(
                f"FastAPI {setup.workers}x{setup.threads}",
                lambda server=server: HttpTarget(server.url, 1, model=model),
                args.concurrency,
                args.duration,
                lambda run, concurrency, server=server: measured_split(run, server.worker_pids, concurrency),
                key="worker_cpu",
            )
        for point in points:
            point["setup"] = setup.name
            split = point.get("worker_cpu", {})
            if split.get("spread") is not None:
                say(f"    worker CPU shares {split['shares']}: {'spread' if split['spread'] else 'NOT spread'}"
                    f" ({split['runs']} run(s))")  # fmt: skip
        results[setup.name] = {"points": points, "why": setup.why}
        servers[f"FastAPI {setup.name}"] = {"ready_seconds": round(server.startup_seconds, 2), **memory}
    return results


def bench_pytriton(model: str, onnx_file: Path, args: argparse.Namespace, workdir: Path, servers: dict) -> dict:
    """PyTriton with the model's own policy, from its venv, its answers checked first.

    A venv that cannot be made, or wrong answers, are reported, not fatal.
    """
    policy = Policy.of(REPOSITORY / model, CORES)
    server = peer("pytriton", model, onnx_file, policy, workdir)
    say(f"{model}: PyTriton ({server.description}) ...")
    try:
        started = time.monotonic()
        server.start()
    except (VenvError, ServerError) as error:
        say(f"  PyTriton left out: {error}")
        return {"skipped": str(error)}
    try:
        ready = time.monotonic() - started
        images = sample_images()
        try:
            check_answers(server.target(images, reference_outputs(onnx_file, images)), len(images))
        except VerificationError as error:
            say(f"  PyTriton answered wrong, not measured: {error}")
            return {"failed": str(error)}
        points = sweep("PyTriton", lambda: server.target(), args.concurrency, args.duration)
        servers["PyTriton (after load)"] = {"ready_seconds": round(ready, 2), **tree_memory(server.pid).as_dict()}
    finally:
        server.stop()
    return {"points": points, "setup": server.description}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark tritonnx against in-process ONNX Runtime, a FastAPI baseline and PyTriton, in one run.",
        epilog="Example: python -m bench --models mobilenet_v3_small --concurrency 1 4 16 --duration 5",
    )
    parser.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v3_small"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measured point; default: %(default)s")
    parser.add_argument(
        "--limit-seconds", type=float, default=4.0, help="seconds per in-process point; default: %(default)s"
    )
    parser.add_argument("--skip-fastapi", action="store_true", help="leave out the FastAPI baseline")
    parser.add_argument(
        "--skip-pytriton", action="store_true", help="leave out PyTriton (its venv is made under build/peers/ first)"
    )
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>")
    args = parser.parse_args(argv)

    started = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or RESULTS / started
    workdir = out / "logs"
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"started": started, "machine": machine(), "settings": settings(args), "models": {}}
    for model in args.models:
        results["models"][model] = bench_model(model, args, workdir)
        write_report(out, results)  # a partial report survives an interrupted run
    say(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
