"""The request `triton_infer` sends: one array per model input, built from the model's metadata.

Random or zero tensors of the right names, datatypes and shapes, or arrays from .npy files; the
rules are in `python -m tritonnx.client.triton_infer --help`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tritonclient.utils import triton_to_np_dtype

GENERATED_SOURCES = ("random", "zeros")
# Random integer inputs are usually token or class ids; staying below 1000 keeps them inside any
# realistic vocabulary or embedding table.
RANDOM_INT_HIGH = 1000


class InputError(Exception):
    """The requested inputs cannot be built for this model (bad file, dtype, rank or name)."""


def concrete_shape(shape: Sequence[int], max_batch_size: int, batch_size: int, seq_len: int) -> list[int]:
    """The metadata shape with every -1 replaced: the batch dim by batch_size, others by seq_len.

    Triton's metadata includes the batch dim (as -1) exactly when max_batch_size > 0.
    """
    resolved = []
    for position, dim in enumerate(shape):
        if position == 0 and max_batch_size > 0:
            resolved.append(batch_size)
        elif dim < 0:
            resolved.append(seq_len)
        else:
            resolved.append(dim)
    return resolved


def numpy_dtype(datatype: str) -> np.dtype:
    np_type = triton_to_np_dtype(datatype)
    if np_type is None:  # np.dtype(None) would silently mean float64
        raise InputError(f"unsupported Triton datatype {datatype}")
    return np.dtype(np_type)


def generate_input(name: str, datatype: str, shape: Sequence[int], source: str, rng: np.random.Generator) -> np.ndarray:
    """A `random` or `zeros` tensor for one input (see the --help epilog for the rules)."""
    if datatype == "BYTES":
        raise InputError(f"input {name!r} is BYTES: give it a .npy file of strings")
    dtype = numpy_dtype(datatype)
    if source == "zeros":
        return np.zeros(shape, dtype=dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if "mask" in name.lower():
        # Attention masks of ones let every token through, as a real unpadded batch would.
        return np.ones(shape, dtype=dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    high = min(RANDOM_INT_HIGH, int(np.iinfo(dtype).max) + 1)  # INT8/UINT8 cannot hold 999
    return rng.integers(0, high, size=shape, dtype=dtype)


def load_npy(
    path: str,
    name: str,
    datatype: str,
    model_shape: Sequence[int],
    max_batch_size: int,
    batch_size: int,
) -> np.ndarray:
    """The array in `path` for one input.

    The batch dim is added (repeated batch_size times) when the file leaves it out.
    """
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"input {name!r}: cannot load {path}: {exc}") from None
    dtype = numpy_dtype(datatype)
    if array.dtype != dtype:
        # np.save of numpy's default float64/int64 is the common case; casts that would change
        # the values' kind (float -> int) are refused rather than silently truncated.
        if not np.can_cast(array.dtype, dtype, casting="same_kind"):
            raise InputError(f"input {name!r}: {path} holds {array.dtype}, the model wants {datatype}")
        array = array.astype(dtype)
    rank = len(model_shape)
    if max_batch_size > 0 and array.ndim == rank - 1:
        return np.repeat(array[np.newaxis], batch_size, axis=0)
    if array.ndim != rank:
        raise InputError(f"input {name!r}: {path} has shape {list(array.shape)}, the model wants {list(model_shape)}")
    return array


def build_inputs(
    metadata: dict,
    max_batch_size: int,
    default_source: str,
    named_sources: dict[str, str],
    batch_size: int,
    seq_len: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """One array per model input, in metadata order (which also fixes what the seed produces)."""
    input_names = [spec["name"] for spec in metadata["inputs"]]
    unknown = sorted(set(named_sources) - set(input_names))
    if unknown:
        raise InputError(
            f"model {metadata['name']!r} has no input {', '.join(unknown)}; its inputs are: {', '.join(input_names)}"
        )
    if max_batch_size == 0 and batch_size != 1:
        raise InputError(f"model {metadata['name']!r} does not batch (max_batch_size 0): drop --batch-size")
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in metadata["inputs"]:
        name, datatype, shape = spec["name"], spec["datatype"], spec["shape"]
        source = named_sources.get(name, default_source)
        if source in GENERATED_SOURCES:
            concrete = concrete_shape(shape, max_batch_size, batch_size, seq_len)
            inputs[name] = generate_input(name, datatype, concrete, source, rng)
        else:
            inputs[name] = load_npy(source, name, datatype, shape, max_batch_size, batch_size)
    return inputs
