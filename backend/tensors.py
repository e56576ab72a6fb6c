"""Tensor descriptions shared by validation, batching and auto-complete.

Datatypes travel under four names: ONNX's element type number, Triton's model configuration
(`TYPE_FP32`), KServe v2's datatype (`FP32`, what clients see) and numpy's; the table below is
the one place they are related.

Two ONNX shapes have no Triton config of their own, so the config and the graph differ there:
- a scalar (rank 0, or nothing after the batch dim: shape [batch]) is declared `dims: [1]`:
  clients send and receive shape [1] (or [batch, 1]), and the backend reshapes it, as Triton's
  onnxruntime backend does with `reshape: { shape: [] }` (which Triton 2.51 refuses for a model
  that does not batch, and the Python backend's auto-complete cannot write);
- a fixed dim of size 0 (an empty `axes` input) is declared -1, Triton allowing no 0 in dims; the
  backend still holds the request to the graph's 0;
- a tensor of unknown rank (no shape in the graph) is declared `dims: [1]` in a model that does
  not batch, as Triton's onnxruntime backend declares it (ONNX Runtime reports no dims for it, as
  for a scalar): the request's tensor reaches ONNX Runtime at the shape it came with, and an
  output at the shape ONNX Runtime gives it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tritonnx.backend.errors import ModelConfigError


@dataclass(frozen=True)
class ElementType:
    """One ONNX tensor element type and what Triton's Python backend makes of it."""

    onnx_name: str  # as ONNX Runtime spells it: tensor(float)
    datatype: str | None  # KServe v2 / Triton name (FP32, BYTES); None: Triton has no such type
    dtype: np.dtype | None  # numpy dtype in the Python stub; None: the stub cannot hand it to numpy

    @property
    def config_type(self) -> str:
        # Triton's model configuration calls BYTES tensors TYPE_STRING.
        return "TYPE_STRING" if self.datatype == "BYTES" else f"TYPE_{self.datatype}"


# onnx.TensorProto.DataType number -> element type.
ELEMENT_TYPES: dict[int, ElementType] = {
    1: ElementType("tensor(float)", "FP32", np.dtype(np.float32)),
    2: ElementType("tensor(uint8)", "UINT8", np.dtype(np.uint8)),
    3: ElementType("tensor(int8)", "INT8", np.dtype(np.int8)),
    4: ElementType("tensor(uint16)", "UINT16", np.dtype(np.uint16)),
    5: ElementType("tensor(int16)", "INT16", np.dtype(np.int16)),
    6: ElementType("tensor(int32)", "INT32", np.dtype(np.int32)),
    7: ElementType("tensor(int64)", "INT64", np.dtype(np.int64)),
    8: ElementType("tensor(string)", "BYTES", np.dtype(np.object_)),
    9: ElementType("tensor(bool)", "BOOL", np.dtype(np.bool_)),
    10: ElementType("tensor(float16)", "FP16", np.dtype(np.float16)),
    11: ElementType("tensor(double)", "FP64", np.dtype(np.float64)),
    12: ElementType("tensor(uint32)", "UINT32", np.dtype(np.uint32)),
    13: ElementType("tensor(uint64)", "UINT64", np.dtype(np.uint64)),
    14: ElementType("tensor(complex64)", None, None),
    15: ElementType("tensor(complex128)", None, None),
    # Triton has BF16, but its Python backend 24.10 refuses `as_numpy()` on it (numpy has no
    # bfloat16) and offers only DLPack, which would need torch in the stub.
    16: ElementType("tensor(bfloat16)", "BF16", None),
    17: ElementType("tensor(float8e4m3fn)", None, None),
    18: ElementType("tensor(float8e4m3fnuz)", None, None),
    19: ElementType("tensor(float8e5m2)", None, None),
    20: ElementType("tensor(float8e5m2fnuz)", None, None),
    21: ElementType("tensor(uint4)", None, None),
    22: ElementType("tensor(int4)", None, None),
    23: ElementType("tensor(float4e2m1)", None, None),
}
_BY_DTYPE = {t.dtype: t for t in ELEMENT_TYPES.values() if t.dtype is not None}
# KServe v2 datatype -> numpy dtype of its raw bytes in a request or response (little-endian): every type
# of fixed-size elements numpy has (not BYTES, not BF16).
RAW_DTYPES: dict[str, np.dtype] = {
    t.datatype: t.dtype.newbyteorder("<")
    for t in ELEMENT_TYPES.values()
    if t.datatype is not None and t.dtype is not None and t.dtype != np.object_
}


