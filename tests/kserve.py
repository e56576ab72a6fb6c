"""Helpers to call tritonserver over KServe v2 gRPC the way a tritonclient user would."""

from __future__ import annotations

import queue
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.helpers import wait_until


def make_inputs(tensors: Mapping[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in tensors.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


@dataclass
class Outcome:
    """One request's end: outputs or the server's error, and how long it took."""

    outputs: dict[str, np.ndarray] | None
    error: InferenceServerException | None
    seconds: float

    @property
    def status(self) -> str:
        return "OK" if self.error is None else str(self.error.status())


def infer(
    client: grpcclient.InferenceServerClient, model: str, tensors: Mapping[str, np.ndarray], outputs: list[str]
) -> Outcome:
    started = time.perf_counter()
    try:
        result = client.infer(model, make_inputs(tensors))
        return Outcome({n: result.as_numpy(n) for n in outputs}, None, time.perf_counter() - started)
    except InferenceServerException as error:
        return Outcome(None, error, time.perf_counter() - started)


def infer_concurrently(
    client: grpcclient.InferenceServerClient,
    model: str,
    requests: list[Mapping[str, np.ndarray]],
    outputs: list[str],
    timeout: float = 120.0,
) -> list[Outcome]:
    """Send every request at once (async gRPC calls) and wait for all of them."""
    done: queue.Queue = queue.Queue()
    started = {}
    for index, tensors in enumerate(requests):
        started[index] = time.perf_counter()
        client.async_infer(
            model, make_inputs(tensors), callback=lambda result, error, i=index: done.put((i, result, error))
        )
    outcomes: list[Outcome | None] = [None] * len(requests)
    deadline = time.monotonic() + timeout
    for _ in requests:
        index, result, error = done.get(timeout=max(0.1, deadline - time.monotonic()))
        seconds = time.perf_counter() - started[index]
        if error is not None:
            outcomes[index] = Outcome(None, error, seconds)
        else:
            outcomes[index] = Outcome({n: result.as_numpy(n) for n in outputs}, None, seconds)
    return outcomes  # type: ignore[return-value]


def reference_session(onnx_file: Path) -> ort.InferenceSession:
    """The limit to compare with: the same file in-process with plain ONNX Runtime."""
    return ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    # Thread counts change the order of float sums inside convolutions; compare relative to scale.
    scale = float(np.abs(expected).max()) or 1.0
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * scale)


def execution_counts(
    client: grpcclient.InferenceServerClient, model: str, admin_headers: Mapping[str, str], at_least: int = 0
) -> tuple[int, int]:
    """(inference_count, execution_count) of a model since the server started.

    Triton counts a request when the model's instance releases it, which may come just after the
    answer: with `at_least`, wait (5 s at most, else fail) until that many inferences are counted.
    """

    def stats() -> Any:
        return client.get_inference_statistics(model, headers=dict(admin_headers)).model_stats[0]

    def counted() -> Any:
        found = stats()
        return found if found.inference_count >= at_least else None

    found = wait_until(counted, 5, lambda: f"{at_least} inferences of {model} counted, not {stats().inference_count}")
    return found.inference_count, found.execution_count
