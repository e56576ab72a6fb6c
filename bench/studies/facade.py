"""python -m bench.studies.facade: the facade's own cost per call, the working tree against a git ref.

Both facades (REF's from a temporary git worktree) serve in front of one fake Triton, a process of its own that answers
every inference at once with zeros, so what is measured is the facade. Rounds measure each tree in turn, the order
alternating; per metric, the median of the per-round ratios current/baseline with a distribution-free interval.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc
from tritonclient.grpc import model_config_pb2, service_pb2

from bench.load import loops
from bench.load.targets import IMAGE_CLASSES, IMAGE_SHAPE, FacadeTarget
from bench.output import (
    LEVEL,
    Gate,
    finish,
    gates_section,
    head,
    machine,
    median_and_interval,
    median_interval,
    run_folder,
    say,
    settings,
)
from bench.usage import tree_cpu_seconds
from tritonnx.server.facade import FacadeProcess

ROOT = Path(__file__).resolve().parents[2]
MODEL = "mobilenet_v3_small"
# metric -> (column, whether higher is better)
METRICS = {
    "c1_p50_ms": ("c=1 p50 (ms)", False),
    "c16_rps": ("c=16 req/s", True),
    "c16_p99_ms": ("c=16 p99 (ms)", False),
    "cpu_ms_per_call": ("facade CPU ms per call", False),
}
FACADE_FLAGS = ["--default-model", MODEL, "--health-interval", "3600"]  # no health probe while measuring


async def serve_fake_triton(ports: multiprocessing.Queue) -> None:
    """Triton serving one model shaped like mobilenet_v3_small, answering every call at once with a fixed answer."""
    tensor = service_pb2.ModelMetadataResponse.TensorMetadata
    inputs = [tensor(name="input", datatype="FP32", shape=[-1, *IMAGE_SHAPE])]
    outputs = [tensor(name="output", datatype="FP32", shape=[-1, IMAGE_CLASSES])]
    config = model_config_pb2.ModelConfig(name=MODEL, max_batch_size=16)
    inferred = service_pb2.ModelInferResponse(model_name=MODEL, model_version="1")
    inferred.outputs.add(name="output", datatype="FP32", shape=[1, IMAGE_CLASSES])  # every request is of batch 1
    inferred.raw_output_contents.append(bytes(4 * IMAGE_CLASSES))
    answers = {
        "ServerReady": service_pb2.ServerReadyResponse(ready=True),
        "ModelReady": service_pb2.ModelReadyResponse(ready=True),
        "ModelMetadata": service_pb2.ModelMetadataResponse(name=MODEL, versions=["1"], inputs=inputs, outputs=outputs),
        "ModelConfig": service_pb2.ModelConfigResponse(config=config),
        # The facade's inputs go through shared memory, as in front of a Triton on its machine.
        "SystemSharedMemoryStatus": service_pb2.SystemSharedMemoryStatusResponse(),
        "SystemSharedMemoryRegister": service_pb2.SystemSharedMemoryRegisterResponse(),
        "SystemSharedMemoryUnregister": service_pb2.SystemSharedMemoryUnregisterResponse(),
        "ModelInfer": inferred,
    }

    def fixed(reply: bytes) -> grpc.RpcMethodHandler:
        async def answer(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return reply

        return grpc.unary_unary_rpc_method_handler(answer)  # bytes in and out: no (de)serializer

    methods = {method: fixed(answer.SerializeToString()) for method, answer in answers.items()}
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ports.put(port)
    await server.wait_for_termination()


def run_fake_triton(ports: multiprocessing.Queue) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the study, which stops this process
    asyncio.run(serve_fake_triton(ports))


@dataclass
class TreeFacade(FacadeProcess):
    """The facade run from the code of a tree, through its import root (see import_root())."""

    import_root: Path = ROOT

    def spawn(self, command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        # Run from the import root too: the working directory comes first on the path.
        super().spawn(command, {**(env or os.environ), "PYTHONPATH": str(self.import_root)}, self.import_root)


def import_root(tree: Path, stack: ExitStack) -> Path:
    """A folder whose `tritonnx` is `tree`'s as it installs, for PYTHONPATH; `stack` removes it.

    pyproject.toml maps the top-level backend/ and client/ into the namespace, which only an installed package
    sees: here links outside the repository lay them out so. A tree from before that mapping has them in tritonnx/.
    """
    if (tree / "tritonnx" / "client").exists():
        return tree
    root = Path(tempfile.mkdtemp(prefix="tritonnx-import-root-"))
    stack.callback(shutil.rmtree, root, ignore_errors=True)
    (root / "tritonnx").mkdir()
    for entry in (tree / "tritonnx").iterdir():
        (root / "tritonnx" / entry.name).symlink_to(entry)
    for folder in ("backend", "client"):
        (root / "tritonnx" / folder).symlink_to(tree / folder)
    return root


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def worktree(ref: str, stack: ExitStack) -> Path:
    """REF in a temporary worktree that `stack` removes, with the generated protobuf modules (not in git)."""
    folder = Path(tempfile.mkdtemp(prefix="tritonnx-facade-study-"))
    stack.callback(shutil.rmtree, folder, ignore_errors=True)
    stack.callback(subprocess.run, ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)])
    git("worktree", "add", "--detach", str(folder), ref)
    for generated in (ROOT / "client" / "proto").glob("*_pb2*.py*"):
        shutil.copy2(generated, folder / "client" / "proto")
    return folder


def start_facade(tree: Path, triton_port: int, log: Path, stack: ExitStack) -> TreeFacade:
    """The facade of `tree`, ready, stopped by `stack`; checked to import that tree's code, not the installed one."""
    check = "import tritonnx.client.facade.server as m; print(m.__file__)"
    root = import_root(tree, stack)
    env = {**os.environ, "PYTHONPATH": str(root)}
    found = subprocess.run([sys.executable, "-c", check], env=env, cwd=root, capture_output=True, text=True)
    if not Path(found.stdout.strip()).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the facade of {tree} would run {found.stdout.strip() or found.stderr}")
    facade = TreeFacade(triton_url=f"127.0.0.1:{triton_port}", log_file=log, extra_args=FACADE_FLAGS, import_root=root)
    stack.callback(facade.stop)
    facade.start()
    facade.wait_ready()
    return facade


