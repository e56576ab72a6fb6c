"""Serve corpus cases through a real tritonserver and check every output, a chunk of models at a time.

Each case becomes a model of its own, the way a new user would add it: the stock `model.py`
(a copy of the demo repository's), the `.onnx` file, and a policy-only `config.pbtxt` that
names no input or output and leaves batching to auto-complete. tritonserver starts with no
model loaded; models are loaded through model control in chunks, checked, and unloaded, so a
small machine never holds more than one chunk of stub processes.

A served output is compared with the expected one (dtype, shape, values within ONNX's
tolerances) and bit for bit with in-process ONNX Runtime's. Scalars travel as shape [1], as
tritonnx documents: a rank-0 input is sent with one more dim of 1, and an output whose config
dims are [1] is compared without that dim when the expected one lacks it.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.conformance.corpus import DataSet, Screened, mismatch
from tests.helpers import wait_until
from tritonnx.client.model_control import ControlError, TritonControl
from tritonnx.server.repository import add_model
from tritonnx.server.stack import ServingStack

# Policy only: one CPU instance; inputs, outputs and batching come from auto-complete.
POLICY_CONFIG = 'backend: "python"\ninstance_group [ { kind: KIND_CPU, count: 1 } ]\n'
LOADS_AT_ONCE = 4  # tritonserver's default --model-load-thread-count
REQUEST_SECONDS = 60.0

# Models Triton cannot serve, refused at load with the reason; the first match names the cause.
_CAUSES = (
    (
        r"is an? (sequence|map|optional|sparse tensor), not a tensor",
        "sequence, map or optional type: Triton carries tensors only",
    ),
    (r"which Triton has no datatype for", "element type Triton has no datatype for"),
    (r"cannot hand BF16 tensors to numpy", "BF16: the Python backend cannot hand it to numpy"),
)
REFUSAL_CAUSES = frozenset(cause for _, cause in _CAUSES)


@dataclass
class Verdict:
    """What happened to one case: `correct` when every output of every data set matched."""

    name: str
    correct: bool = False
    identical: bool = False  # bit for bit what in-process ONNX Runtime gave
    phase: str = ""  # load, request or output, where it went wrong
    cause: str = ""
    detail: str = ""
    max_batch_size: int = 0
    seconds: float = 0.0

    def failed(self, phase: str, detail: str) -> Verdict:
        self.phase, self.detail = phase, " ".join(detail.split())[:300]
        self.cause = next((cause for pattern, cause in _CAUSES if re.search(pattern, detail)), "")
        if not self.cause:
            self.cause = {"load": "load failed", "request": "request failed", "output": "wrong output"}[phase]
            self.cause += ": " + _gist(self.detail)
        return self


def _gist(detail: str) -> str:
    """The stable part of a message: no numbers, names or values, so alike failures group."""
    text = re.sub(r"'[^']*'|\[[^\]]*\]|\d+(\.\d+)?", "_", detail)
    return text.split(":")[0][:80] if "values differ" in text else text[:80]


def write_repository(cases: Iterable[Screened], directory: Path) -> None:
    """One model per case: policy-only config.pbtxt, the stock model.py and the case's model.onnx."""
    for screened in cases:
        version = add_model(directory, screened.case.model_name, POLICY_CONFIG)
        shutil.copyfile(screened.case.model_file, version / "model.onnx")


def _as_sent(value: np.ndarray, dims: list[int], batched: bool) -> np.ndarray:
    if value.dtype == np.object_:
        value = (
            np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(value)
            if value.size
            else value
        )
    if dims == [1] and value.ndim == batched:  # a scalar (per batch row): sent as [1]
        value = value.reshape(value.shape + (1,))
    return value


def _as_expected(served: np.ndarray, dims: list[int], expected: Any) -> np.ndarray:
    if dims == [1] and isinstance(expected, np.ndarray) and served.ndim == expected.ndim + 1 and served.shape[-1] == 1:
        return served.reshape(served.shape[:-1])
    return served


def _request(client: grpcclient.InferenceServerClient, model: str, config, data: DataSet) -> dict[str, np.ndarray]:
    batched = config.max_batch_size > 0
    dims = {tensor.name: list(tensor.dims) for tensor in config.input}
    inputs = []
    for name, value in data.inputs.items():
        array = _as_sent(np.asarray(value), dims.get(name, []), batched)
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = [grpcclient.InferRequestedOutput(tensor.name) for tensor in config.output]
    result = client.infer(model, inputs, outputs=outputs, client_timeout=REQUEST_SECONDS)
    return {tensor.name: result.as_numpy(tensor.name) for tensor in config.output}


