"""The facade's one long-lived async gRPC channel to Triton, and its model-metadata cache."""

from __future__ import annotations

import asyncio
import time

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from client.facade.errors import NotFound, from_triton
from client.facade.translate import InferCall, ModelInfo


class TritonGateway:
    """Calls Triton's KServe v2 gRPC API; every failure comes out as a `FacadeError`."""

    def __init__(self, url: str, max_message_bytes: int, model_info_ttl: float) -> None:
        self.url = url
        self._channel = grpc.aio.insecure_channel(
            url,
            options=[
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.max_receive_message_length", max_message_bytes),
                # Find Triton again quickly after it restarts, instead of gRPC's default backoff of up to 2 min.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        # ModelInfer takes the request already serialised (InferCall.serialize).
        self._model_infer = self._channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=None,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        self._ttl = model_info_ttl
        self._models: dict[tuple[str, str], tuple[float, ModelInfo]] = {}

    async def model_info(self, name: str, version: str, timeout: float | None = None) -> ModelInfo:
        """Inputs, outputs and max_batch_size of a model, cached for the TTL."""
        key = (name, version)
        cached = self._models.get(key)
        if cached and cached[0] > time.monotonic():
            return cached[1]
        try:
            metadata, config = await asyncio.gather(
                self._stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=name, version=version), timeout=timeout),
                self._stub.ModelConfig(service_pb2.ModelConfigRequest(name=name, version=version), timeout=timeout),
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                raise NotFound(await self._not_found_message(name, version)) from None
            raise from_triton(error, name, version) from None
        info = ModelInfo.from_triton(metadata, config, version)
        self._models[key] = (time.monotonic() + self._ttl, info)
        return info

    def knows(self, name: str, version: str) -> bool:
        """Whether the model's metadata is cached, i.e. Triton recently confirmed it serves it."""
        return (name, version) in self._models

    async def _not_found_message(self, name: str, version: str) -> str:
        target = f"model '{name}'" + (f" version '{version}'" if version else "")
        try:
            index = await self._stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True), timeout=2.0)
            served = sorted({m.name for m in index.models})
            return f"{target} is not served; ready models: {', '.join(served) or 'none'}"
        except grpc.aio.AioRpcError:
            return f"{target} is not served"

    async def infer(self, call: InferCall, timeout: float | None) -> service_pb2.ModelInferResponse:
        try:
            return await self._model_infer(call.serialize(), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            model, version = call.header.model_name, call.header.model_version
            if error.code() == grpc.StatusCode.NOT_FOUND:
                self._models.pop((model, version), None)
            raise from_triton(error, model, version) from None

    async def server_ready(self, timeout: float) -> bool:
        try:
            return (await self._stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=timeout)).ready
        except grpc.aio.AioRpcError:
            return False

    async def close(self) -> None:
        await self._channel.close()

