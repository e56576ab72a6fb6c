"""Classify's endpoint: an image file in, a classifier's top classes out, through its Triton ensemble.

The checks and translation are in classify.py; this does the lookups and the call.
"""

from __future__ import annotations

from tritonnx.client.facade.classify import (
    DECODED_PIXEL_BYTES,
    PIPELINE_SUFFIX,
    check_image,
    classifier_name,
    decoded_pixels,
    pipeline_name,
    to_classify_response,
    to_infer_request,
    top_k,
)
from tritonnx.client.facade.deadline import Deadline
from tritonnx.client.facade.default_model import DefaultModel
from tritonnx.client.facade.errors import FacadeError, NotFound
from tritonnx.client.facade.gateway import Gateway
from tritonnx.client.facade.metrics import UNRESOLVED_MODEL
from tritonnx.client.facade.tracing import NOT_TRACED, CallTrace
from tritonnx.client.proto import inference_pb2


class Classifier:
    """One ClassifyRequest through the classifier's Triton ensemble."""

    def __init__(
        self,
        gateway: Gateway,
        default_model: DefaultModel,
        max_image_bytes: int,
        default_timeout: float | None = None,
        max_image_pixels: int = 16_000_000,
    ) -> None:
        """`default_timeout`: the deadline of a call that sets none (--request-timeout)."""
        self.gateway = gateway
        self.default_model = default_model
        self.max_image_bytes = max_image_bytes
        self.max_image_pixels = max_image_pixels
        self.default_timeout = default_timeout

    # What the servicer asks of an RPC's requests (see service.Endpoint).
    def label(self, request: inference_pb2.ClassifyRequest | None) -> str:
        """The metrics label: the pipeline, once Triton confirmed it serves it."""
        if request is None:
            return UNRESOLVED_MODEL
        name = pipeline_name(request.model_name or self.default_model.name)
        return name if self.gateway.knows(name, "") else UNRESOLVED_MODEL

    @staticmethod
    def priority(request: inference_pb2.ClassifyRequest) -> int:
        return request.priority

    @staticmethod
    def request_id(request: inference_pb2.ClassifyRequest) -> str:
        return request.request_id

    @staticmethod
    def nbytes(request: inference_pb2.ClassifyRequest) -> int:
        """The file, and the image decoded: what the pipeline holds of it (in-flight bytes count both)."""
        return len(request.image) + DECODED_PIXEL_BYTES * decoded_pixels(request.image)

    @staticmethod
    def sizes(request: inference_pb2.ClassifyRequest, response: inference_pb2.ClassifyResponse) -> tuple[int, int]:
        return len(request.image), response.ByteSize()

    async def run(
        self, request: inference_pb2.ClassifyRequest, time_remaining: float | None, trace: CallTrace = NOT_TRACED
    ) -> tuple[str, inference_pb2.ClassifyResponse]:
        """The pipeline's name and the response; `time_remaining` is the caller's deadline in seconds.

        request.timeout_ms may shorten it.
        """
        deadline = Deadline(time_remaining, request.timeout_ms, self.default_timeout)
        with trace.span("decode"):
            check_image(request.image, self.max_image_bytes)
            asked = request.model_name or await self.default_model.for_request(deadline.left())
            try:
                info = await self.gateway.model_info(pipeline_name(asked), "", deadline.left())
            except NotFound:
                raise NotFound(await self._not_found_message(asked)) from None
            call = to_infer_request(request, info, top_k(request, info), deadline.triton_timeout_us())
        trace.set("tritonnx.model", info.name)
        with trace.span("ModelInfer", client=True) as span:
            response = await self.gateway.infer(call, deadline.left(), trace.propagation(span))
        trace.set("tritonnx.model_version", response.model_version)
        with trace.span("encode"):
            return info.name, to_classify_response(request, response)

    async def _not_found_message(self, asked: str) -> str:
        try:
            entries = await self.gateway.repository_index(ready_only=True, timeout=2.0)
        except FacadeError:
            return f"model '{asked}' has no image pipeline ('{pipeline_name(asked)}') on this server"
        served = sorted({classifier_name(e.name) for e in entries if e.name.endswith(PIPELINE_SUFFIX)})
        return (
            f"model '{asked}' has no image pipeline ('{pipeline_name(asked)}') on this server; "
            f"models that classify images: {', '.join(served) or 'none'}"
        )