def measure(facade: TreeFacade, seconds: float) -> dict:
    """c=1 p50; c=16 throughput, p99 and the facade's CPU per call answered (warm-up included)."""
    lone = loops.run(FacadeTarget(facade.grpc_url, MODEL, 1), 1, seconds, min(1.0, seconds / 4))
    cpu = tree_cpu_seconds(facade.pid)
    busy = loops.run(FacadeTarget(facade.grpc_url, MODEL, 1), 16, seconds, min(1.0, seconds / 4))
    cpu, answered = tree_cpu_seconds(facade.pid) - cpu, busy.requests + busy.warmup_requests
    figures = [lone.p50_ms, busy.throughput_rps, busy.p99_ms, 1000 * cpu / answered if answered else math.nan]
    errors = sum(lone.errors.values()) + sum(busy.errors.values())
    return {**dict(zip(METRICS, figures, strict=True)), "calls": lone.requests + busy.requests, "errors": errors}


def compare(pairs: list[tuple[float, float]], higher_is_better: bool) -> dict:
    """Of per-round (current, baseline) figures: each tree's median, the median ratio, its interval and the verdict."""
    ratio, low, high, coverage = median_and_interval([c / b if b else math.nan for c, b in pairs])
    if coverage >= LEVEL and (low > 1.0 or high < 1.0):
        verdict = f"outside noise: current {'better' if (low > 1.0) == higher_is_better else 'worse'}"
    else:
        verdict = "within noise" + (f" (too few rounds for a {LEVEL:.0%} interval)" if coverage < LEVEL else "")
    medians = {"current": statistics.median(c for c, _ in pairs), "baseline": statistics.median(b for _, b in pairs)}
    figures = {"ratio": ratio, "interval": [low, high], "coverage": coverage}
    return medians | figures | {"verdict": verdict}


