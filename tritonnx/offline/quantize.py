"""INT8 versions of a model with ONNX Runtime's quantization tools, published only when they agree with the FP32 model.

`static`: `quant_pre_process`, then `quantize_static` in the QDQ format, calibrated (MinMax) on sample inputs, weights
per channel: for convolutional networks. `dynamic`: `quant_pre_process`, then `quantize_dynamic` (weights INT8,
activations quantized at run time): for transformers; its DynamicQuantizeLinear takes one scale over the whole batch,
so such a graph is served one request at a time (backend/runner.py).

The gate runs the FP32 file and the INT8 file on held-out inputs, one sample at a time as requests are served, and
refuses the INT8 file when the top-1 agreement (argmax over the last axis of the first output, when it is a float
tensor with more than one class) or the mean cosine similarity of the float outputs is under its limit. ONNX Runtime fuses QDQ pairs into integer
kernels only from the extended graph optimization level up; below it an INT8 graph runs slower than the FP32 one, so a
model whose config sets a lower level is refused before anything is quantized.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.calibrate import CalibrationMethod
from onnxruntime.quantization.shape_inference import quant_pre_process

from tritonnx.backend.errors import ModelConfigError
from tritonnx.backend.onnx_io import read_graph_io
from tritonnx.backend.session_cache import CPU_PROVIDER
from tritonnx.backend.settings import SessionSettings
from tritonnx.offline.calibration import CalibrationError, Sample, input_specs, read_samples, split

STATIC, DYNAMIC = "static", "dynamic"
MODES = (STATIC, DYNAMIC)
REPORT_FILE = "quantization.json"  # beside model.onnx in the version folder; Triton loads only the model file
DEFAULT_MIN_TOP1 = 0.99
DEFAULT_MIN_COSINE = 0.99
DEFAULT_HOLDOUT_FRACTION = 0.2
FUSING_LEVELS = (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
_SPEED_SECONDS = 1.0  # per measurement, after one warm-up run
_SPEED_MAX_RUNS = 200

Log = Callable[[str], None]


class QuantizationRefused(Exception):
    """No INT8 version: the gate, the config or the inputs refused it; the message says which and why."""


@dataclass(frozen=True)
class Limits:
    min_top1: float = DEFAULT_MIN_TOP1
    min_cosine: float = DEFAULT_MIN_COSINE


@dataclass(frozen=True)
class Agreement:
    """The INT8 outputs against the FP32 ones over the held-out samples."""

    samples: int
    top1: float | None  # None: no output has classes to take an argmax over
    top1_outputs: tuple[str, ...]
    cosine_mean: float
    cosine_min: float


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norms == 0.0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(a @ b) / norms


def agreement(
    names: Sequence[str], fp32: Sequence[Sequence[np.ndarray]], int8: Sequence[Sequence[np.ndarray]]
) -> Agreement:
    """Compare each sample's outputs (listed in `names`' order): cosine over every float output, top-1 over the first.

    The first output is the model's answer (a classifier's scores, a tagger's per-token scores); later ones, such as an
    embedding, have no classes, so only their cosine counts.
    """
    matches, positions, cosines = 0, 0, []
    classed: set[str] = set()
    for reference, quantized in zip(fp32, int8, strict=True):
        for index, (name, a, b) in enumerate(zip(names, reference, quantized, strict=True)):
            if a.dtype.kind != "f":
                continue
            cosines.append(_cosine(a, b))
            if index == 0 and a.ndim >= 1 and a.shape[-1] > 1:
                classed.add(name)
                matches += int(np.count_nonzero(a.argmax(-1) == b.argmax(-1)))
                positions += a[..., 0].size
    if not cosines:
        raise QuantizationRefused("the model has no float output to compare the INT8 version's with")
    return Agreement(len(fp32), matches / positions if positions else None, tuple(sorted(classed)),
                     float(np.mean(cosines)), float(np.min(cosines)))  # fmt: skip


def refusals(measured: Agreement, limits: Limits) -> list[str]:
    """What breaks the limits, each with its measure and its limit; empty when the INT8 version may be published."""
    found = []
    if measured.top1 is not None and measured.top1 < limits.min_top1:
        found.append(
            f"top-1 agreement {measured.top1:.2%} over {measured.samples} held-out samples "
            f"({', '.join(measured.top1_outputs)}), required >= {limits.min_top1:.2%} (--min-top1)"
        )
    if measured.cosine_mean < limits.min_cosine:
        found.append(
            f"cosine similarity of the outputs {measured.cosine_mean:.4f} (mean; worst sample {measured.cosine_min:.4f}), "
            f"required >= {limits.min_cosine:.4f} (--min-cosine)"
        )
    return found


def graph_level_problem(settings: SessionSettings) -> str | None:
    """Why the config's graph optimization level would serve an INT8 graph slowly, or None."""
    if settings.graph_level in FUSING_LEVELS:
        return None
    return (
        f"config.pbtxt's optimization {{ graph {{ level }} }} gives ONNX Runtime {settings.graph_level.name}, "
        "which leaves the INT8 graph's quantized operators unfused (slower than FP32): set level 1 (extended) "
        "or 0 / remove it (all), then publish again"
    )


