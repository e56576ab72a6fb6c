"""Per-request checks against the model's signature, before any request joins a batch.

Triton checks names, datatypes and shapes against the model configuration too, but the Python
backend is also reached by callers that bypass those checks (BLS, decoupled models, tests), the
configuration cannot say everything the graph does (a fixed 0 dim, dims that share a name), and
a single request that slipped through would otherwise fail the whole batch inside ONNX Runtime.
A request that passes comes out as the feeds ONNX Runtime takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tritonnx.backend.errors import InvalidInputError
from tritonnx.backend.tensors import TensorSpec, datatype_name


@dataclass(frozen=True)
class ModelSignature:
    """What a model accepts and returns, as served by Triton."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    ragged_inputs: frozenset[str] = frozenset()
    ragged_dims: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        # The named dims that padding may stretch: an output dim of the same name is cut back.
        names = {n for spec in self.inputs if spec.name in self.ragged_inputs for n in spec.dim_names if n}
        object.__setattr__(self, "ragged_dims", frozenset(names))

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    def expected(self) -> str:
        batch = "[batch] + " if self.batched else ""
        return f"model '{self.name}' expects {batch}" + ", ".join(spec.describe() for spec in self.inputs)


@dataclass(frozen=True)
class PreparedRequest:
    """A request that passed its checks, as ONNX Runtime takes it."""

    feeds: dict[str, np.ndarray]  # scalars at rank 0, strings as str; optional inputs may be absent
    batch_size: int  # 1 when the model does not batch
    dim_sizes: dict[str, int]  # the size of each named dim in this request


def _as_onnx_strings(name: str, array: np.ndarray) -> np.ndarray:
    """Triton hands BYTES tensors over as bytes objects; ONNX Runtime's Python API wants str.

    It encodes each str as UTF-8 (a str carrying undecodable bytes as surrogates is refused) and turns a bytes object
    into its repr, so bytes that are not UTF-8 cannot reach the graph; Triton's onnxruntime backend, through the C API,
    passes them as they are.
    """
    flat = array.reshape(-1)
    decoded = np.empty(flat.shape, dtype=np.object_)
    for index, value in enumerate(flat):
        if isinstance(value, (bytes, np.bytes_)):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InvalidInputError(
                    f"input '{name}' element {index} is not valid UTF-8 ({error.reason} at byte {error.start}): "
                    "ONNX Runtime's Python API, which serves the model, takes string tensors as UTF-8 text only"
                ) from None
        elif not isinstance(value, str):
            raise InvalidInputError(f"input '{name}' element {index} is a {type(value).__name__}, not a string")
        decoded[index] = value
    return decoded.reshape(array.shape)


def _check_dtype(spec: TensorSpec, array: np.ndarray, signature: ModelSignature) -> np.ndarray:
    if spec.is_string and array.dtype.kind in "OSU":
        return _as_onnx_strings(spec.name, array)
    if array.dtype != spec.dtype:
        raise InvalidInputError(
            f"input '{spec.name}' has datatype {datatype_name(array.dtype)}, "
            f"expected {datatype_name(spec.dtype)}: {signature.expected()}"
        )
    return array


def _check_rank(spec: TensorSpec, array: np.ndarray, signature: ModelSignature) -> np.ndarray:
    """The array at the graph's rank: a scalar arrives at its config dims [1]; a tensor of unknown rank as it came."""
    if spec.any_rank:
        return array
    rank = len(spec.dims) + signature.batched
    if spec.scalar and array.ndim == rank + 1 and array.shape[-1] == 1:
        return array.reshape(array.shape[:-1])
    if array.ndim == rank:
        return array
    # Triton hands a request whose batch dim is 0 (or wraps to 0 as a 32-bit int) to the model
    # without a batch dim: the caller never sent this rank, so say so.
    missing_batch = signature.batched and array.ndim == rank - 1 + spec.scalar
    raise InvalidInputError(
        f"input '{spec.name}' has shape {list(array.shape)} (rank {array.ndim}), "
        f"expected rank {rank + spec.scalar}"
        + (
            f": the first dim is the batch size, 1..{signature.max_batch_size}, and it is missing "
            f"(a batch size of 0 arrives this way); {signature.expected()}"
            if missing_batch
            else f": {signature.expected()}"
        )
    )


def prepare_request(inputs: Mapping[str, np.ndarray], signature: ModelSignature) -> PreparedRequest:
    """Check one request's tensors against the graph and return its feeds, batch size and named dims."""
    missing = [spec.name for spec in signature.inputs if spec.name not in inputs and not spec.optional]
    unknown = sorted(set(inputs) - {spec.name for spec in signature.inputs})
    if missing or unknown:
        problems = []
        if missing:
            problems.append("missing input(s) " + ", ".join(f"'{n}'" for n in missing))
        if unknown:
            problems.append("unknown input(s) " + ", ".join(f"'{n}'" for n in unknown))
        raise InvalidInputError(f"{'; '.join(problems)}: {signature.expected()}")

    feeds = {}
    batch_sizes = {}
    named_dims: dict[str, tuple[str, int]] = {}
    for spec in signature.inputs:
        if spec.name not in inputs:
            continue
        array = _check_rank(spec, _check_dtype(spec, inputs[spec.name], signature), signature)
        shape = array.shape[1:] if signature.batched else array.shape
        for actual, wanted in zip(shape, spec.dims, strict=not spec.any_rank):  # rank checked above; unknown: no dims
            if wanted != -1 and actual != wanted:
                raise InvalidInputError(
                    f"input '{spec.name}' has shape {list(array.shape)}, which does not fit "
                    f"{list(spec.dims)}{' after the batch dim' if signature.batched else ''}: "
                    f"{signature.expected()}"
                )
        for actual, dim_name in zip(shape, spec.dim_names, strict=False):  # no names: nothing to match
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
        feeds[spec.name] = array

    dim_sizes = {name: size for name, (_, size) in named_dims.items()}
    if not signature.batched:
        return PreparedRequest(feeds, 1, dim_sizes)
    sizes = set(batch_sizes.values())
    if len(sizes) > 1:
        listed = ", ".join(f"{n}={b}" for n, b in batch_sizes.items())
        raise InvalidInputError(f"inputs disagree on the batch size ({listed}): all inputs need the same first dim")
    batch = sizes.pop() if sizes else 1
    if not 1 <= batch <= signature.max_batch_size:
        raise InvalidInputError(
            f"batch size {batch} is outside 1..{signature.max_batch_size} (max_batch_size of model '{signature.name}')"
        )
    return PreparedRequest(feeds, batch, dim_sizes)
