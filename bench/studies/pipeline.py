"""python -m bench.studies.pipeline: images/s of the image pipeline through Triton against the same steps in-process.

Per classifier (resnet50, mobilenet_v3_small):

- through Triton: the ensemble `<model>_image` (image_preprocess, then the classifier) with JPEG files of
  `--size`, a closed loop of `--concurrency` callers (bench/load) sending the files' bytes, every answer
  checked against the in-process scores of the same file;
- in-process, on the same cores: the same steps (backend/image_preprocess.py, then ONNX Runtime on the
  same .onnx) in `--threads` threads, with one 1-thread session per thread or one session of all threads
  shared, batch 1 and `--batch`: the best of these is the limit;
- where Triton's time goes: queue and compute (input, infer, output) per request of each composing model,
  from Triton's statistics over the measured run, the average batch size, and the CPU milliseconds per
  image of the pre-processing stubs, the classifier's stubs, tritonserver and the load generator.

Every loop is bounded in time and calls; Triton listens on loopback only. Results go to
bench/results/<UTC time>-pipeline/ (report.md, results.json). Gates (exit 1 when one fails, named in the
report): no call failed, every answer equals the in-process scores, and Triton ran both steps of the
ensemble for every request measured.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import tritonclient.grpc as grpcclient
from PIL import Image

from backend.image_preprocess import preprocess
from backend.server.repository import link_models
from backend.server.stack import ServingStack
from backend.server.supervisor import live_stubs
from bench import REPOSITORY
from bench.load.loops import run_load
from bench.load.targets import KServeTarget
from bench.output import CORES, Gate, finish, gates_section, machine, run_folder, say, settings, write_json
from bench.usage import cpu_seconds

CLASSIFIERS = ("resnet50", "mobilenet_v3_small")
PREPROCESS = "image_preprocess"
STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


def jpeg_files(count: int, width: int, height: int, seed: int = 0) -> list[bytes]:
    """Photo-like JPEGs (smooth colours and noise, quality 90), each different."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    files = []
    for _ in range(count):
        freq, phase = rng.uniform(0.005, 0.05, 3), rng.uniform(0, 6.28, 3)
        picture = np.stack([127 + 100 * np.sin(freq[c] * (x + 0.6 * y) + phase[c]) for c in range(3)], axis=-1)
        picture += rng.normal(0, 10, picture.shape)
        buffer = io.BytesIO()
        Image.fromarray(picture.clip(0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
        files.append(buffer.getvalue())
    return files


def _session(onnx_file: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])


def in_process(onnx_file: Path, files: list[bytes], threads: int, batch: int, shared: bool, seconds: float) -> float:
    """Images/s of decode + pre-process + ONNX Runtime in `threads` threads, for `seconds` (at least one batch each)."""
    sessions = [_session(onnx_file, threads)] * threads if shared else [_session(onnx_file, 1) for _ in range(threads)]
    name = sessions[0].get_inputs()[0].name
    for session in set(sessions):  # first runs allocate
        session.run(None, {name: np.stack([preprocess(f) for f in files[:batch]])})
    counts = [0] * threads
    stop_at = time.perf_counter() + seconds

    def loop(index: int) -> None:
        turn = itertools.cycle(files[index::threads] or files)
        while counts[index] == 0 or time.perf_counter() < stop_at:
            pixels = np.stack([preprocess(next(turn)) for _ in range(batch)])
            sessions[index].run(None, {name: pixels})
            counts[index] += batch

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.perf_counter() - started)


def statistics(client: grpcclient.InferenceServerClient, models: list[str]) -> dict[str, dict[str, int]]:
    """Triton's cumulative counters per model: requests, inferences, executions, and ns per stage."""
    counters = {}
    for model in models:
        stats = client.get_inference_statistics(model).model_stats[0]
        inference = stats.inference_stats
        counters[model] = {
            "requests": inference.success.count,
            "failures": inference.fail.count,
            "inferences": stats.inference_count,
            "executions": stats.execution_count,
            "request_ns": inference.success.ns,
            **{stage: getattr(inference, stage).ns for stage in STAGES},
        }
    return counters