class _Reader(CalibrationDataReader):
    def __init__(self, samples: Sequence[Sample]) -> None:
        self._samples = iter(samples)

    def get_next(self) -> Sample | None:
        return next(self._samples, None)


def quantize(fp32_file: Path, int8_file: Path, mode: str, calibration: Sequence[Sample]) -> dict[str, Any]:
    """Write the INT8 graph; the settings it was made with."""
    pre = int8_file.with_name(f"{int8_file.stem}.pre.onnx")
    try:
        quant_pre_process(str(fp32_file), str(pre))
        pre_processing = "quant_pre_process (symbolic shape inference, ONNX Runtime's basic optimizations)"
    except Exception as error:  # noqa: BLE001 - symbolic shape inference fails on some graphs; the rest still runs
        quant_pre_process(str(fp32_file), str(pre), skip_symbolic_shape=True)
        pre_processing = f"quant_pre_process without symbolic shape inference (it failed: {str(error)[:200]})"
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizers advise on the root logger (pre-processing, which was done)
    try:
        settings = _run_quantizer(pre, int8_file, mode, calibration)
    finally:
        root.setLevel(level)
        pre.unlink(missing_ok=True)
    return {"mode": mode, "function": f"quantize_{mode}", "pre_processing": pre_processing, **settings}


def _run_quantizer(pre: Path, int8_file: Path, mode: str, calibration: Sequence[Sample]) -> dict[str, Any]:
    if mode == STATIC:
        settings: dict[str, Any] = {"quant_format": "QDQ", "activation_type": "QUInt8", "weight_type": "QInt8",
                                    "per_channel": True, "calibrate_method": "MinMax", "reduce_range": False,
                                    "calibration_samples": len(calibration)}  # fmt: skip
        quantize_static(str(pre), str(int8_file), _Reader(calibration), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                        calibrate_method=CalibrationMethod.MinMax, reduce_range=False)  # fmt: skip
    else:
        settings = {"weight_type": "QInt8", "per_channel": False, "reduce_range": False}
        quantize_dynamic(str(pre), str(int8_file), weight_type=QuantType.QInt8, per_channel=False, reduce_range=False)
    return settings


def _session(onnx_file: Path, settings: SessionSettings) -> ort.InferenceSession:
    return ort.InferenceSession(str(onnx_file), settings.session_options(), providers=[CPU_PROVIDER])


def outputs_of(session: ort.InferenceSession, samples: Sequence[Sample]) -> list[list[np.ndarray]]:
    """Each sample run alone, as a request is served."""
    return [session.run(None, sample) for sample in samples]


def _milliseconds(session: ort.InferenceSession, feeds: Sample) -> float:
    session.run(None, feeds)  # the first run allocates
    runs, started = 0, time.perf_counter()
    while runs < _SPEED_MAX_RUNS and (runs == 0 or time.perf_counter() - started < _SPEED_SECONDS):
        session.run(None, feeds)
        runs += 1
    return (time.perf_counter() - started) / runs * 1000


