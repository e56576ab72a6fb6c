"""Project proto <-> KServe v2, as pure functions.

Check a PredictRequest against the model, build Triton's ModelInferRequest with binary tensor contents, and turn the
answer back.

Nothing here does I/O, so every rule is unit-tested without a server.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import service_pb2

from tritonnx.backend.tensors import RAW_DTYPES
from tritonnx.client.facade.errors import InvalidArgument
from tritonnx.client.facade.wire import DecodedRequest, EncodedResponse, varint
from tritonnx.client.proto import inference_pb2

# The proto's element types a caller can name (its enum's, FP32 to BOOL), all of them in RAW_DTYPES.
_ELEMENT_TYPES = [name for name in inference_pb2.ElementType.keys() if name != "ELEMENT_TYPE_UNSPECIFIED"]
# Triton casts dims (the batch dim among them) to int: never forward anything larger.
MAX_DIM = 2**31 - 1
_DIMS_SHOWN = 16  # a longer shape is shortened in messages
# ModelInferRequest.raw_input_contents: field 7, length-delimited.
_RAW_INPUT_TAG = bytes([7 << 3 | 2])


@dataclass
class InferCall:
    """Triton's ModelInferRequest for one call: a header and the raw input payloads.

    The payloads are views of the caller's request bytes. `serialize` writes them after the
    header in one join: going through protobuf would copy each of them twice more.
    """

    header: service_pb2.ModelInferRequest  # raw_input_contents left empty
    payloads: list[memoryview]  # one per input, in the order of header.inputs

    def serialize(self) -> bytes:
        parts = [self.header.SerializeToString()]
        for payload in self.payloads:
            parts += (_RAW_INPUT_TAG, varint(len(payload)), payload)
        return b"".join(parts)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    datatype: str  # KServe v2 name, e.g. FP32
    shape: tuple[int, ...]  # full shape as Triton's metadata gives it; -1 accepts any size
    optional: bool = False  # an input a request may leave out (the model has a default)


@dataclass(frozen=True)
class ModelInfo:
    """What the facade needs to know of a served model, from Triton's metadata and config."""

    name: str
    version: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    max_batch_size: int
    versions: tuple[str, ...] = ()  # the versions Triton serves, from its metadata

    @classmethod
    def from_triton(
        cls, metadata: service_pb2.ModelMetadataResponse, config: service_pb2.ModelConfigResponse, version: str
    ) -> ModelInfo:
        optional = {t.name for t in config.config.input if t.optional}

        def tensors(items: Iterable[service_pb2.ModelMetadataResponse.TensorMetadata]) -> tuple[TensorInfo, ...]:
            return tuple(
                TensorInfo(t.name, t.datatype, tuple(int(d) for d in t.shape), t.name in optional) for t in items
            )

        return cls(
            metadata.name,
            version,
            tensors(metadata.inputs),
            tensors(metadata.outputs),
            config.config.max_batch_size,
            tuple(metadata.versions),
        )

    def describe_inputs(self) -> str:
        return ", ".join(
            f"{t.name} ({t.datatype} {list(t.shape)}{', optional' if t.optional else ''})" for t in self.inputs
        )


def _datatype_of(dtype: int, name: str) -> str:
    """The KServe name of a proto ElementType; unspecified means FP32.

    proto3 enums are open: a client built from a newer proto, or a hand-made message, can send a
    number this proto does not define (it parses fine), which is the caller's error.
    """
    if dtype == inference_pb2.ELEMENT_TYPE_UNSPECIFIED:
        return "FP32"
    try:
        return inference_pb2.ElementType.Name(dtype)
    except ValueError:
        raise InvalidArgument(
            f"input '{name}' has dtype {dtype}, which is not an ElementType: use one of {', '.join(_ELEMENT_TYPES)}"
        ) from None


def check_tensor(
    name: str, datatype: str, shape: Sequence[int], nbytes: int, spec: TensorInfo, info: ModelInfo
) -> None:
    """Raise InvalidArgument, with what the model expects, unless the tensor fits `spec`.

    Its rank is at most wire.MAX_RANK: longer shapes were refused while the request was decoded.
    """
    shape = list(shape)
    problem = _tensor_problem(name, datatype, shape, nbytes, spec, info)
    if problem:
        raise InvalidArgument(problem.replace("{expects}", f"model '{info.name}' expects {info.describe_inputs()}"))


