"""What the load loops call: Triton's KServe v2 `ModelInfer` and the facade's `Predict`, over gRPC.

The load generator shares the cores with the servers it loads, so a call costs it as little as it can: each target
builds its requests ONCE, as serialized bytes, and calls the gRPC method with no serializer and no deserializer; all
workers share one channel. Only the first answer is decoded and checked (`verify`), unless the target was given the
outputs its requests expect: then every answer is compared (`wrong` counts the mismatches).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2

from tritonnx.backend.tensors import RAW_DTYPES, datatype_name
from tritonnx.client.proto import inference_pb2

M = TypeVar("M", bound=Message)
# A request: a batch of the first input (an image batch), or its arrays by input name (the text models).
Request = np.ndarray | dict[str, np.ndarray]

CALL_TIMEOUT_S = 30.0
IMAGE_SHAPE = (3, 224, 224)
IMAGE_CLASSES = 1000
TEXT_SEQUENCE = 16  # the length of generated inputs' variable dims
_GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


class VerificationError(RuntimeError):
    """The target's first response is not what the request asks for (or the call failed)."""


class Target(Protocol):
    """What the loops need of a target; `call` returns None on success, else an error label."""

    name: str
    model: str
    batch: int
    timeout_s: float
    wrong: int  # answers unlike the expected outputs the target was given

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


class GrpcTarget:
    """One gRPC method called with prebuilt requests in turn: random, or `images` (checked if `expected`)."""

    name: str
    method_path: str

    def __init__(
        self,
        url: str,
        model: str,
        batch: int,
        *,
        images: Sequence[Request] | None = None,
        expected: Sequence[np.ndarray] | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        arrays = [a for r in images or () for a in (r.values() if isinstance(r, dict) else [r])]
        if batch < 1 or any(len(array) != batch for array in arrays):
            raise ValueError(f"every request must hold a batch of {batch}")
        if expected is not None and (images is None or len(expected) != len(images)):
            raise ValueError("expected outputs need one array of images each (or one request's inputs)")
        self.url, self.model, self.batch, self.timeout_s = url, model, batch, timeout_s
        self.images, self.expected = images, expected
        self.payloads: list[bytes] = []
        self.wrong = 0  # answers unlike `expected`
        self._next = 0
        self._channel: grpc.aio.Channel | None = None
        self.method: grpc.aio.UnaryUnaryMultiCallable

    @property
    def is_open(self) -> bool:
        return self._channel is not None

    async def open(self, concurrency: int = 1) -> None:
        self._channel = grpc.aio.insecure_channel(self.url, options=_GRPC_OPTIONS)
        self.method = self._channel.unary_unary(self.method_path, request_serializer=None, response_deserializer=None)
        if not self.payloads:
            try:
                self.payloads = await self._build(self._channel)
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)
        self._channel = None

    async def _build(self, channel: grpc.aio.Channel) -> list[bytes]:
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

    async def _first(self, response_type: type[M]) -> tuple[str, M]:
        """Where the first request went (for messages), and its answer, decoded."""
        where = f"{self.name} {self.url} model '{self.model}' batch {self.batch}"
        try:
            body = await self.method(self.payloads[0], timeout=self.timeout_s)
        except grpc.aio.AioRpcError as error:
            raise VerificationError(f"{where}: first call failed: {error.code().name}: {error.details()}") from None
        try:
            return where, response_type.FromString(body)
        except DecodeError:
            raise VerificationError(
                f"{where}: the first response ({len(body)} bytes) is not a {response_type.DESCRIPTOR.full_name}"
            ) from None