def report(results: dict, judged: list[Gate]) -> str:
    rounds, trees, n = results["rounds"], results["trees"], len(results["rounds"])
    k, coverage = median_interval(n)
    lines = [
        f"# The facade's own cost: the working tree against {results['settings']['against']} ({results['started']})",
        "",
        f"current: {trees['current']}; baseline: {trees['baseline']}. Each facade (its defaults, health probe off) before "
        f"a fake Triton, its own process, answering {MODEL}'s shapes at once with zeros; batch-1 requests. Per round, "
        f"each tree in turn, the order alternating: c=1, then c=16, {results['settings']['seconds']} s each. CPU: the "
        f"facade process's over the c=16 run, warm-up included, per call answered. Machine: {results['machine']}.",
    ]
    for entry in rounds:
        lines += ["", f"## Round {entry['round']}", "", *head(f"tree | {' | '.join(c for c, _ in METRICS.values())}")]
        lines += [f"| {tree} | {' | '.join(f'{entry[tree][m]:.3f}' for m in METRICS)} |" for tree in entry["order"]]
    interval = f"Interval: [r_({k}), r_({n - k + 1})] of the {n} per-round ratios r, sorted: {coverage:.1%} coverage."
    lines += ["", "## Current against baseline", "", interval, ""]
    lines += head("metric | current (median) | baseline (median) | ratio (median) | interval | verdict")
    for metric, (column, _) in METRICS.items():
        s = results["summary"][metric]
        figures = " | ".join(f"{s[key]:.3f}" for key in ("current", "baseline", "ratio"))
        lines.append(f"| {column} | {figures} | [{s['interval'][0]:.3f}, {s['interval'][1]:.3f}] | {s['verdict']} |")
    return "\n".join(lines) + "\n\n" + gates_section(judged)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.facade",
        description="The facade's own cost per call in front of a fake Triton: the working tree against a git ref.",
        epilog="Example: python -m bench.studies.facade --against HEAD~1 --rounds 7 --seconds 5",
    )
    parser.add_argument("--against", default="HEAD", help="the baseline's git ref; default: %(default)s")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; default: %(default)s")
    parser.add_argument("--seconds", type=float, default=5.0, help="per load run; default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC time>-facade")
    args = parser.parse_args(argv)
    if args.rounds < 1 or not args.seconds > 0:
        parser.error("--rounds and --seconds must be positive")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped, it cleans up as on Ctrl-C
    started, out = run_folder(args.out, "facade")
    changed = " with changes" if git("status", "--porcelain", "--", "client", "backend", "tritonnx") else ""
    trees = {"current": f"working tree at {git('rev-parse', '--short', 'HEAD')}{changed}"}
    trees["baseline"] = f"{args.against} = {git('rev-parse', '--short', args.against)}"
    results: dict = {"started": started, "settings": settings(args), "machine": machine(), "trees": trees}
    rounds: list[dict] = []
    with ExitStack() as stack:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: this one runs gRPC's threads
        ports: multiprocessing.Queue = context.Queue()
        fake = context.Process(target=run_fake_triton, args=(ports,), daemon=True)
        fake.start()
        stack.callback(fake.join, 10)
        stack.callback(fake.kill)
        port = ports.get(timeout=60)
        folders = {"current": ROOT, "baseline": worktree(args.against, stack)}
        say(f"fake Triton on 127.0.0.1:{port}; current: {trees['current']}; baseline: {trees['baseline']}")
        facades = {tree: start_facade(path, port, out / f"facade-{tree}.log", stack) for tree, path in folders.items()}
        for number in range(1, args.rounds + 1):
            rounds.append({"round": number, "order": list(folders)[:: 1 if number % 2 else -1]})
            for tree in rounds[-1]["order"]:
                row = rounds[-1][tree] = measure(facades[tree], args.seconds)
                figures = ", ".join(f"{column} {row[metric]:.3f}" for metric, (column, _) in METRICS.items())
                say(f"round {number}/{args.rounds}, {tree}: {figures}, {row['calls']} calls, {row['errors']} errors")
    pairs = {metric: [(r["current"][metric], r["baseline"][metric]) for r in rounds] for metric in METRICS}
    results |= {"rounds": rounds, "summary": {m: compare(pairs[m], higher) for m, (_, higher) in METRICS.items()}}
    calls, errors = ([r[tree][key] for r in rounds for tree in folders] for key in ("calls", "errors"))
    detail = f"{sum(calls)} calls, {sum(errors)} errors"
    judged = [Gate("every call answered, by both trees", all(calls) and not any(errors), detail)]
    return finish(out, report(results, judged), judged, results)


if __name__ == "__main__":
    sys.exit(main())
