"""Tensor descriptions shared by validation, batching and auto-complete.

Datatypes travel under three names: ONNX Runtime's (`tensor(float)`), Triton's model
configuration (`TYPE_FP32`) and numpy's; the table below is the one place they are related.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backend.errors import ModelConfigError

# ONNX Runtime type string -> (Triton config type, numpy dtype). BOOL and strings are left out on
# purpose: no demo model uses them, and Triton's BYTES tensors need their own (de)serialisation.
_TYPES: dict[str, tuple[str, np.dtype]] = {
    "tensor(float)": ("TYPE_FP32", np.dtype(np.float32)),
    "tensor(float16)": ("TYPE_FP16", np.dtype(np.float16)),
    "tensor(double)": ("TYPE_FP64", np.dtype(np.float64)),
    "tensor(int8)": ("TYPE_INT8", np.dtype(np.int8)),
    "tensor(int16)": ("TYPE_INT16", np.dtype(np.int16)),
    "tensor(int32)": ("TYPE_INT32", np.dtype(np.int32)),
    "tensor(int64)": ("TYPE_INT64", np.dtype(np.int64)),
    "tensor(uint8)": ("TYPE_UINT8", np.dtype(np.uint8)),
    "tensor(uint16)": ("TYPE_UINT16", np.dtype(np.uint16)),
    "tensor(uint32)": ("TYPE_UINT32", np.dtype(np.uint32)),
    "tensor(uint64)": ("TYPE_UINT64", np.dtype(np.uint64)),
}


def datatype_name(dtype: np.dtype) -> str:
    """The KServe v2 name of a numpy dtype (FP32, INT64, ...), as clients see it."""
    for triton_type, np_dtype in _TYPES.values():
        if np_dtype == dtype:
            return triton_type.removeprefix("TYPE_")
    return str(dtype)


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: its dims exclude the batch dim when the model batches.

    A dim of -1 accepts any size. `dim_names` holds the graph's symbolic name of each dim (None
    where it has none): dims that share a name, like `sequence` of `input_ids` and
    `attention_mask`, must have the same size within a request.
    """

    name: str
    dtype: np.dtype
    dims: tuple[int, ...]
    dim_names: tuple[str | None, ...] = ()

    @property
    def triton_type(self) -> str:
        return "TYPE_" + datatype_name(self.dtype)

    def describe(self) -> str:
        return f"{self.name} ({datatype_name(self.dtype)} {list(self.dims)})"

    def as_config(self) -> dict:
        """The entry Triton's auto-complete expects for `add_input` / `add_output`."""
        return {"name": self.name, "data_type": self.triton_type, "dims": list(self.dims)}


def spec_from_ort(node_arg, batched: bool) -> TensorSpec:
    """Describe an ONNX Runtime `NodeArg`; symbolic or unknown dims become -1.

    With `batched`, the first dim is the batch dim and must not be fixed to a size, or
    Triton's batcher could hand the model more rows than the graph accepts.
    """
    if node_arg.type not in _TYPES:
        raise ModelConfigError(f"tensor '{node_arg.name}' has type {node_arg.type}, which tritonnx does not serve")
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in node_arg.shape)
    names = tuple(d if isinstance(d, str) else None for d in node_arg.shape)
    if batched:
        if not dims:
            raise ModelConfigError(
                f"tensor '{node_arg.name}' is a scalar, so the model cannot batch: set max_batch_size: 0"
            )
        if dims[0] != -1:
            raise ModelConfigError(
                f"tensor '{node_arg.name}' has a fixed first dim {dims[0]}, so it cannot be a batch dim: "
                "export the model with a dynamic batch axis or set max_batch_size: 0"
            )
        dims, names = dims[1:], names[1:]
    return TensorSpec(node_arg.name, _TYPES[node_arg.type][1], dims, names)
