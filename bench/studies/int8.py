"""python -m bench.studies.int8: INT8 versions against FP32, served through Triton at 16 concurrent callers.

Each model's INT8 file is made as `tritonnx-models publish --quantize` makes it (backend/quantize.py, its agreement
gate included, at its default limits): resnet50 and mobilenet_v3_small statically (QDQ, calibrated on random normal
images as .npy samples), text_classifier dynamically (its held-out samples random token ids). The demo models have
random weights, so the agreement measures quantization noise only, not accuracy on real data.

For each round, two tritonservers in turn, on free loopback ports, serving `--models` with their own config.pbtxt
(the same policy: instances, threads, batching, graph level), once with the FP32 files (`fp32`) and once with the
INT8 ones (`int8`); the order alternates between rounds so that the machine's drift falls on both. Against each, the
project's load engine (bench/load) runs a closed loop of single-sample requests at each of `--concurrency` for
`--seconds` after `--warmup`, Triton's KServe gRPC directly.

Answers: for the image models every answer of the load, warm-up included, is compared with in-process ONNX Runtime on
the arm's own file (rtol 1e-4, atol 1e-4 x the largest expected magnitude, bench.load.targets.close_enough). The load
engine sends text_classifier random ids it makes itself, unchecked; before its load, each arm's server answers the
held-out samples one by one and every answer is compared the same way.

Gates (exit 1 when one fails, named in the report): every INT8 file passed the agreement gate; every answer checked
agrees; no call failed; and the goals: INT8 at least GOALS[model] x FP32's throughput at c=GOAL_CONCURRENCY (median
of the rounds' ratios) for resnet50 and text_classifier. mobilenet_v3_small's ratio is measured, not gated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient

from backend.calibration import input_specs, read_samples
from backend.onnx_io import read_graph_io
from backend.quantize import DYNAMIC, REPORT_FILE, STATIC, QuantizationRefused, quantize_for_publish
from backend.server.repository import CONFIG_FILE, link_models, read_config
from backend.server.stack import ServingStack
from backend.session_cache import CACHE_DIR_ENV
from bench import REPOSITORY
from bench.load.loops import run_load
from bench.load.targets import KServeTarget, close_enough
from bench.output import Gate, finish, gates_section, machine, run_folder, say, settings, write_json
from bench.studies.arms import Run, ratios

MODELS = ("resnet50", "text_classifier", "mobilenet_v3_small")
MODES = {"resnet50": STATIC, "mobilenet_v3_small": STATIC, "text_classifier": DYNAMIC}
GOALS = {"resnet50": 1.6, "text_classifier": 1.5}
GOAL_CONCURRENCY = 16
ARMS = ("fp32", "int8")
IMAGE_SHAPE = (3, 224, 224)
TEXT_SEQUENCE = 32
TOLERANCE = "rtol 1e-4, atol 1e-4 x the largest expected magnitude"


def write_samples(model: str, folder: Path, count: int) -> None:
    """`count` random samples in `folder`: normal images as one .npy, or token ids and a mask as one .npz."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    if model == "text_classifier":
        ids = rng.integers(1, 1000, (count, TEXT_SEQUENCE))
        np.savez(folder / "samples.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    else:
        np.save(folder / "samples.npy", rng.standard_normal((count, *IMAGE_SHAPE), dtype=np.float32))


def make_int8(model: str, scratch: Path, samples: int) -> tuple[Path | None, dict[str, Any], str]:
    """The model's INT8 file (None when the gate refused it), its report, and the refusal's reason or ""."""
    folder = scratch / "samples" / model
    write_samples(model, folder, samples)
    workdir = scratch / "int8" / model
    workdir.mkdir(parents=True)
    calibration, holdout = (None, folder) if MODES[model] == DYNAMIC else (folder, None)
    fp32 = REPOSITORY / model / "1" / "model.onnx"
    try:
        int8, report = quantize_for_publish(fp32, read_config(REPOSITORY / model), MODES[model], calibration, holdout,
                                            workdir, log=say)  # fmt: skip
    except QuantizationRefused as refused:
        return None, {}, str(refused)
    return int8, report, ""


def int8_repository(directory: Path, files: dict[str, Path], reports: dict[str, dict]) -> Path:
    """A repository serving each INT8 file as version 1, its report beside it, with the model's config and model.py."""
    for model, int8 in files.items():
        (directory / model / "1").mkdir(parents=True)
        shutil.copyfile(REPOSITORY / model / CONFIG_FILE, directory / model / CONFIG_FILE)
        shutil.copyfile(int8, directory / model / "1" / "model.onnx")
        for extra in (p for p in (REPOSITORY / model / "1").iterdir() if p.is_file() and p.suffix == ".py"):
            shutil.copyfile(extra, directory / model / "1" / extra.name)  # a backend: "python" model's model.py
        (directory / model / "1" / REPORT_FILE).write_text(json.dumps(reports[model], indent=2))
    return directory


def held_out(model: str, scratch: Path) -> list[dict[str, np.ndarray]]:
    """The samples written for the model, one row each, read as `publish --quantize` reads them."""
    graph = read_graph_io(REPOSITORY / model / "1" / "model.onnx")
    return read_samples(scratch / "samples" / model, input_specs(graph))


def expected(onnx_file: Path, samples: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """In-process first outputs, flat, as the load engine compares them."""
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    return [session.run(None, sample)[0].reshape(-1) for sample in samples]


def served_answers_wrong(url: str, model: str, samples: list[dict[str, np.ndarray]], wanted: list[np.ndarray]) -> int:
    """Each sample sent alone to Triton; how many answers are unlike in-process ONNX Runtime's."""
    wrong = 0
    with grpcclient.InferenceServerClient(url) as client:
        output = client.get_model_metadata(model).outputs[0].name
        for sample, expected_output in zip(samples, wanted, strict=True):
            inputs = []
            for name, array in sample.items():
                tensor = grpcclient.InferInput(name, list(array.shape), "INT64" if array.dtype.kind == "i" else "FP32")
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            answer = client.infer(model, inputs).as_numpy(output)
            wrong += int(answer is None or not close_enough(answer.reshape(-1), expected_output))
    return wrong


def one_stack(arm: str, round_: int, repository: Path, checks: dict, scratch: Path, out: Path,
              args: argparse.Namespace) -> list[Run]:  # fmt: skip
    """One tritonserver serving the arm's files: a run per model and concurrency."""
    workdir = scratch / f"round{round_}-{arm}"
    runs: list[Run] = []
    say(f"round {round_}, {arm}: starting tritonserver")
    with ServingStack(repository, workdir, with_facade=False, triton_env={CACHE_DIR_ENV: str(scratch / "ort-cache")}) as stack:  # fmt: skip
        url = stack.triton.grpc_url
        for model in args.models:
            samples, wanted = checks[(arm, model)]
            text = model == "text_classifier"
            pre_wrong = served_answers_wrong(url, model, samples, wanted) if text else 0
            images = None if text else [next(iter(s.values())) for s in samples]
            for concurrency in args.concurrency:
                target = KServeTarget(url, model, 1, images=images, expected=None if text else wanted)
                result = asyncio.run(run_load(target, concurrency, args.seconds, args.warmup))
                checked = len(samples) if text else result.requests + result.warmup_requests
                wrong = pre_wrong if text else target.wrong
                run = Run(arm, round_, model, concurrency, result.throughput_rps, result.p50_ms, result.p99_ms,
                          result.requests, checked, wrong, result.errors)  # fmt: skip
                say(f"round {round_}, {arm}, {model} c={concurrency}: {run.throughput_rps:.1f} req/s, "
                    f"p50 {run.p50_ms:.1f} ms, p99 {run.p99_ms:.1f} ms, {wrong} of {checked} answers unlike "
                    f"in-process, errors {run.errors or 'none'}")  # fmt: skip
                runs.append(run)
    shutil.copyfile(workdir / "tritonserver.log", out / f"round{round_}-{arm}-tritonserver.log")
    return runs


def gates(refused: dict[str, str], runs: list[Run], found: dict[tuple[str, int], dict[str, float]],
          models: list[str]) -> list[Gate]:  # fmt: skip
    wrong = sum(r.wrong for r in runs)
    judged = [
        Gate("every INT8 file passed the agreement gate (default limits)", not refused,
             "; ".join(f"{m}: {reason}" for m, reason in refused.items()) or "all passed"),
        Gate(f"every answer checked agrees with in-process ONNX Runtime on the arm's file ({TOLERANCE})",
             bool(runs) and wrong == 0, f"{wrong} of {sum(r.answers_checked for r in runs)} answers differed"),
        Gate("no call failed", not any(r.errors for r in runs),
             str([f"{r.arm} {r.model} c={r.concurrency}: {r.errors}" for r in runs if r.errors] or "none")),
    ]  # fmt: skip
    for model, goal in GOALS.items():
        if model not in models:
            continue
        measured = found.get((model, GOAL_CONCURRENCY))
        judged.append(Gate(f"{model}: INT8 >= {goal}x FP32's throughput at c={GOAL_CONCURRENCY}",
                           measured is not None and measured["throughput"] >= goal,
                           f"{measured['throughput']:.2f}x (median of the rounds)" if measured
                           else "not measured in this run"))  # fmt: skip
    return judged


def report(runs: list[Run], found: dict, reports: dict[str, dict], args: argparse.Namespace) -> str:
    lines = [
        f"# INT8 against FP32 through Triton: {', '.join(args.models)}, c={args.concurrency}, {args.seconds:g} s "
        f"windows, {args.rounds} round(s)\n",
        f"Machine: {machine()}. onnxruntime {ort.__version__}. Both arms serve each model's config.pbtxt as it is; "
        "`int8` serves the file `tritonnx-models publish --quantize` makes (backend/quantize.py). Single-sample "
        "requests to Triton's KServe gRPC. The demo models have random weights: the agreement below is quantization "
        "noise only, not accuracy on real data.\n",
        "| model | c | round | arm | req/s | p50 ms | p99 ms | requests | answers checked | unlike in-process | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r.model} | {r.concurrency} | {r.round} | {r.arm} | {r.throughput_rps:.1f} | {r.p50_ms:.1f} | "
            f"{r.p99_ms:.1f} | {r.requests} | {r.answers_checked} | {r.wrong} | {r.errors or 'none'} |"
            for r in sorted(runs, key=lambda r: (r.model, r.concurrency, r.round, r.arm))
        ),
        "",
        "## INT8 against FP32\n",
        "Medians over the rounds of each round's ratio (above 1: INT8 better).\n",
        "| model | c | throughput INT8 / FP32 | p50 FP32 / INT8 | goal |",
        "|---|---|---|---|---|",
        *(
            f"| {m} | {c} | {v['throughput']:.2f}x | {v['p50']:.2f}x | {GOALS.get(m, 'measured')} |"
            for (m, c), v in sorted(found.items())
        ),  # fmt: skip
        "",
        "## The INT8 files\n",
        "Each file's quantization.json, as `publish --quantize` writes it beside a version: the agreement on held-out "
        "samples, and the in-process speed of one instance's session (the config's threads and graph level).\n",
        "| model | quantizer | held out | top-1 | cosine (mean, worst) | in-process speedup | batch-coupled |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, rep in sorted(reports.items()):
        agreement, quantizer = rep["agreement"], rep["quantizer"]
        speed = ", ".join(f"batch {r['batch']}: {r['speedup']:.2f}x" for r in rep["speed"]["runs"])
        setting = ", ".join(f"{k}={v}" for k, v in quantizer.items() if k not in ("mode", "pre_processing"))
        lines.append(f"| {model} | {setting} | {rep['holdout']['samples']} | {agreement['top1']:.2%} | "
                     f"{agreement['cosine_mean']:.4f}, {agreement['cosine_min']:.4f} | {speed} | "
                     f"{'yes: each request runs alone' if rep['batch_coupled'] else 'no'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.studies.int8",
        description="Throughput and p50 through tritonserver of each model's INT8 file (made as `tritonnx-models "
        "publish --quantize` makes it) against its FP32 file.",
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS, help="default: all three")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[GOAL_CONCURRENCY], help="default: %(default)s")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured per run; default: %(default)s")
    parser.add_argument("--warmup", type=float, default=3.0, help="per run, not measured; default: %(default)s")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the arms' order alternating; default: 2")
    parser.add_argument("--samples", type=int, default=80, help="per model: the last 20%% held out for static ones; "
                        "default: %(default)s")  # fmt: skip
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>-int8")
    args = parser.parse_args(argv)
    missing = [m for m in args.models if not (REPOSITORY / m / "1" / "model.onnx").is_file()]
    if missing:
        raise SystemExit(f"no model.onnx for {', '.join(missing)} in {REPOSITORY}: run `make models` first")
    _, out = run_folder(args.out, "int8")
    runs: list[Run] = []
    reports: dict[str, dict] = {}
    refused: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="tritonnx-int8-") as scratch_dir:
        scratch = Path(scratch_dir)
        files: dict[str, Path] = {}
        for model in args.models:
            int8, rep, reason = make_int8(model, scratch, args.samples)
            if int8 is None:
                refused[model] = reason
                say(f"{model}: {reason}")
                continue
            files[model], reports[model] = int8, rep
        args.models = [m for m in args.models if m in files]
        repositories = {
            "fp32": link_models(scratch / "fp32", {m: REPOSITORY / m for m in args.models}),
            "int8": int8_repository(scratch / "int8-repository", files, reports),
        }
        checks = {}
        for model in args.models:
            samples = held_out(model, scratch)[-8:]
            checks[("fp32", model)] = (samples, expected(REPOSITORY / model / "1" / "model.onnx", samples))
            checks[("int8", model)] = (samples, expected(files[model], samples))
        for round_ in range(1, args.rounds + 1) if args.models else ():
            for arm in ARMS if round_ % 2 else tuple(reversed(ARMS)):
                runs += one_stack(arm, round_, repositories[arm], checks, scratch, out, args)
    found = ratios(runs, "fp32", "int8")
    judged = gates(refused, runs, found, args.models)
    write_json(out / "results.json", {
        "settings": settings(args), "machine": machine(), "onnxruntime": ort.__version__, "tolerance": TOLERANCE,
        "runs": [asdict(r) for r in runs], "quantization": reports, "refused": refused,
        "ratios": [{"model": m, "concurrency": c, **v} for (m, c), v in sorted(found.items())],
        "gates": [asdict(g) for g in judged],
    })  # fmt: skip
    text = report(runs, found, reports, args) + "\n" + gates_section(judged)
    return finish(out, text, judged)


if __name__ == "__main__":
    sys.exit(main())