def stage_rows(before: dict, after: dict, ensemble: str) -> dict[str, dict[str, float]]:
    """Per model over the run: requests, average batch, ms per request end to end and of each stage.

    For the composing models also each stage's share of their summed stage time; the ensemble's own
    stage counters only repeat its steps', so it gets its end-to-end time only.
    """
    deltas = {m: {k: after[m][k] - before[m][k] for k in after[m]} for m in after}
    steps = [m for m in deltas if m != ensemble]
    total_ns = sum(deltas[m][stage] for m in steps for stage in STAGES) or 1
    rows = {}
    for model, delta in deltas.items():
        requests = max(delta["requests"], 1)
        row = {
            "requests": delta["requests"],
            "failures": delta["failures"],
            "average_batch": delta["inferences"] / max(delta["executions"], 1),
            "request_ms": delta["request_ns"] / requests / 1e6,
        }
        if model != ensemble:
            row |= {f"{stage}_ms": delta[stage] / requests / 1e6 for stage in STAGES}
            row |= {f"{stage}_share": delta[stage] / total_ns for stage in STAGES}
        rows[model] = row
    return rows


def cpu_by_process(triton_pid: int, classifier: str) -> dict[str, float]:
    """CPU seconds so far: the pre-processing stubs, the classifier's stubs, tritonserver, this process."""
    used = {"preprocess stubs": 0.0, "classifier stubs": 0.0}
    for pid, stub in live_stubs(triton_pid).items():
        role = {PREPROCESS: "preprocess stubs", classifier: "classifier stubs"}.get(stub.model)
        if role is not None:
            try:
                used[role] += cpu_seconds(psutil.Process(pid))
            except psutil.Error:
                continue
    used["tritonserver"] = cpu_seconds(psutil.Process(triton_pid))
    used["client"] = time.process_time()
    return used


def measure(model: str, stack: ServingStack, files: list[bytes], args: argparse.Namespace) -> dict:
    onnx_file = REPOSITORY / model / "1" / "model.onnx"
    say(f"{model}: in-process reference scores of the {len(files)} files")
    reference = _session(onnx_file, CORES)
    expected = [reference.run(None, {"input": preprocess(f)[None]})[0].ravel() for f in files]
    result: dict = {"model": model, "limit": {}}
    for batch in sorted({1, args.batch}):
        for shared in (False, True):
            layout = f"{args.threads} threads, {'one shared session' if shared else '1-thread session each'}, b{batch}"
            result["limit"][layout] = in_process(onnx_file, files, args.threads, batch, shared, args.seconds)
            say(f"{model} in-process, {layout}: {result['limit'][layout]:.1f} img/s")

    pipeline = f"{model}_image"
    target = KServeTarget(
        stack.triton.grpc_url,
        pipeline,
        images=[np.frombuffer(f, np.uint8)[None] for f in files],
        expected=expected,
    )
    models = [pipeline, PREPROCESS, model]
    with grpcclient.InferenceServerClient(stack.triton.grpc_url) as client:
        before, cpu_before = statistics(client, models), cpu_by_process(stack.triton.pid, model)
        load = asyncio.run(
            run_load(target, args.concurrency, args.seconds, warmup_s=args.warmup, max_requests=args.max_requests)
        )
        after, cpu_after = statistics(client, models), cpu_by_process(stack.triton.pid, model)
    say(f"{model} through Triton: {load.summary()}; answers unlike in-process: {target.wrong}")
    images = max(after[pipeline]["requests"] - before[pipeline]["requests"], 1)
    result.update(
        triton=load.as_dict(),
        wrong_answers=target.wrong,
        stages=stage_rows(before, after, pipeline),
        cpu_ms_per_image={role: 1000 * (cpu_after[role] - cpu_before[role]) / images for role in cpu_after},
    )
    best = max(result["limit"].values())
    result["triton_vs_limit"] = load.images_per_s / best if best else 0.0
    return result


