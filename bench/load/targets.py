"""What the load loops call: Triton's KServe v2 `ModelInfer` and the facade's `Predict`, over gRPC.

The load generator shares the 2 cores with the servers it loads, so a call costs it as little as
it can: each target builds its requests ONCE, as serialized bytes, and the gRPC method is called
with no serializer and no deserializer, so the bytes go straight through; all workers share one
channel. Only the first response
is decoded and checked (`verify`), unless the target was given the outputs its requests expect:
then every answer is decoded and compared (the overload's check that nothing comes back wrong).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2

from tritonnx.backend.tensors import RAW_DTYPES, datatype_name
from tritonnx.client.proto import inference_pb2

M = TypeVar("M", bound=Message)

CALL_TIMEOUT_S = 30.0
IMAGE_SHAPE = (3, 224, 224)
IMAGE_CLASSES = 1000
TEXT_SEQUENCE = 16  # length of the generated INT64 inputs (and of other variable dims)
TEXT_INPUTS = ("input_ids", "attention_mask")
_GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


class VerificationError(RuntimeError):
    """The target's first response is not what the request asks for (or the call failed)."""


class Target(Protocol):
    """What the loops need of a target; `call` returns None on success, else an error label."""

    name: str
    model: str
    batch: int
    timeout_s: float

    @property
    def is_open(self) -> bool: ...

    async def open(self, concurrency: int = 1) -> None: ...

    async def verify(self) -> None: ...

    async def call(self) -> str | None: ...

    async def close(self) -> None: ...


