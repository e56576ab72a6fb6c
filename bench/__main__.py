"""python -m bench: the whole benchmark in one run (make bench); docs/benchmarks.md says what it measures.

Each model's measurements are interleaved (the limit before and after the servers) so that the machine's drift shows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench import REPOSITORY
from bench.baseline.workers import setups
from bench.limit import measure_limit
from bench.load import loops
from bench.load.targets import FacadeTarget, KServeTarget
from bench.output import CORES, machine, run_folder, say, settings
from bench.peers import peer_servers, servers
from bench.perf import run_perf_analyzer
from bench.report import write_report
from bench.usage import tree_memory
from tritonnx.server.stack import ServingStack


def triton_and_facade(model: str, args: argparse.Namespace, workdir: Path, data: dict) -> None:
    """perf_analyzer on Triton direct, then the load generator on it and on the facade (answers checked); memory."""
    with ServingStack(
        REPOSITORY,
        workdir / model,
        backend_dir=workdir / "backends",
        with_facade=False,
        facade_args=["--default-model", model, "--health-interval", "30", "--max-in-flight", "1024"],
    ) as stack:
        triton = stack.triton
        data["perf_analyzer"] = []
        for concurrency in args.concurrency:
            point = run_perf_analyzer(
                model, triton.grpc_url, concurrency, int(args.duration * 1000), headers=triton.admin_headers
            ).as_dict()
            data["perf_analyzer"].append(point)
            say(
                f"  perf_analyzer c={concurrency}: {point['throughput']:.1f} img/s, p50 {point['p50_ms']:.2f} ms, "
                f"p99 {point['p99_ms']:.2f} ms, queue {point['server_queue_ms']:.2f} ms, avg batch {point['avg_batch']:.2f}"
            )
        # Only now: perf_analyzer unregisters every shared-memory region when it exits, the facade's among them.
        facade = stack.start_facade()
        warmup = min(1.0, args.duration / 4)
        images = servers.sample_images()
        expected = servers.reference_outputs(REPOSITORY / model / "1" / "model.onnx", images)
        for key, label, kind, url in (
            ("loadgen_kserve", "Triton direct", KServeTarget, triton.grpc_url),
            ("facade", "facade", FacadeTarget, facade.grpc_url),
        ):
            servers.check_answers(kind(url, model, 1, images=images, expected=expected), len(images))
            data[key] = [
                servers.said(label, loops.run(kind(url, model, 1), c, args.duration, warmup).as_dict())
                for c in args.concurrency
            ]
        data["servers"]["tritonserver (all models, after load)"] = tree_memory(triton.pid).as_dict()
        data["servers"]["facade (after load)"] = tree_memory(facade.pid).as_dict()


def bench_model(model: str, args: argparse.Namespace, workdir: Path) -> dict:
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    data: dict = {"servers": {}, "peers": {}}
    say(f"{model}: limit (in-process ONNX Runtime, {CORES} threads) ...")
    before = measure_limit(onnx_file, model, threads=CORES, seconds=args.limit_seconds)
    say(f"  best {before.best[1]:.1f} img/s ({before.best[0]}), single image p50 {before.single_p50_ms:.2f} ms")
    say(f"{model}: Triton direct and the facade ...")
    triton_and_facade(model, args, workdir, data)

    peers: list[servers.Server] = [servers.FastApi(onnx_file, setup, workdir) for setup in setups(CORES)]
    if not args.skip_pytriton:
        peers.append(
            peer_servers.peer("pytriton", model, onnx_file, servers.Policy.of(REPOSITORY / model, CORES), workdir)
        )
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
        "details": [before.as_dict(), after.as_dict()],
        "single_p50_ms": (before.single_p50_ms + after.single_p50_ms) / 2,
    }
    return data


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