def check_model(client: grpcclient.InferenceServerClient, screened: Screened) -> Verdict:
    """Send every data set of a loaded case and compare each output."""
    verdict = Verdict(screened.case.name)
    config = client.get_model_config(screened.case.model_name).config
    verdict.max_batch_size = config.max_batch_size
    output_dims = {tensor.name: list(tensor.dims) for tensor in config.output}
    names = [tensor.name for tensor in config.output]
    identical = True
    for data, in_process in zip(screened.data_sets, screened.in_process, strict=False):
        try:
            served = _request(client, screened.case.model_name, config, data)
        except InferenceServerException as error:
            return verdict.failed("request", f"{error.status()}: {error.message()}")
        for name, expected, reference in zip(names, data.expected, in_process, strict=False):
            actual = _as_expected(served[name], output_dims[name], expected)
            problem = mismatch(actual, expected)
            if problem:
                return verdict.failed("output", f"output '{name}': {problem}")
            identical = identical and mismatch(actual, np.asarray(reference), exact=True) is None
    verdict.correct, verdict.identical = True, identical
    return verdict


@dataclass
class ConformanceRun:
    """Serves `cases` chunk by chunk with one tritonserver in `workdir`; `verdicts` fill as it goes."""

    cases: list[Screened]
    workdir: Path
    chunk_size: int = 48
    progress: Callable[[str], None] = print
    verdicts: list[Verdict] = field(default_factory=list)

    def run(self) -> list[Verdict]:
        repository = self.workdir / "repository"
        write_repository(self.cases, repository)
        stack = ServingStack(
            repository,
            self.workdir,
            with_facade=False,
            triton_http=False,
            startup_models=(),
            all_models_ready=False,
            triton_cwd=self.workdir,  # not the checkout: the stub must find `tritonnx` installed
            # The corpus's optimized copies stay with the run, not in the user's cache.
            triton_env={"TRITONNX_ORT_CACHE_DIR": str(self.workdir / "ort-cache")},
        )
        started = time.monotonic()
        with (
            stack,
            grpcclient.InferenceServerClient(stack.triton.grpc_url) as client,
            TritonControl(stack.triton.grpc_url, stack.triton.admin_key, load_timeout_s=300) as control,
        ):
            chunks = [self.cases[i : i + self.chunk_size] for i in range(0, len(self.cases), self.chunk_size)]
            for number, chunk in enumerate(chunks, 1):
                self._serve_chunk(client, control, chunk)
                done = sum(len(c) for c in chunks[:number])
                correct = sum(v.correct for v in self.verdicts)
                elapsed = time.monotonic() - started
                self.progress(
                    f"chunk {number}/{len(chunks)}: {done}/{len(self.cases)} served, {correct} correct, "
                    f"{elapsed:.0f}s, about {elapsed / done * (len(self.cases) - done):.0f}s left"
                )
        return self.verdicts

    def _serve_chunk(
        self, client: grpcclient.InferenceServerClient, control: TritonControl, chunk: list[Screened]
    ) -> None:
        def load(screened: Screened) -> tuple[Screened, str | None, float]:
            started = time.monotonic()
            try:
                control.load(screened.case.model_name)
                return screened, None, time.monotonic() - started
            except ControlError as error:
                return screened, str(error), time.monotonic() - started

        with ThreadPoolExecutor(LOADS_AT_ONCE) as pool:
            loaded = list(pool.map(load, chunk))
        for screened, load_error, seconds in loaded:
            if load_error is not None:
                verdict = Verdict(screened.case.name).failed("load", load_error)
            else:
                try:
                    verdict = check_model(client, screened)
                except InferenceServerException as error:
                    verdict = Verdict(screened.case.name).failed("request", f"{error.status()}: {error.message()}")
            verdict.seconds = seconds
            self.verdicts.append(verdict)
        with ThreadPoolExecutor(LOADS_AT_ONCE) as pool:
            list(pool.map(lambda s: control.unload(s.case.model_name), chunk))
        self._wait_unloaded(control, {s.case.model_name for s in chunk})

    @staticmethod
    def _wait_unloaded(control: TritonControl, names: set[str]) -> None:
        """Until the chunk's stubs are gone (an unload returns before they exit)."""
        wait_until(
            lambda: (
                not any(
                    m["name"] in names and m.get("state") in ("READY", "UNLOADING", "LOADING") for m in control.index()
                )
            ),
            120,
            f"{len(names)} models unloaded",
            0.1,
        )