def random_tensor(name: str, datatype: str, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Random data for one input: floats normal, integer ids in [1, 1000), names with "mask" all ones."""
    dtype = RAW_DTYPES[datatype]
    if "mask" in name.lower() or dtype.kind == "b":
        return np.ones(shape, dtype=dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)
    if dtype.kind in "iu":
        return rng.integers(1, 1000, size=shape).astype(dtype)
    raise ValueError(f"cannot generate data for input '{name}' of type {datatype}")


def close_enough(actual: np.ndarray, expected: np.ndarray) -> bool:
    """The same output up to float noise: ONNX Runtime in the server vs in this process."""
    scale = float(np.abs(expected).max()) or 1.0
    return actual.shape == expected.shape and bool(np.allclose(actual, expected, rtol=1e-4, atol=1e-4 * scale))


def _concrete(dims: Sequence[int], batch: int, batched: bool) -> list[int]:
    """Metadata dims with the batch dim set to `batch` and other variable dims to TEXT_SEQUENCE."""
    shape = [int(d) for d in dims]
    if batched:
        shape[0] = batch
    return [TEXT_SEQUENCE if d < 0 else d for d in shape]


def _strip_scheme(url: str) -> str:
    for prefix in ("grpc://", "http://", "dns:///"):
        if url.startswith(prefix):
            return url[len(prefix) :].rstrip("/")
    return url


class GrpcTarget:
    """One gRPC method called with prebuilt requests, in turn.

    `images` (FP32 arrays of `batch` images) replace the random data, or `inputs` (each a request's arrays by input
    name, for models with several inputs or integer ones: the text models, sequences of mixed lengths); `expected`
    (the flat first output each of them should get) makes every answer checked, a mismatch counted in `wrong`.
    """

    name: str
    method_path: str

    def __init__(
        self,
        url: str,
        model: str,
        batch: int,
        *,
        images: Sequence[np.ndarray] | None = None,
        expected: Sequence[np.ndarray] | None = None,
        inputs: Sequence[dict[str, np.ndarray]] | None = None,
        seed: int = 0,
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        if images is not None and inputs is not None:
            raise ValueError("give images or inputs, not both")
        if images is not None and any(len(image) != batch for image in images):
            raise ValueError(f"every array of images must hold a batch of {batch}")
        if inputs is not None and any(len(array) != batch for named in inputs for array in named.values()):
            raise ValueError(f"every input array must hold a batch of {batch}")
        requests = images if images is not None else inputs
        if expected is not None and (requests is None or len(expected) != len(requests)):
            raise ValueError("expected outputs need one array of images each (or one request's inputs)")
        self.url, self.model, self.batch, self.timeout_s = _strip_scheme(url), model, batch, timeout_s
        self.images, self.inputs, self.expected, self.seed = images, inputs, expected, seed
        self.payloads: list[bytes] = []
        self.wrong = 0  # answers unlike `expected`
        self._next = 0
        self._channel: grpc.aio.Channel | None = None
        self._method: grpc.aio.UnaryUnaryMultiCallable | None = None

    @property
    def is_open(self) -> bool:
        return self._channel is not None

    async def open(self, concurrency: int = 1) -> None:
        self._channel = grpc.aio.insecure_channel(self.url, options=_GRPC_OPTIONS)
        self._method = self._channel.unary_unary(self.method_path, request_serializer=None, response_deserializer=None)
        if not self.payloads:
            try:
                self.payloads = await self._build()
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)
        self._channel = self._method = None

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            raise RuntimeError(f"{self.name}: open() the target first")
        return self._channel

    @property
    def method(self) -> grpc.aio.UnaryUnaryMultiCallable:
        if self._method is None:
            raise RuntimeError(f"{self.name}: open() the target first")
        return self._method

    async def _build(self) -> list[bytes]:
        raise NotImplementedError

    def output(self, body: bytes) -> np.ndarray:
        """The first output of an answer, flat, as float32."""
        raise NotImplementedError

    async def verify(self) -> None:
        """Decode the first request's answer and check it fits the request; VerificationError if not."""
        raise NotImplementedError

    async def call(self) -> str | None:
        """One call with the next prepared request: None on success, else the gRPC status name."""
        index = self._next
        self._next = (index + 1) % len(self.payloads)
        try:
            body = await self.method(self.payloads[index], timeout=self.timeout_s)
        except grpc.aio.AioRpcError as error:
            self.failed(error)
            return error.code().name
        self.check(index, body)
        return None

    def failed(self, error: grpc.aio.AioRpcError) -> None:
        """A call that ended with an error status (counted by the caller; a subclass may record it)."""

    def check(self, index: int, body: bytes) -> None:
        """Count the answer to request `index` as wrong when it is unlike the expected output."""
        if self.expected is not None and not close_enough(self.output(body), self.expected[index]):
            self.wrong += 1

    async def _first(self, where: str, response_type: type[M]) -> M:
        """The first request's answer, decoded."""
        try:
            body = await self.method(self.payloads[0], timeout=self.timeout_s)
        except grpc.aio.AioRpcError as error:
            raise VerificationError(f"{where}: first call failed: {error.code().name}: {error.details()}") from None
        try:
            return response_type.FromString(body)
        except DecodeError:
            raise VerificationError(
                f"{where}: the first response ({len(body)} bytes) is not a {response_type.DESCRIPTOR.full_name}"
            ) from None


class KServeTarget(GrpcTarget):
    """Triton's KServe v2 gRPC `ModelInfer`, inputs from the model's metadata as raw bytes."""

    name = "triton-grpc"
    method_path = "/inference.GRPCInferenceService/ModelInfer"

    def __init__(self, url: str, model: str = "resnet50", batch: int = 1, **options: Any) -> None:
        super().__init__(url, model, batch, **options)
        self.metadata: service_pb2.ModelMetadataResponse | None = None

    async def _build(self) -> list[bytes]:
        metadata_call = self.channel.unary_unary(
            "/inference.GRPCInferenceService/ModelMetadata",
            request_serializer=service_pb2.ModelMetadataRequest.SerializeToString,
            response_deserializer=service_pb2.ModelMetadataResponse.FromString,
        )
        try:
            metadata = await metadata_call(service_pb2.ModelMetadataRequest(name=self.model), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as error:
            raise VerificationError(
                f"ModelMetadata of '{self.model}' at {self.url} failed: {error.code().name}: {error.details()}"
            ) from None
        if not metadata.inputs:
            raise VerificationError(f"model '{self.model}' at {self.url} has no inputs in its metadata")
        self.metadata = metadata
        specs = metadata.inputs
        if self.images is not None:
            return [self._request({specs[0].name: (specs[0].datatype, image)}) for image in self.images]
        if self.inputs is not None:
            datatypes = {spec.name: spec.datatype for spec in specs}
            return [
                self._request({name: (datatypes[name], array) for name, array in named.items()})
                for named in self.inputs
            ]
        rng = np.random.default_rng(self.seed)
        arrays = {}
        for spec in specs:
            # Triton lists the batch dim as -1 for batching models: [-1, 3, 224, 224].
            shape = _concrete(spec.shape, self.batch, batched=len(spec.shape) > 0 and spec.shape[0] == -1)
            arrays[spec.name] = (spec.datatype, random_tensor(spec.name, spec.datatype, shape, rng))
        return [self._request(arrays)]

    def _request(self, arrays: dict[str, tuple[str, np.ndarray]]) -> bytes:
        request = service_pb2.ModelInferRequest(model_name=self.model)
        for name, (datatype, data) in arrays.items():
            request.inputs.add(name=name, datatype=datatype, shape=list(data.shape))
            request.raw_input_contents.append(data.astype(RAW_DTYPES[datatype], copy=False).tobytes())
        return request.SerializeToString()

    def output(self, body: bytes) -> np.ndarray:
        return np.frombuffer(service_pb2.ModelInferResponse.FromString(body).raw_output_contents[0], "<f4")

    async def verify(self) -> None:
        """Decode the first response: every output of the metadata, batch-first, with its bytes."""
        where = f"triton-grpc {self.url} model '{self.model}' batch {self.batch}"
        response = await self._first(where, service_pb2.ModelInferResponse)
        assert self.metadata is not None  # read by open()
        expected = {o.name: o for o in self.metadata.outputs}
        got = [o.name for o in response.outputs]
        if sorted(got) != sorted(expected):
            raise VerificationError(
                f"{where}: response has outputs {got}, the model's metadata lists {sorted(expected)}"
            )
        if len(response.raw_output_contents) != len(response.outputs):
            raise VerificationError(
                f"{where}: {len(response.outputs)} outputs but {len(response.raw_output_contents)} raw_output_contents"
            )
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=False):
            shape = list(output.shape)
            dims = list(expected[output.name].shape)
            fits = len(shape) == len(dims) and all(d < 0 or d == s for d, s in zip(dims, shape, strict=False))
            if not fits or (dims and dims[0] == -1 and shape[0] != self.batch):
                raise VerificationError(
                    f"{where}: output '{output.name}' has shape {shape}, expected "
                    f"{[self.batch, *dims[1:]] if dims else dims}"
                )
            size = math.prod(shape) * RAW_DTYPES.get(output.datatype, np.dtype("u1")).itemsize
            if len(raw) != size:
                raise VerificationError(
                    f"{where}: output '{output.name}' carries {len(raw)} bytes, "
                    f"shape {shape} of {output.datatype} needs {size}"
                )


class FacadeTarget(GrpcTarget):
    """The project's `inference.InferenceService/Predict`.

    An image goes as `raw_data` (compact bytes). Text models (`text_inputs`, by default for model
    names containing "text") are sent as named INT64 `inputs` of shape [batch, 16].
    """

    method_path = "/inference.InferenceService/Predict"

    def __init__(
        self,
        url: str,
        model: str = "resnet50",
        batch: int = 1,
        *,
        text_inputs: Sequence[str] | None = None,
        image_shape: Sequence[int] = IMAGE_SHAPE,
        **options: Any,
    ) -> None:
        super().__init__(url, model, batch, **options)
        self.name = "facade"
        self.text_inputs = (
            tuple(text_inputs) if text_inputs is not None else (TEXT_INPUTS if "text" in model.lower() else ())
        )
        self.image_shape = tuple(image_shape)

    async def _build(self) -> list[bytes]:
        rng = np.random.default_rng(self.seed)
        if self.inputs is not None:
            return [self._named_request(named) for named in self.inputs]
        if self.text_inputs:
            shape = [self.batch, TEXT_SEQUENCE]
            request = inference_pb2.PredictRequest(model_name=self.model)
            for name in self.text_inputs:
                request.inputs.add(
                    name=name,
                    dtype=inference_pb2.INT64,
                    shape=shape,
                    raw_data=random_tensor(name, "INT64", shape, rng).tobytes(),
                )
            return [request.SerializeToString()]
        if self.images is not None:
            return [self._image_request(image) for image in self.images]
        return [self._image_request(random_tensor("input", "FP32", [self.batch, *self.image_shape], rng))]

    def _named_request(self, named: dict[str, np.ndarray]) -> bytes:
        """Named raw inputs of any type in the dtype table (the text models' INT64 ids and mask)."""
        request = inference_pb2.PredictRequest(model_name=self.model)
        for name, array in named.items():
            datatype = datatype_name(array.dtype)
            raw = array.astype(RAW_DTYPES[datatype], copy=False).tobytes()
            request.inputs.add(
                name=name, dtype=inference_pb2.ElementType.Value(datatype), shape=array.shape, raw_data=raw
            )
        return request.SerializeToString()

    def _image_request(self, image: np.ndarray) -> bytes:
        request = inference_pb2.PredictRequest(model_name=self.model, shape=image.shape, dtype=inference_pb2.FP32)
        request.raw_data = image.astype("<f4", copy=False).tobytes()
        return request.SerializeToString()

    def output(self, body: bytes) -> np.ndarray:
        return np.array(inference_pb2.PredictResponse.FromString(body).predictions, np.float32)

    async def verify(self) -> None:
        """Decode the first response: a PredictResponse whose shape starts with the batch."""
        where = f"{self.name} {self.url} model '{self.model}' batch {self.batch}"
        response = await self._first(where, inference_pb2.PredictResponse)
        shape = list(response.shape)
        if not shape or shape[0] != self.batch:
            raise VerificationError(f"{where}: response shape {shape}, expected the batch {self.batch} first")
        if len(response.predictions) != math.prod(shape):
            raise VerificationError(f"{where}: {len(response.predictions)} predictions for shape {shape}")
        for output in response.outputs:
            if not output.shape or output.shape[0] != self.batch:
                raise VerificationError(
                    f"{where}: output '{output.name}' has shape {list(output.shape)}, "
                    f"expected the batch {self.batch} first"
                )
        if not response.outputs:
            raise VerificationError(f"{where}: an extended (raw/named) request got no named outputs")
