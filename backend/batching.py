"""Stack the requests of one dynamic batch into single tensors, and split the outputs back.

Requests join one ONNX Runtime run only when they give the same inputs and their non-ragged
inputs agree on every dim after the batch dim. Ragged inputs (Triton's `allow_ragged_batch`)
are padded with zeros at the end of each dim to the largest request of the run, which models that
take a mask (like `text_classifier`) ignore; an output dim named like a padded input dim (a
per-token output's `sequence`) is cut back to each request's own length.

Padding is work the model does for nobody: a request of 8 tokens padded to 128 costs what a
request of 128 costs. Ragged requests are therefore sorted by size and cut into runs whose
padded elements stay within PADDING_ALLOWANCE of their own, so that a batched request costs
about what it would alone, or less (bench/reports/2026-11-29-ragged-buckets).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from tritonnx.backend.validation import ModelSignature, PreparedRequest

Tensors = Mapping[str, np.ndarray]
# A run's ragged inputs, padded, hold at most this share more elements than its requests' own.
PADDING_ALLOWANCE = 0.25


def group_compatible(requests: Sequence[PreparedRequest], signature: ModelSignature) -> list[list[int]]:
    """Partition the requests (by index) into groups that can share one run.

    Groups without ragged inputs keep arrival order; ragged ones are cut by size (`_cut_by_padding`).
    """
    groups: dict[tuple, list[int]] = {}
    for index, request in enumerate(requests):
        key = tuple(_shape_key(spec.name, request, signature) for spec in signature.inputs)
        groups.setdefault(key, []).append(index)
    ragged = [name for name in signature.ragged_inputs if name in {spec.name for spec in signature.inputs}]
    if not ragged:
        return list(groups.values())
    return [run for group in groups.values() for run in _cut_by_padding(group, requests, ragged)]


def _cut_by_padding(group: list[int], requests: Sequence[PreparedRequest], ragged: list[str]) -> list[list[int]]:
    """`group`'s requests sorted by their ragged elements, cut wherever padding would pass PADDING_ALLOWANCE."""
    present = [name for name in ragged if name in requests[group[0]].feeds]  # a group gives the same inputs
    if len(group) == 1 or not present:
        return [group]

    def own(index: int) -> int:
        return sum(requests[index].feeds[name].size for name in present)

    runs: list[list[int]] = []
    run: list[int] = []
    widest: dict[str, tuple[int, ...]] = {}
    rows = own_elements = 0
    for index in sorted(group, key=own):
        feeds = requests[index].feeds
        wider = {
            name: tuple(map(max, widest.get(name, feeds[name].shape[1:]), feeds[name].shape[1:])) for name in present
        }
        more_rows, more_own = rows + requests[index].batch_size, own_elements + own(index)
        padded = sum(more_rows * math.prod(dims) for dims in wider.values())
        if run and padded > (1 + PADDING_ALLOWANCE) * more_own:
            runs.append(run)
            run, widest, rows, own_elements = [], {}, 0, 0
            wider = {name: feeds[name].shape[1:] for name in present}
            more_rows, more_own = requests[index].batch_size, own(index)
        run.append(index)
        widest, rows, own_elements = wider, more_rows, more_own
    runs.append(run)
    return runs


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
