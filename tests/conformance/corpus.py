"""The corpus: ONNX's own operator and model test cases, as the `onnx` wheel ships them.

Each case is a `model.onnx` with one or more `test_data_set_*` folders of serialized inputs and
expected outputs (`input_<i>.pb` for the i-th graph input, `output_<i>.pb` for the i-th
output), written by ONNX's contributors for every operator and many exported PyTorch modules.
Nobody wrote them for tritonnx. A case is kept for serving only when in-process ONNX Runtime
runs it and matches the expected outputs (the tolerances of ONNX's own backend test runner).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

# The suites with test data on disk (`real` and `light` would need downloads or ship no inputs).
SUITES = ("node", "pytorch-converted", "pytorch-operator", "simple")
# ONNX's backend test runner compares with these tolerances.
RTOL, ATOL = 1e-3, 1e-7


def corpus_root() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data"


@dataclass(frozen=True)
class DataSet:
    """One test: an input per graph input it gives (by name) and the expected outputs in order."""

    inputs: dict[str, Any]
    expected: list[Any]


@dataclass(frozen=True)
class Case:
    suite: str
    directory: Path

    @property
    def name(self) -> str:
        return f"{self.suite}/{self.directory.name}"

    @property
    def model_name(self) -> str:
        """A Triton model name: no slash."""
        return f"{self.suite}.{self.directory.name}"

    @property
    def model_file(self) -> Path:
        return self.directory / "model.onnx"

    def data_sets(self) -> list[DataSet]:
        model = onnx.load(str(self.model_file), load_external_data=False)
        sets = []
        for folder in sorted(self.directory.glob("test_data_set_*")):
            inputs = {}
            for index, graph_input in enumerate(model.graph.input):
                path = folder / f"input_{index}.pb"
                if path.exists():
                    inputs[graph_input.name] = _load(path, graph_input.type)
            expected = []
            for index, graph_output in enumerate(model.graph.output):
                path = folder / f"output_{index}.pb"
                if path.exists():
                    expected.append(_load(path, graph_output.type))
            sets.append(DataSet(inputs, expected))
        return sets


def _load(path: Path, type_proto: onnx.TypeProto) -> Any:
    """A tensor as numpy, a sequence as a list, an optional as its value or None."""
    data = path.read_bytes()
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        sequence = onnx.SequenceProto()
        sequence.ParseFromString(data)
        return numpy_helper.to_list(sequence)
    if kind == "optional_type":
        optional = onnx.OptionalProto()
        optional.ParseFromString(data)
        return numpy_helper.to_optional(optional)
    if kind == "map_type":
        mapping = onnx.MapProto()
        mapping.ParseFromString(data)
        return numpy_helper.to_dict(mapping)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def discover(root: Path | None = None, suites: tuple[str, ...] = SUITES) -> list[Case]:
    """Every case with test data, in a stable order."""
    root = root or corpus_root()
    return [
        Case(suite, directory)
        for suite in suites
        for directory in sorted((root / suite).iterdir())
        if (directory / "model.onnx").exists() and any(directory.glob("test_data_set_*"))
    ]


def mismatch(actual: Any, expected: Any, exact: bool = False) -> str | None:
    """What differs between an output and its expected value, or None.

    Dtype, shape, values (within ONNX's tolerances, or bit for bit with `exact`; NaN equals NaN).
    """
    if isinstance(expected, list) and isinstance(actual, list):  # a sequence, in process
        if len(actual) != len(expected):
            return f"a sequence of {len(actual)}, expected {len(expected)}"
        return next((m for a, e in zip(actual, expected, strict=False) if (m := mismatch(a, e, exact))), None)
    if expected is None or actual is None:  # an optional, in process
        return None if expected is actual else "an optional is empty on one side only"
    if not isinstance(expected, np.ndarray) or not isinstance(actual, np.ndarray):
        return f"not a tensor ({type(expected).__name__} expected, {type(actual).__name__} given)"
    if expected.dtype == np.object_:
        as_bytes = np.vectorize(lambda v: v.encode() if isinstance(v, str) else bytes(v), otypes=[object])
        expected, actual = (as_bytes(a) if a.size else a for a in (expected, actual))
        if actual.dtype != np.object_:
            return f"dtype {actual.dtype}, expected strings"
    elif actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"shape {list(actual.shape)}, expected {list(expected.shape)}"
    if expected.dtype == np.object_ or exact:
        same = np.array_equal(actual, expected, equal_nan=expected.dtype.kind in "fc")
        return None if same else "values differ"
    try:
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)
    except AssertionError as error:
        return "values differ: " + " ".join(str(error).split())[:160]
    return None


def reference_session(case: Case) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4  # the corpus exercises many warnings
    return ort.InferenceSession(str(case.model_file), options, providers=["CPUExecutionProvider"])


def run_in_process(session: ort.InferenceSession, data: DataSet) -> list[Any]:
    names = [output.name for output in session.get_outputs()][: len(data.expected)]
    return session.run(names, data.inputs)


@dataclass(frozen=True)
class Screened:
    """A case in-process ONNX Runtime runs correctly, with its data and ONNX Runtime's outputs."""

    case: Case
    data_sets: list[DataSet]
    in_process: list[list[Any]]


def screen(cases: list[Case]) -> Iterator[Screened | tuple[Case, str]]:
    """Each case as Screened, or as (case, why in-process ONNX Runtime does not count as running it)."""
    for case in cases:
        try:
            session = reference_session(case)
        except Exception as error:  # noqa: BLE001 - ONNX Runtime refuses many corpus models
            yield case, "ONNX Runtime cannot load it: " + " ".join(str(error).split())[:120]
            continue
        try:
            data_sets = case.data_sets()
            outputs = [run_in_process(session, data) for data in data_sets]
        except Exception as error:  # noqa: BLE001
            yield case, "ONNX Runtime cannot run it: " + " ".join(str(error).split())[:120]
            continue
        wrong = next(
            (
                m
                for data, got in zip(data_sets, outputs, strict=False)
                for g, e in zip(got, data.expected, strict=False)
                if (m := mismatch(g, e))
            ),
            None,
        )
        if wrong:
            yield case, f"ONNX Runtime's output is not the expected one: {wrong}"
        else:
            yield Screened(case, data_sets, outputs)