def _tensor_problem(
    name: str, datatype: str, shape: list[int], nbytes: int, spec: TensorInfo, info: ModelInfo
) -> str | None:
    """What is wrong with the tensor, or None.

    `{expects}` stands for the model's inputs (built only when needed: this runs for every request).
    """
    if not shape:
        return f"input '{name}' has no shape: give its full shape, e.g. {list(spec.shape)}; {{expects}}"
    if any(d < 0 for d in shape):
        return f"input '{name}' has shape {_dims(shape)}: a dim cannot be negative; {{expects}}"
    if any(d > MAX_DIM for d in shape):
        return f"input '{name}' has shape {_dims(shape)}: dims above {MAX_DIM} are not accepted; {{expects}}"
    if len(shape) != len(spec.shape):
        return f"input '{name}' has shape {_dims(shape)} (rank {len(shape)}) but the model wants rank {len(spec.shape)}; {{expects}}"
    if any(want != -1 and got != want for got, want in zip(shape, spec.shape, strict=False)):
        return f"input '{name}' has shape {_dims(shape)}, which does not fit {list(spec.shape)}; {{expects}}"
    if info.max_batch_size > 0 and shape[0] == 0:
        # Triton would drop a batch dim of 0 and hand the model a tensor of another rank.
        return f"input '{name}' has batch size 0: send 1 to {info.max_batch_size} (the model's max_batch_size)"
    if info.max_batch_size > 0 and shape[0] > info.max_batch_size:
        return (
            f"input '{name}' has batch size {shape[0]}, above the model's max_batch_size {info.max_batch_size}: "
            "split the request"
        )
    if datatype != spec.datatype:
        return f"input '{name}' is {datatype} but the model wants {spec.datatype}; {{expects}}"
    elements = math.prod(shape)
    itemsize = RAW_DTYPES[datatype].itemsize
    if nbytes != elements * itemsize:
        return f"input '{name}' carries {nbytes // itemsize} values but shape {_dims(shape)} needs {elements}" + (
            "" if nbytes % itemsize == 0 else f" ({nbytes} bytes is not a whole number of {datatype} values)"
        )
    return None


def _dims(shape: list[int]) -> str:
    """A shape for a message: a caller's shape of a million dims must not become a message of megabytes."""
    if len(shape) <= _DIMS_SHOWN:
        return str(shape)
    return f"[{', '.join(map(str, shape[: _DIMS_SHOWN // 2]))}, ... ({len(shape)} dims)]"


def _input_tensor(name: str, datatype: str, shape: Sequence[int]) -> service_pb2.ModelInferRequest.InferInputTensor:
    return service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=list(shape))


def _bytes_view(buffer: bytes | np.ndarray | None) -> memoryview:
    if buffer is None:
        return memoryview(b"")
    return (buffer.data if isinstance(buffer, np.ndarray) else memoryview(buffer)).cast("B")


