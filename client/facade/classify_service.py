"""The Classify RPC of inference.InferenceService: an image file in, a classifier's top classes out.

`Classifier` does one request (model lookup, checks, the Triton call); `ClassifyServicer` wires it
to gRPC with the same admission (in-flight slots and the priority reserve), deadline rules,
metrics and error boundary as Predict. It is registered as a handler of its own for the same
service, so Predict's servicer is untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from google.protobuf.message import DecodeError

from client.facade.classify import (
    PIPELINE_SUFFIX,
    check_image,
    classifier_name,
    pipeline_name,
    to_classify_response,
    to_infer_request,
    top_k,
)
from client.facade.errors import FacadeError, Internal, InvalidArgument, NotFound
from client.facade.metrics import UNRESOLVED_MODEL, FacadeMetrics
from client.facade.service import SERVICE_NAME, UNEXPECTED_FAILURE, Admission
from client.facade.triton import TritonGateway
from client.proto import inference_pb2

log = logging.getLogger("tritonnx.facade")


class Classifier:
    """One ClassifyRequest through the classifier's Triton ensemble."""

    def __init__(self, gateway: TritonGateway, default_model: str, max_image_bytes: int) -> None:
        self.gateway = gateway
        self.default_model = default_model
        self.max_image_bytes = max_image_bytes

    def pipeline(self, request: inference_pb2.ClassifyRequest) -> str:
        return pipeline_name(request.model_name or self.default_model)

    def model_label(self, request: inference_pb2.ClassifyRequest | None) -> str:
        """The metrics label: the pipeline, once Triton confirmed it serves it."""
        if request is None:
            return UNRESOLVED_MODEL
        name = self.pipeline(request)
        return name if self.gateway.knows(name, "") else UNRESOLVED_MODEL

    async def classify(
        self, request: inference_pb2.ClassifyRequest, time_remaining: float | None
    ) -> inference_pb2.ClassifyResponse:
        """The response; `time_remaining` is the caller's deadline in seconds (request.timeout_ms may shorten it)."""
        deadline = None if time_remaining is None else time.monotonic() + time_remaining
        if request.timeout_ms:
            own = time.monotonic() + request.timeout_ms / 1000
            deadline = own if deadline is None else min(deadline, own)

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        check_image(request.image, self.max_image_bytes)
        try:
            info = await self.gateway.model_info(self.pipeline(request), "", left())
        except NotFound:
            raise NotFound(await self._not_found_message(request)) from None
        k = top_k(request, info)
        remaining = left()
        # Triton's own timeout covers the queue: a request whose caller gave up is dropped there.
        call = to_infer_request(request, info, k, None if remaining is None else max(1, int(remaining * 1e6)))
        return to_classify_response(request, await self.gateway.infer(call, left()))

    async def _not_found_message(self, request: inference_pb2.ClassifyRequest) -> str:
        asked = request.model_name or self.default_model
        try:
            entries = await self.gateway.repository_index(ready_only=True, timeout=2.0)
        except FacadeError:
            return f"model '{asked}' has no image pipeline ('{self.pipeline(request)}') on this server"
        served = sorted({classifier_name(e.name) for e in entries if e.name.endswith(PIPELINE_SUFFIX)})
        return (
            f"model '{asked}' has no image pipeline ('{self.pipeline(request)}') on this server; "
            f"models that classify images: {', '.join(served) or 'none'}"
        )


def _deserialize(buffer: bytes) -> inference_pb2.ClassifyRequest | InvalidArgument:
    # A deserializer that raises makes gRPC answer INTERNAL; malformed input is the caller's error.
    try:
        return inference_pb2.ClassifyRequest.FromString(buffer)
    except DecodeError as error:
        return InvalidArgument(f"malformed ClassifyRequest: {error}")


class ClassifyServicer:
    def __init__(self, classifier: Classifier, admission: Admission, metrics: FacadeMetrics) -> None:
        self.classifier = classifier
        self.admission = admission
        self.metrics = metrics

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Classify": grpc.unary_unary_rpc_method_handler(
                    self.classify,
                    request_deserializer=_deserialize,
                    response_serializer=inference_pb2.ClassifyResponse.SerializeToString,
                )
            },
        )

    async def classify(
        self, request: inference_pb2.ClassifyRequest | InvalidArgument, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ClassifyResponse:
        """The error boundary of Classify: every failure is answered with its status and counted."""
        started = time.perf_counter()
        parsed = None if isinstance(request, InvalidArgument) else request
        try:
            with self.admission.slot():
                if isinstance(request, InvalidArgument):
                    raise request
                self.admission.check_priority(request.priority)
                response = await self.classifier.classify(request, context.time_remaining())
            model = response.model_name
            self.metrics.latency.labels(model).observe(time.perf_counter() - started)
            self.metrics.request_bytes.labels(model).observe(len(request.image))
            self.metrics.response_bytes.labels(model).observe(response.ByteSize())
            self.metrics.requests.labels(model, grpc.StatusCode.OK.name).inc()
            return response
        except FacadeError as error:
            self._count_failure(parsed, error)
            await context.abort(error.code, error.message, trailing_metadata=error.trailing_metadata)
        except asyncio.CancelledError:
            self.metrics.requests.labels(self.classifier.model_label(parsed), grpc.StatusCode.CANCELLED.name).inc()
            raise
        except Exception:
            log.exception("a Classify request failed unexpectedly; answered INTERNAL")
            self._count_failure(parsed, Internal(UNEXPECTED_FAILURE))
            await context.abort(grpc.StatusCode.INTERNAL, UNEXPECTED_FAILURE)
        raise AssertionError("abort raises")  # for the type checker: every path above returns or raises

    def _count_failure(self, request: inference_pb2.ClassifyRequest | None, error: FacadeError) -> None:
        self.metrics.requests.labels(self.classifier.model_label(request), error.code.name).inc()
        self.metrics.rejections.labels(error.reason).inc()
