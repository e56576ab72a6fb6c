"""Per-request checks against the model's signature, before any request joins a batch.

Triton checks names, datatypes and shapes against the model configuration too, but the Python
backend is also reached by callers that bypass those checks (BLS, decoupled models, tests), and a
single request that slipped through would otherwise fail the whole batch inside ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from backend.errors import InvalidInputError
from backend.tensors import TensorSpec, datatype_name


@dataclass(frozen=True)
class ModelSignature:
    """What a model accepts and returns, as served by Triton."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    ragged_inputs: frozenset[str] = frozenset()

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    def expected(self) -> str:
        batch = "[batch] + " if self.batched else ""
        return f"model '{self.name}' expects {batch}" + ", ".join(spec.describe() for spec in self.inputs)


def validate_request(inputs: Mapping[str, np.ndarray], signature: ModelSignature) -> int:
    """Check one request's tensors; return its batch size (1 when the model does not batch)."""
    missing = [spec.name for spec in signature.inputs if spec.name not in inputs]
    unknown = sorted(set(inputs) - {spec.name for spec in signature.inputs})
    if missing or unknown:
        problems = []
        if missing:
            problems.append("missing input(s) " + ", ".join(f"'{n}'" for n in missing))
        if unknown:
            problems.append("unknown input(s) " + ", ".join(f"'{n}'" for n in unknown))
        raise InvalidInputError(f"{'; '.join(problems)}: {signature.expected()}")

    batch_sizes = {}
    named_dims: dict[str, tuple[str, int]] = {}
    for spec in signature.inputs:
        array = inputs[spec.name]
        if array.dtype != spec.dtype:
            raise InvalidInputError(
                f"input '{spec.name}' has datatype {datatype_name(array.dtype)}, "
                f"expected {datatype_name(spec.dtype)}: {signature.expected()}"
            )
        shape = array.shape[1:] if signature.batched else array.shape
        if array.ndim != len(spec.dims) + signature.batched:
            # Triton hands a request whose batch dim is 0 (or wraps to 0 as a 32-bit int) to the
            # model without a batch dim: the caller never sent this rank, so say so.
            missing_batch = signature.batched and array.ndim == len(spec.dims)
            raise InvalidInputError(
                f"input '{spec.name}' has shape {list(array.shape)} (rank {array.ndim}), "
                f"expected rank {len(spec.dims) + signature.batched}"
                + (
                    f": the first dim is the batch size, 1..{signature.max_batch_size}, and it is missing "
                    f"(a batch size of 0 arrives this way); {signature.expected()}"
                    if missing_batch
                    else f": {signature.expected()}"
                )
            )
        for actual, wanted in zip(shape, spec.dims):
            if actual == 0:
                raise InvalidInputError(
                    f"input '{spec.name}' has shape {list(array.shape)}: it is empty, and every dim must be "
                    f"at least 1: {signature.expected()}"
                )
            if wanted != -1 and actual != wanted:
                raise InvalidInputError(
                    f"input '{spec.name}' has shape {list(array.shape)}, which does not fit "
                    f"{list(spec.dims)}{' after the batch dim' if signature.batched else ''}: "
                    f"{signature.expected()}"
                )
        for actual, dim_name in zip(shape, spec.dim_names):
            if dim_name is None:
                continue
            first_input, size = named_dims.setdefault(dim_name, (spec.name, actual))
            if size != actual:
                raise InvalidInputError(
                    f"inputs '{first_input}' and '{spec.name}' disagree on the size of dim '{dim_name}' "
                    f"({size} and {actual}): the model needs them equal"
                )
        if signature.batched:
            batch_sizes[spec.name] = array.shape[0]

    if not signature.batched:
        return 1
    sizes = set(batch_sizes.values())
    if len(sizes) > 1:
        listed = ", ".join(f"{n}={b}" for n, b in batch_sizes.items())
        raise InvalidInputError(f"inputs disagree on the batch size ({listed}): all inputs need the same first dim")
    batch = sizes.pop()
    if not 1 <= batch <= signature.max_batch_size:
        raise InvalidInputError(
            f"batch size {batch} is outside 1..{signature.max_batch_size} (max_batch_size of model '{signature.name}')"
        )
    return batch
