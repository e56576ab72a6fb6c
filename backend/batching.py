"""Stack the requests of one dynamic batch into single tensors, and split the outputs back.

Requests join one ONNX Runtime run only when they give the same inputs and their non-ragged
inputs agree on every dim after the batch dim. Ragged inputs (Triton's `allow_ragged_batch`)
are padded with zeros at the end of each dim to the largest request, which models that take a
mask (like `text_classifier`) ignore; an output dim named like a padded input dim (a per-token
output's `sequence`) is cut back to each request's own length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tritonnx.backend.validation import ModelSignature, PreparedRequest

Tensors = Mapping[str, np.ndarray]


def group_compatible(requests: Sequence[PreparedRequest], signature: ModelSignature) -> list[list[int]]:
    """Partition the requests (by index) into groups that can share one run, keeping arrival order."""
    groups: dict[tuple, list[int]] = {}
    for index, request in enumerate(requests):
        key = tuple(_shape_key(spec.name, request, signature) for spec in signature.inputs)
        groups.setdefault(key, []).append(index)
    return list(groups.values())


def _shape_key(name: str, request: PreparedRequest, signature: ModelSignature) -> tuple[int, ...] | str | None:
    array = request.feeds.get(name)
    if array is None:
        return None  # an optional input left out: only requests that leave it out too run together
    return "padded" if name in signature.ragged_inputs else array.shape[1:]


def _pad_to(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if array.shape == shape:
        return array
    padded = np.zeros(shape, dtype=array.dtype)
    padded[tuple(slice(0, n) for n in array.shape)] = array
    return padded


def stack(requests: Sequence[PreparedRequest], signature: ModelSignature) -> dict[str, np.ndarray]:
    """One feed dict for all `requests` (which give the same inputs), concatenated along the batch dim."""
    if len(requests) == 1:
        # Nothing to join: hand the request's own arrays to ONNX Runtime without a copy.
        return requests[0].feeds
    feeds = {}
    for name in requests[0].feeds:
        arrays = [request.feeds[name] for request in requests]
        if name in signature.ragged_inputs:
            inner = tuple(max(dims) for dims in zip(*(a.shape[1:] for a in arrays), strict=True))
            arrays = [_pad_to(a, a.shape[:1] + inner) for a in arrays]
        feeds[name] = np.concatenate(arrays, axis=0)
    return feeds


def split(
    outputs: Mapping[str, np.ndarray], requests: Sequence[PreparedRequest], signature: ModelSignature
) -> list[dict[str, np.ndarray]]:
    """Cut every output along the batch dim into one dict per request (views, not copies).

    Dims that follow a padded input are cut back to the request's own size.
    """
    bounds = np.cumsum([0, *(request.batch_size for request in requests)])
    cuts = {
        spec.name: [(axis + 1, name) for axis, name in enumerate(spec.dim_names) if name in signature.ragged_dims]
        for spec in signature.outputs
    }
    parts = []
    for request, start, stop in zip(requests, bounds[:-1], bounds[1:], strict=True):
        part = {}
        for name, array in outputs.items():
            index = [slice(start, stop)]
            for axis, dim_name in cuts.get(name, ()):
                index += [slice(None)] * (axis - len(index)) + [slice(0, request.dim_sizes.get(dim_name))]
            part[name] = array[tuple(index)]
        parts.append(part)
    return parts