class KServeTarget(GrpcTarget):
    """Triton's KServe v2 gRPC `ModelInfer`, inputs named as the model's metadata names them, as raw bytes."""

    name = "triton-grpc"
    method_path = "/inference.GRPCInferenceService/ModelInfer"
    metadata: service_pb2.ModelMetadataResponse

    async def _build(self, channel: grpc.aio.Channel) -> list[bytes]:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelMetadata",
            request_serializer=service_pb2.ModelMetadataRequest.SerializeToString,
            response_deserializer=service_pb2.ModelMetadataResponse.FromString,
        )
        try:
            self.metadata = await call(service_pb2.ModelMetadataRequest(name=self.model), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as error:
            raise VerificationError(
                f"ModelMetadata of '{self.model}' at {self.url} failed: {error.code().name}: {error.details()}"
            ) from None
        specs = self.metadata.inputs
        if not specs:
            raise VerificationError(f"model '{self.model}' at {self.url} has no inputs in its metadata")
        if self.images is not None:
            return [self._request(r if isinstance(r, dict) else {specs[0].name: r}) for r in self.images]
        rng = np.random.default_rng(0)
        arrays = {}
        for spec in specs:
            # Triton lists the batch dim as -1 for batching models ([-1, 3, 224, 224]); other free dims get a length.
            shape = [int(d) for d in spec.shape]
            if shape and shape[0] == -1:
                shape[0] = self.batch
            shape = [TEXT_SEQUENCE if d < 0 else d for d in shape]
            arrays[spec.name] = random_tensor(spec.name, spec.datatype, shape, rng)
        return [self._request(arrays)]

    def _request(self, arrays: dict[str, np.ndarray]) -> bytes:
        datatypes = {spec.name: spec.datatype for spec in self.metadata.inputs}
        request = service_pb2.ModelInferRequest(model_name=self.model)
        for name, data in arrays.items():
            request.inputs.add(name=name, datatype=datatypes[name], shape=list(data.shape))
            request.raw_input_contents.append(data.astype(RAW_DTYPES[datatypes[name]], copy=False).tobytes())
        return request.SerializeToString()

    def output(self, body: bytes) -> np.ndarray:
        return np.frombuffer(service_pb2.ModelInferResponse.FromString(body).raw_output_contents[0], "<f4")

    async def verify(self) -> None:
        """Decode the first response: every output of the metadata, batch-first, with its bytes."""
        where, response = await self._first(service_pb2.ModelInferResponse)
        expected = {o.name: o for o in self.metadata.outputs}
        got = [o.name for o in response.outputs]
        if sorted(got) != sorted(expected) or len(response.raw_output_contents) != len(got):
            raise VerificationError(
                f"{where}: response has outputs {got} ({len(response.raw_output_contents)} raw_output_contents), "
                f"the model's metadata lists {sorted(expected)}"
            )
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
            shape, dims = list(output.shape), list(expected[output.name].shape)
            fits = len(shape) == len(dims) and all(d < 0 or d == s for d, s in zip(dims, shape, strict=True))
            if not fits or (dims and dims[0] == -1 and shape[0] != self.batch):
                wanted = [self.batch, *dims[1:]] if dims else dims
                raise VerificationError(f"{where}: output '{output.name}' has shape {shape}, expected {wanted}")
            size = math.prod(shape) * RAW_DTYPES.get(output.datatype, np.dtype("u1")).itemsize
            if len(raw) != size:
                raise VerificationError(
                    f"{where}: output '{output.name}' carries {len(raw)} bytes, shape {shape} of {output.datatype} "
                    f"needs {size}"
                )


class FacadeTarget(GrpcTarget):
    """The project's `inference.InferenceService/Predict`: an image batch as `raw_data`, named inputs as `inputs`."""

    name = "facade"
    method_path = "/inference.InferenceService/Predict"

    async def _build(self, channel: grpc.aio.Channel) -> list[bytes]:
        if self.images is None:
            rng = np.random.default_rng(0)
            return [self._request(random_tensor("input", "FP32", [self.batch, *IMAGE_SHAPE], rng))]
        return [self._request(request) for request in self.images]

    def _request(self, request: Request) -> bytes:
        if not isinstance(request, dict):
            data = request.astype("<f4", copy=False).tobytes()
            return inference_pb2.PredictRequest(
                model_name=self.model, shape=request.shape, dtype=inference_pb2.FP32, raw_data=data
            ).SerializeToString()
        message = inference_pb2.PredictRequest(model_name=self.model)
        for name, array in request.items():
            datatype = datatype_name(array.dtype)
            raw = array.astype(RAW_DTYPES[datatype], copy=False).tobytes()
            dtype = inference_pb2.ElementType.Value(datatype)
            message.inputs.add(name=name, dtype=dtype, shape=array.shape, raw_data=raw)
        return message.SerializeToString()

    def output(self, body: bytes) -> np.ndarray:
        return np.array(inference_pb2.PredictResponse.FromString(body).predictions, np.float32)

    async def verify(self) -> None:
        """Decode the first response: a PredictResponse whose shape and every named output start with the batch."""
        where, response = await self._first(inference_pb2.PredictResponse)
        shape = list(response.shape)
        if not shape or shape[0] != self.batch:
            raise VerificationError(f"{where}: response shape {shape}, expected the batch {self.batch} first")
        if len(response.predictions) != math.prod(shape):
            raise VerificationError(f"{where}: {len(response.predictions)} predictions for shape {shape}")
        if not response.outputs:
            raise VerificationError(f"{where}: an extended (raw/named) request got no named outputs")
        for output in response.outputs:
            if not output.shape or output.shape[0] != self.batch:
                raise VerificationError(
                    f"{where}: output '{output.name}' has shape {list(output.shape)}, "
                    f"expected the batch {self.batch} first"
                )