def datatype_name(dtype: np.dtype) -> str:
    """The KServe v2 name of a numpy dtype (FP32, INT64, BYTES, ...), as clients see it."""
    element = _BY_DTYPE.get(np.dtype(dtype))
    return element.datatype if element is not None and element.datatype else str(dtype)


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as the graph declares it; dims exclude the batch dim when the model batches.

    A dim of -1 accepts any size (0 included). `dim_names` holds the graph's symbolic name of
    each dim (None where it has none): dims that share a name, like `sequence` of `input_ids`
    and `attention_mask`, must have the same size within a request, and an output dim named
    like a ragged input's dim is cut back to each request's own size. An `optional` input has
    a default in the graph (an initializer) and may be left out of a request. An `any_rank` tensor
    has no shape in the graph: no dims, served as `[1]` like a scalar, taken at any shape.
    """

    name: str
    dtype: np.dtype
    dims: tuple[int, ...]
    dim_names: tuple[str | None, ...] = ()
    optional: bool = False
    any_rank: bool = False

    @property
    def is_string(self) -> bool:
        return self.dtype == np.object_

    @property
    def scalar(self) -> bool:
        """No dims (after the batch dim, if any): served with one more dim of size 1."""
        return not self.dims

    @property
    def config_dims(self) -> list[int]:
        """The dims Triton's configuration can hold: a scalar is [1], a fixed 0 is -1."""
        if self.scalar:
            return [1]
        return [-1 if d == 0 else d for d in self.dims]

    @property
    def config_type(self) -> str:
        return _BY_DTYPE[self.dtype].config_type

    def describe(self) -> str:
        shape = (
            "unknown rank, sent as [1]"
            if self.any_rank
            else "scalar, sent as [1]"
            if self.scalar
            else str(list(self.dims))
        )
        return f"{self.name} ({datatype_name(self.dtype)} {shape}{', optional' if self.optional else ''})"

    def as_config(self) -> dict[str, object]:
        """The entry Triton's auto-complete expects for `add_input` / `add_output`."""
        entry: dict[str, object] = {"name": self.name, "data_type": self.config_type, "dims": self.config_dims}
        if self.optional:
            entry["optional"] = True
        return entry


def tensor_spec(
    name: str,
    elem_type: int,
    shape: tuple[int | str | None, ...] | None,
    batched: bool,
    optional: bool = False,
    role: str = "tensor",
) -> TensorSpec:
    """Describe one graph input or output; symbolic or unknown dims become -1.

    `shape` is None when the graph gives no shape at all (unknown rank): served as Triton's onnxruntime
    backend serves it, in a model that does not batch. With `batched`, the first dim is the batch dim
    and must not be fixed to a size, or Triton's batcher could hand the model more rows than the graph
    accepts.
    """
    element = ELEMENT_TYPES.get(elem_type)
    if element is None or element.datatype is None:
        what = element.onnx_name if element else f"element type {elem_type}"
        raise ModelConfigError(f"{role} '{name}' is a {what} tensor, which Triton has no datatype for")
    if element.dtype is None:
        raise ModelConfigError(
            f"{role} '{name}' is a {element.onnx_name} tensor: Triton 2.51's Python backend cannot hand "
            f"{element.datatype} tensors to numpy, so tritonnx cannot serve it (cast it to float16 or float in the graph)"
        )
    if shape is None:
        if batched:
            raise ModelConfigError(
                f"{role} '{name}' has no shape in the graph (unknown rank), so it has no batch dim: set "
                "max_batch_size: 0 (Triton's onnxruntime backend refuses it too), or give it a shape when exporting "
                "the model"
            )
        return TensorSpec(name, element.dtype, (), (), optional, any_rank=True)
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)
    names = tuple(d if isinstance(d, str) and d else None for d in shape)
    if batched:
        if not dims:
            raise ModelConfigError(f"{role} '{name}' is a scalar, so the model cannot batch: set max_batch_size: 0")
        if dims[0] != -1:
            raise ModelConfigError(
                f"{role} '{name}' has a fixed first dim {dims[0]}, so it cannot be a batch dim: "
                "export the model with a dynamic batch axis or set max_batch_size: 0"
            )
        dims, names = dims[1:], names[1:]
    return TensorSpec(name, element.dtype, dims, names, optional)