def speed(fp32: ort.InferenceSession, int8: ort.InferenceSession, sample: Sample, batches: Sequence[int]) -> list[dict]:
    """In-process milliseconds per run of both sessions on `sample` repeated to each batch size."""
    rows = []
    for batch in batches:
        feeds = {name: np.repeat(array, batch, axis=0) for name, array in sample.items()}
        fp32_ms, int8_ms = _milliseconds(fp32, feeds), _milliseconds(int8, feeds)
        rows.append({"batch": batch, "fp32_ms": round(fp32_ms, 3), "int8_ms": round(int8_ms, 3),
                     "speedup": round(fp32_ms / int8_ms, 3)})  # fmt: skip
    return rows


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def quantize_for_publish(
    fp32_file: Path,
    config: dict,
    mode: str,
    calibration_dir: Path | None,
    holdout_dir: Path | None,
    workdir: Path,
    limits: Limits = Limits(),
    holdout_fraction: float = DEFAULT_HOLDOUT_FRACTION,
    log: Log = print,
) -> tuple[Path, dict[str, Any]]:
    """The INT8 file, written in `workdir`, and its report; QuantizationRefused when it may not be published.

    `config` is the model's served (or written) config: its session settings time both files, and its max_batch_size
    is the batch the speed is also measured at.
    """
    try:
        settings = SessionSettings.from_model_config(config)
        graph = read_graph_io(fp32_file)
        problem = graph_level_problem(settings)
        if problem:
            raise QuantizationRefused(problem)
        inputs = input_specs(graph)
        if mode == STATIC and calibration_dir is None:
            raise QuantizationRefused("--quantize static needs --calibration DIR: sample inputs to calibrate on")
        samples = read_samples(calibration_dir, inputs) if calibration_dir else []
        if holdout_dir is not None:
            calibration, held_out = samples, read_samples(holdout_dir, inputs)
        elif mode == DYNAMIC:
            calibration, held_out = [], samples  # nothing is calibrated: every sample checks the gate
        else:
            calibration, held_out = split(samples, holdout_fraction)
        if not held_out:
            raise QuantizationRefused("no held-out inputs for the gate: give --holdout DIR or --calibration DIR")
    except (CalibrationError, ModelConfigError) as error:
        raise QuantizationRefused(str(error)) from None
    int8_file = workdir / "model.int8.onnx"
    log(f"quantizing {fp32_file} ({mode}, {len(calibration)} calibration samples) ...")
    quantizer = quantize(fp32_file, int8_file, mode, calibration)
    fp32_session, int8_session = _session(fp32_file, settings), _session(int8_file, settings)
    names = [output.name for output in fp32_session.get_outputs()]
    log(f"comparing the INT8 outputs with the FP32 ones on {len(held_out)} held-out samples ...")
    measured = agreement(names, outputs_of(fp32_session, held_out), outputs_of(int8_session, held_out))
    report: dict[str, Any] = {
        "source": str(fp32_file.resolve()), "source_sha256": _sha256(fp32_file), "onnxruntime": ort.__version__,
        "quantizer": quantizer,
        "calibration": {"folder": str(calibration_dir.resolve()) if calibration_dir else None, "samples": len(calibration)},
        "holdout": {"folder": str(holdout_dir.resolve()) if holdout_dir else None, "samples": len(held_out),
                    "from": "--holdout" if holdout_dir else "every sample" if mode == DYNAMIC
                    else f"the last {holdout_fraction:.0%} of --calibration's samples"},
        "agreement": asdict(measured), "required": asdict(limits),
        "graph_level": settings.graph_level.name,
        "batch_coupled": read_graph_io(int8_file).batch_coupling(),
    }  # fmt: skip
    refused = refusals(measured, limits)
    if refused:
        raise QuantizationRefused(f"the INT8 version of {fp32_file} was refused: " + "; ".join(refused))
    max_batch = int(config.get("max_batch_size", 0))
    batches = [1, max_batch] if max_batch > 1 and inputs[0].batched else [1]
    log(f"agreement: {_describe(measured)}; timing FP32 and INT8 in-process at batch {' and '.join(map(str, batches))}")
    report["speed"] = {"settings": settings.describe(), "runs": speed(fp32_session, int8_session, held_out[0], batches)}
    return int8_file, report


def _describe(measured: Agreement) -> str:
    top1 = f"top-1 {measured.top1:.2%}, " if measured.top1 is not None else ""
    return f"{top1}cosine {measured.cosine_mean:.4f} (worst {measured.cosine_min:.4f}) on {measured.samples} samples"
