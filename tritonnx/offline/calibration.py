"""Sample inputs of a model read from a folder: the calibration and held-out sets of `publish --quantize`.

A folder holds, in file-name order:
- `.npz` files: one array per graph input, by the input's name;
- `.npy` files: the input's array, for a model with one input;
- `.jpg`, `.jpeg`, `.png` files: an image, through the project's own pre-processing (backend/image_preprocess.py,
  the `image_preprocess` model's steps: FP32 [3, 224, 224]), for a model whose one input is FP32.

An array holds one sample (the input's shape without the batch dim) or several (with it); either way it is cut into
samples of one row each, so that every sample runs alone, as a request of its own is served. A graph whose first dim
is fixed takes each array whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonnx.backend import image_preprocess
from tritonnx.backend.errors import InvalidInputError
from tritonnx.backend.onnx_io import GraphIO
from tritonnx.backend.tensors import ELEMENT_TYPES

Sample = dict[str, np.ndarray]
ARRAY_SUFFIXES = (".npy", ".npz")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class CalibrationError(ValueError):
    """The folder's files cannot feed the model; the message names the file and what the model takes."""


@dataclass(frozen=True)
class InputSpec:
    """A graph input as ONNX Runtime lists it: name, numpy dtype, shape (a str or None for a dynamic dim)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]

    @property
    def batched(self) -> bool:
        return bool(self.shape) and not isinstance(self.shape[0], int)

    def describe(self) -> str:
        dims = ", ".join(str(d) if isinstance(d, int) else "?" for d in self.shape)
        return f"{self.name} {self.dtype.name} [{dims}]"


def input_specs(graph: GraphIO) -> list[InputSpec]:
    """The inputs a sample must hold: the graph's, less those with a default (an initializer)."""
    specs = []
    for tensor in graph.inputs:
        dtype = ELEMENT_TYPES[tensor.elem_type].dtype if tensor.elem_type in ELEMENT_TYPES else None
        if tensor.has_default:
            continue
        if dtype is None or tensor.shape is None:
            raise CalibrationError(f"input '{tensor.name}' takes no tensor that a sample file can hold")
        specs.append(InputSpec(tensor.name, np.dtype(dtype), tensor.shape))
    return specs


def _as_input(array: np.ndarray, spec: InputSpec, where: str) -> list[np.ndarray]:
    """The rows of `array` as batches of one (or the array whole, for a graph without a batch dim)."""
    if not np.can_cast(array.dtype, spec.dtype, "same_kind"):
        raise CalibrationError(f"{where}: {array.dtype.name} cannot feed input {spec.describe()}")
    array = array.astype(spec.dtype, copy=False)
    if not spec.batched:
        if array.ndim != len(spec.shape):
            raise CalibrationError(f"{where}: shape {list(array.shape)} does not fit input {spec.describe()}")
        return [array]
    if array.ndim == len(spec.shape) - 1:
        array = array[np.newaxis]
    if array.ndim != len(spec.shape):
        raise CalibrationError(
            f"{where}: shape {list(array.shape)} does not fit input {spec.describe()} (one sample, or a batch of them)"
        )
    fixed = [(i, d) for i, d in enumerate(spec.shape) if isinstance(d, int) and i > 0 and array.shape[i] != d]
    if fixed:
        raise CalibrationError(f"{where}: shape {list(array.shape)} does not fit input {spec.describe()}")
    return [array[i : i + 1] for i in range(len(array))]


def _file_samples(path: Path, inputs: Sequence[InputSpec]) -> list[Sample]:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as arrays:
            missing = [spec.name for spec in inputs if spec.name not in arrays.files]
            if missing:
                raise CalibrationError(
                    f"{path}: no array named {', '.join(missing)} (it holds {', '.join(arrays.files) or 'none'}; "
                    f"the model takes {'; '.join(s.describe() for s in inputs)})"
                )
            rows = {spec.name: _as_input(arrays[spec.name], spec, f"{path}[{spec.name}]") for spec in inputs}
    else:
        if len(inputs) != 1:
            raise CalibrationError(
                f"{path}: a {suffix} file feeds a model with one input; this one takes "
                f"{'; '.join(s.describe() for s in inputs)}: give .npz files, one array per input name"
            )
        spec = inputs[0]
        if suffix == ".npy":
            array = np.load(path, allow_pickle=False)
        else:
            try:
                array = image_preprocess.preprocess(path.read_bytes())
            except InvalidInputError as error:
                raise CalibrationError(f"{path}: {error}") from None
        rows = {spec.name: _as_input(array, spec, str(path))}
    counts = {len(r) for r in rows.values()}
    if len(counts) != 1:
        raise CalibrationError(f"{path}: its arrays hold different numbers of rows ({sorted(counts)})")
    return [{name: rows[name][i] for name in rows} for i in range(counts.pop())]


def read_samples(folder: Path, inputs: Sequence[InputSpec]) -> list[Sample]:
    """Every sample of the folder's files, in file-name order; CalibrationError when one cannot feed the model."""
    if not folder.is_dir():
        raise CalibrationError(f"{folder} is not a folder")
    accepted = ARRAY_SUFFIXES + IMAGE_SUFFIXES
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    unknown = [p.name for p in files if p.suffix.lower() not in accepted]
    if unknown:
        raise CalibrationError(f"{folder}: {', '.join(unknown[:5])}: not one of {', '.join(accepted)}")
    samples = [sample for path in files for sample in _file_samples(path, inputs)]
    if not samples:
        raise CalibrationError(f"{folder} holds no {', '.join(accepted)} file")
    return samples


def split(samples: list[Sample], holdout_fraction: float) -> tuple[list[Sample], list[Sample]]:
    """(calibration, held out): the last `holdout_fraction` of the samples (at least one) held out."""
    held = max(1, round(len(samples) * holdout_fraction))
    if held >= len(samples):
        raise CalibrationError(
            f"{len(samples)} sample(s) cannot be split into a calibration set and {held} held out: give more, "
            "or a separate --holdout folder"
        )
    return samples[:-held], samples[-held:]