def to_infer_request(decoded: DecodedRequest, info: ModelInfo, timeout_us: int | None) -> InferCall:
    """Triton's request for one PredictRequest, inputs as raw little-endian bytes."""
    message = decoded.message
    forms = [
        name
        for name, present in (
            ("data", decoded.data is not None),
            ("raw_data", decoded.raw is not None),
            ("inputs", len(message.inputs) > 0),
        )
        if present
    ]
    if len(forms) > 1:
        raise InvalidArgument(f"the request sets {' and '.join(forms)}: set exactly one of data, raw_data or inputs")
    # `0 in`, not a product: a caller's million dims of 2^63 would make a product of 63 million bits.
    if not forms and len(info.inputs) == 1 and 0 in message.shape:
        # An empty tensor has no bytes, and proto3 does not send empty fields: this is raw_data of
        # no bytes, whose shape and dtype the checks below hold to the model.
        forms = ["raw_data"]
    if not forms:
        raise InvalidArgument(
            "the request has no input: set data (floats) with shape, raw_data with dtype and shape, "
            f"or named inputs; model '{info.name}' expects {info.describe_inputs()}"
        )

    request = service_pb2.ModelInferRequest(
        model_name=info.name, model_version=message.model_version, id=message.request_id
    )
    payloads: list[memoryview] = []
    if forms[0] in ("data", "raw_data"):
        if len(info.inputs) != 1:
            raise InvalidArgument(
                f"model '{info.name}' takes {len(info.inputs)} inputs ({info.describe_inputs()}): "
                "send them by name in `inputs`"
            )
        spec = info.inputs[0]
        if forms[0] == "data":
            datatype, payload = "FP32", _bytes_view(decoded.data)
            if message.dtype not in (inference_pb2.ELEMENT_TYPE_UNSPECIFIED, inference_pb2.FP32):
                raise InvalidArgument("`data` holds FP32 values: send other datatypes as raw_data with dtype")
        else:
            datatype, payload = _datatype_of(message.dtype, spec.name), decoded.raw or memoryview(b"")
        check_tensor(spec.name, datatype, message.shape, len(payload), spec, info)
        request.inputs.append(_input_tensor(spec.name, datatype, message.shape))
        payloads.append(payload)
    else:
        specs = {t.name: t for t in info.inputs}
        given = [t.name for t in message.inputs]
        unknown = sorted(set(given) - set(specs))
        missing = [name for name, spec in specs.items() if name not in given and not spec.optional]
        if unknown or missing or len(given) != len(set(given)):
            raise InvalidArgument(
                f"inputs {given} do not match the model's: model '{info.name}' expects {info.describe_inputs()}"
                + (f"; unknown: {unknown}" if unknown else "")
                + (f"; missing: {missing}" if missing else "")
            )
        for tensor in message.inputs:
            datatype = _datatype_of(tensor.dtype, tensor.name)
            raw = tensor.raw_data  # one copy out of protobuf; named inputs are small (token ids)
            check_tensor(tensor.name, datatype, tensor.shape, len(raw), specs[tensor.name], info)
            request.inputs.append(_input_tensor(tensor.name, datatype, tensor.shape))
            payloads.append(_bytes_view(raw))

    outputs = {t.name for t in info.outputs}
    unknown_outputs = [name for name in message.output_names if name not in outputs]
    if unknown_outputs:
        raise InvalidArgument(
            f"unknown output(s) {unknown_outputs}: model '{info.name}' returns {[t.name for t in info.outputs]}"
        )
    for name in message.output_names:
        request.outputs.append(service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=name))
    if message.priority:
        request.parameters["priority"].uint64_param = message.priority
    if timeout_us is not None:
        request.parameters["timeout"].int64_param = timeout_us
    return InferCall(request, payloads)


def is_extended(decoded: DecodedRequest) -> bool:
    """Requests that use the extended contract get every output as named raw tensors."""
    message = decoded.message
    return decoded.raw is not None or len(message.inputs) > 0 or len(message.output_names) > 0


def to_predict_response(
    decoded: DecodedRequest, info: ModelInfo, response: service_pb2.ModelInferResponse
) -> EncodedResponse:
    """The PredictResponse.

    The first output as floats (the simple contract), plus named raw outputs for extended requests.
    """
    message = decoded.message
    by_name = {
        output.name: (output, raw) for output, raw in zip(response.outputs, response.raw_output_contents, strict=False)
    }
    first_name = message.output_names[0] if message.output_names else info.outputs[0].name
    if first_name not in by_name:  # computed by a version with other outputs than the metadata held (a swap)
        first_name = response.outputs[0].name
    first, first_raw = by_name[first_name]
    predictions = np.frombuffer(first_raw, dtype=RAW_DTYPES[first.datatype]).astype(np.float32, copy=False)
    reply = inference_pb2.PredictResponse(
        shape=list(first.shape),
        request_id=message.request_id,
        model_name=response.model_name,
        model_version=response.model_version,
    )
    if is_extended(decoded):
        for output, raw in by_name.values():
            reply.outputs.append(
                inference_pb2.Tensor(
                    name=output.name,
                    dtype=output.datatype,  # the proto's ElementType names are KServe's
                    shape=list(output.shape),
                    raw_data=raw,
                )
            )
    return EncodedResponse(reply, predictions)


def to_list_models_response(
    entries: Sequence[service_pb2.RepositoryIndexResponse.ModelIndex], infos: dict[tuple[str, str], ModelInfo]
) -> inference_pb2.ListModelsResponse:
    """The repository index as ListModels answers it; `infos` has the tensors of the ready versions."""
    response = inference_pb2.ListModelsResponse()
    for entry in sorted(entries, key=lambda e: (e.name, int(e.version) if e.version.isdigit() else -1)):
        model = response.models.add(name=entry.name, version=entry.version, state=entry.state, reason=entry.reason)
        info = infos.get((entry.name, entry.version))
        if info is not None:
            model.max_batch_size = info.max_batch_size
            for specs, tensors in ((model.inputs, info.inputs), (model.outputs, info.outputs)):
                for t in tensors:
                    specs.add(name=t.name, datatype=t.datatype, shape=t.shape, optional=t.optional)
    return response