def report(results: list[dict], args: argparse.Namespace, started: str) -> str:
    lines = [
        f"# Image pipeline: JPEG {args.size} in, scores out ({started}, {machine()})\n",
        f"Through Triton: the ensemble `<model>_image`, c={args.concurrency}, {args.seconds:g} s windows, "
        f"{args.images} different files; in-process: the same steps in {args.threads} threads.\n",
        "| model | Triton img/s | p50 ms | p99 ms | best in-process img/s (layout) | Triton / in-process | wrong answers |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        layout, best = max(r["limit"].items(), key=lambda item: item[1])
        t = r["triton"]
        lines.append(
            f"| {r['model']} | {t['images_per_s']:.1f} | {t['p50_ms']:.1f} | {t['p99_ms']:.1f} | {best:.1f} ({layout}) "
            f"| {r['triton_vs_limit']:.2f}x | {r['wrong_answers']} |"
        )
    for r in results:
        lines += [
            f"\n## {r['model']}\n",
            "In-process layouts (img/s): " + "; ".join(f"{k}: {v:.1f}" for k, v in r["limit"].items()) + "\n",
            "Where Triton's time goes, per request of each model (ms) and share of all composing models' stage time:\n",
            "| model | requests | avg batch | queue | compute input | compute infer | compute output | end to end |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for model, s in r["stages"].items():
            cells = " | ".join(
                f"{s[f'{stage}_ms']:.2f} ({100 * s[f'{stage}_share']:.0f}%)" if f"{stage}_ms" in s else ""
                for stage in STAGES
            )
            lines.append(f"| {model} | {s['requests']} | {s['average_batch']:.2f} | {cells} | {s['request_ms']:.2f} |")
        lines.append(
            "\nCPU ms per image: "
            + ", ".join(f"{role} {ms:.2f}" for role, ms in r["cpu_ms_per_image"].items())
            + " (the ensemble's row: its end-to-end time; its steps' rows: their stages)"
        )
    return "\n".join(lines) + "\n"


def gates(results: list[dict]) -> list[Gate]:
    found = []
    for r in results:
        model, stages = r["model"], r["stages"]
        ensemble = stages[f"{model}_image"]["requests"]
        steps = {name: stages[name]["requests"] for name in (PREPROCESS, model)}
        found += [
            Gate(f"{model}: no call failed", not r["triton"]["errors"], str(r["triton"]["errors"] or "none")),
            Gate(f"{model}: every answer equals the in-process scores", r["wrong_answers"] == 0,
                 f"{r['wrong_answers']} differed"),
            Gate(f"{model}: both steps ran for every request of the ensemble",
                 all(n >= ensemble for n in steps.values()), f"ensemble {ensemble}, steps {steps}"),
        ]  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.pipeline",
        description="Images/s of JPEG bytes -> labels through Triton's image ensembles at a given concurrency, "
        "against the same decode, resize, crop, normalize and ONNX Runtime steps in-process on the same cores; "
        "with Triton's per-model queue and compute times.",
    )
    parser.add_argument("--models", nargs="+", default=list(CLASSIFIERS), choices=CLASSIFIERS, help="default: both")
    parser.add_argument("--concurrency", type=int, default=16, help="callers through Triton; default: %(default)s")
    parser.add_argument("--seconds", type=float, default=20.0, help="each measured window; default: %(default)s")
    parser.add_argument("--warmup", type=float, default=3.0, help="before the Triton window; default: %(default)s")
    parser.add_argument("--max-requests", type=int, default=20_000, help="calls per window; default: %(default)s")
    parser.add_argument("--images", type=int, default=32, help="different JPEG files; default: %(default)s")
    parser.add_argument("--size", default="640x480", help="the files' width x height; default: %(default)s")
    parser.add_argument(
        "--threads", type=int, default=CORES, help="in-process threads; default: the cores (%(default)s)"
    )
    parser.add_argument("--batch", type=int, default=8, help="in-process batch besides 1; default: %(default)s")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-pipeline")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    started, out = run_folder(args.out, "pipeline")
    files = jpeg_files(args.images, width, height)
    say(f"{len(files)} JPEG files of {args.size}, {sum(map(len, files)) // len(files)} bytes on average; out: {out}")
    models = {PREPROCESS: REPOSITORY / PREPROCESS}
    for model in args.models:
        models |= {model: REPOSITORY / model, f"{model}_image": REPOSITORY / f"{model}_image"}
    repository = link_models(out / "repository", models)
    results = []
    with ServingStack(repository, out, with_facade=False) as stack:
        for model in args.models:
            results.append(measure(model, stack, files, args))
    judged = gates(results)
    write_json(out / "results.json", {"settings": settings(args), "machine": machine(), "results": results,
                                      "gates": [asdict(g) for g in judged]})  # fmt: skip
    text = report(results, args, started) + "\n" + gates_section(judged)
    return finish(out, text, judged)


if __name__ == "__main__":
    sys.exit(main())
