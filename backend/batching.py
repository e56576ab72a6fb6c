"""Stack the requests of one dynamic batch into single tensors, and split the outputs back.

Requests join one ONNX Runtime run only when their non-ragged inputs agree on every dim after
the batch dim. Ragged inputs (Triton's `allow_ragged_batch`) are padded with zeros at the end of
each dim to the largest request, which models that take a mask (like `text_classifier`) ignore.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from backend.validation import ModelSignature

Tensors = Mapping[str, np.ndarray]


def group_compatible(requests: Sequence[Tensors], indices: Sequence[int], signature: ModelSignature) -> list[list[int]]:
    """Partition `indices` into groups of requests that can share one run, keeping arrival order."""
    groups: dict[tuple, list[int]] = {}
    for index in indices:
        key = tuple(
            requests[index][spec.name].shape[1:]
            for spec in signature.inputs
            if spec.name not in signature.ragged_inputs
        )
        groups.setdefault(key, []).append(index)
    return list(groups.values())


def _pad_to(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if array.shape == shape:
        return array
    padded = np.zeros(shape, dtype=array.dtype)
    padded[tuple(slice(0, n) for n in array.shape)] = array
    return padded


def stack(requests: Sequence[Tensors], signature: ModelSignature) -> dict[str, np.ndarray]:
    """One feed dict for all `requests`, concatenated along the batch dim."""
    if len(requests) == 1:
        # Nothing to join: hand the request's own arrays to ONNX Runtime without a copy.
        return {spec.name: requests[0][spec.name] for spec in signature.inputs}
    feeds = {}
    for spec in signature.inputs:
        arrays = [request[spec.name] for request in requests]
        if spec.name in signature.ragged_inputs:
            inner = tuple(max(dims) for dims in zip(*(a.shape[1:] for a in arrays)))
            arrays = [_pad_to(a, a.shape[:1] + inner) for a in arrays]
        feeds[spec.name] = np.concatenate(arrays, axis=0)
    return feeds


def split(outputs: Mapping[str, np.ndarray], batch_sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Cut every output along the batch dim into one dict per request (views, not copies)."""
    bounds = np.cumsum([0, *batch_sizes])
    return [
        {name: array[start:stop] for name, array in outputs.items()}
        for start, stop in zip(bounds[:-1], bounds[1:])
    ]
