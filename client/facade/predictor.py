"""Predict's endpoint: one PredictRequest through Triton (model lookup, checks, translation, the call)."""

from __future__ import annotations

from collections.abc import Mapping

from tritonclient.grpc import service_pb2

from tritonnx.client.facade.admission import HIGH_PRIORITY
from tritonnx.client.facade.cache import ResultCache, cache_key
from tritonnx.client.facade.current_metadata import with_current_metadata
from tritonnx.client.facade.deadline import Deadline
from tritonnx.client.facade.default_model import DefaultModel
from tritonnx.client.facade.errors import NotFound
from tritonnx.client.facade.gateway import Gateway
from tritonnx.client.facade.metrics import UNRESOLVED_MODEL
from tritonnx.client.facade.tracing import NOT_TRACED, CallTrace
from tritonnx.client.facade.translate import ModelInfo, to_infer_request, to_predict_response
from tritonnx.client.facade.wire import DecodedRequest, EncodedResponse
from tritonnx.client.proto import inference_pb2


class Predictor:
    """One PredictRequest through Triton: model lookup, checks, translation, the call.

    `lanes` maps a model to its latency lane (--priority-lane): the same graph under a second name with instances of
    its own, which priority-1 calls naming no version go to while Triton serves it.
    """

    def __init__(
        self,
        gateway: Gateway,
        default_model: DefaultModel,
        cache: ResultCache | None = None,
        lanes: Mapping[str, str] | None = None,
        default_timeout: float | None = None,
    ) -> None:
        """`default_timeout`: the deadline of a call that sets none (--request-timeout)."""
        self.gateway = gateway
        self.default_model = default_model
        self.cache = cache
        self.lanes = dict(lanes or {})
        self.default_timeout = default_timeout

    # What the servicer asks of an RPC's requests (see service.Endpoint).
    def label(self, decoded: DecodedRequest | None) -> str:
        """The metrics label of a request: its model once Triton confirmed it serves that model."""
        if decoded is None:
            return UNRESOLVED_MODEL
        name = decoded.message.model_name or self.default_model.name
        return name if self.gateway.knows(name, decoded.message.model_version) else UNRESOLVED_MODEL

    @staticmethod
    def priority(decoded: DecodedRequest) -> int:
        return decoded.message.priority

    @staticmethod
    def request_id(decoded: DecodedRequest) -> str:
        return decoded.message.request_id

    @staticmethod
    def nbytes(decoded: DecodedRequest) -> int:
        return decoded.nbytes

    @staticmethod
    def sizes(decoded: DecodedRequest, response: EncodedResponse) -> tuple[int, int]:
        """Payload bytes in and out (the tensors, not the envelope)."""
        message = decoded.message
        received = sum(len(t.raw_data) for t in message.inputs) + (0 if decoded.raw is None else len(decoded.raw))
        received += 0 if decoded.data is None else decoded.data.nbytes
        sent = sum(len(t.raw_data) for t in response.message.outputs)
        return received, sent or (0 if response.predictions is None else response.predictions.nbytes)

    async def run(
        self, decoded: DecodedRequest, time_remaining: float | None, trace: CallTrace = NOT_TRACED
    ) -> tuple[str, EncodedResponse]:
        """The model's name and the response; `time_remaining` is the caller's deadline in seconds."""
        message = decoded.message
        deadline = Deadline(time_remaining, message.timeout_ms, self.default_timeout)
        name = await self._route(
            message.model_name or await self.default_model.for_request(deadline.left()), message, deadline
        )
        info, response = await with_current_metadata(
            self.gateway, name, message.model_version, lambda: self._infer(decoded, name, deadline, trace)
        )
        trace.set("tritonnx.model_version", response.model_version)
        with trace.span("encode"):
            return info.name, to_predict_response(decoded, info, response)

    async def _route(self, name: str, message: inference_pb2.PredictRequest, deadline: Deadline) -> str:
        """The model to send the call to: its lane for a priority-1 call naming no version, while the lane is served."""
        lane = self.lanes.get(name)
        if lane is None or message.priority != HIGH_PRIORITY or message.model_version:
            return name
        try:
            await self.gateway.model_info(lane, "", deadline.left())  # held for the metadata TTL: no call to Triton
        except NotFound:
            return name
        return lane

    async def _infer(
        self, decoded: DecodedRequest, name: str, deadline: Deadline, trace: CallTrace
    ) -> tuple[ModelInfo, service_pb2.ModelInferResponse]:
        """The model's metadata and Triton's response (or the cached one) to the request."""
        message = decoded.message
        with trace.span("decode"):
            info = await self.gateway.model_info(name, message.model_version, deadline.left())
            request = to_infer_request(decoded, info, deadline.triton_timeout_us())
            cache = self.cache if self.cache is not None and self.cache.enabled_for(info.name) else None
            key = cache_key(info, request) if cache is not None else b""
            response = cache.get(info.name, key) if cache is not None else None
        trace.set("tritonnx.model", info.name)
        if cache is not None:
            trace.set("tritonnx.cache_hit", response is not None)
        if response is None:
            with trace.span("ModelInfer", client=True) as span:
                response = await self.gateway.infer(request, deadline.left(), trace.propagation(span))
            if cache is not None:
                cache.put(key, response)
        return info, response
