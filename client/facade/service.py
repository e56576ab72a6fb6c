"""inference.InferenceService: the servicer wires the facade's pieces to gRPC.

Each unary RPC has an endpoint (Predictor, Classifier) that turns its request into a response;
the servicer gives every one the same treatment: backpressure (`Admission`: a receive place while
the body is awaited, then a slot and the body's bytes), the error boundary (errors as types, mapped
to statuses in errors.py), metrics and tracing. Request bytes are decoded within their limits
(wire.py) by gRPC's deserializers, before any handler sees them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc

from tritonnx.client.facade.admission import Admission
from tritonnx.client.facade.classifier import Classifier
from tritonnx.client.facade.classify import image_too_large, too_many_pixels
from tritonnx.client.facade.deadline import Deadline
from tritonnx.client.facade.errors import FacadeError, Internal, InvalidArgument
from tritonnx.client.facade.metrics import FacadeMetrics
from tritonnx.client.facade.predictor import Predictor
from tritonnx.client.facade.tracing import CallTrace, Tracing
from tritonnx.client.facade.translate import to_list_models_response
from tritonnx.client.facade.wire import (
    CLASSIFY_LIMITS,
    LIST_MODELS_LIMITS,
    PARSE_ERRORS,
    DecodedRequest,
    EncodedResponse,
    Limits,
    RequestRefused,
    WireError,
    check_message,
    decode_predict_request,
    field_length,
    serialize_response,
)
from tritonnx.client.proto import inference_pb2

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name
log = logging.getLogger("tritonnx.facade")
# What a caller learns of a failure nobody foresaw (a bug): no class names, paths or tracebacks,
# which stay in the log.
UNEXPECTED_FAILURE = "the facade failed to serve the request; see its log"
# A call waits this long for its body from its start (a stalled or deliberately slow sender gives its receive place
# back instead of holding it forever); the facade's --body-timeout.
BODY_TIMEOUT_S = 10.0
# What a ClassifyRequest carries besides its image: names, ids and numbers of a few hundred bytes at most.
CLASSIFY_ENVELOPE_BYTES = 4096
CLASSIFY_IMAGE_FIELD = inference_pb2.ClassifyRequest.DESCRIPTOR.fields_by_name["image"].number


class Endpoint(Protocol):
    """What one RPC does with its requests; the servicer does the rest."""

    def label(self, request: Any) -> str:
        """The metrics label of a request (None: it could not be read)."""

    def priority(self, request: Any) -> int: ...

    def request_id(self, request: Any) -> str: ...

    def sizes(self, request: Any, response: Any) -> tuple[int, int]:
        """Payload bytes received and sent, for the size histograms."""

    def nbytes(self, request: Any) -> int:
        """The bytes the request holds while it is served (the in-flight byte budget counts them)."""

    async def run(self, request: Any, time_remaining: float | None, trace: CallTrace) -> tuple[str, Any]:
        """The model's name (a metrics label) and the response; failures as FacadeError."""


async def _ready(request: Any) -> Any:
    return request


def _predict_request(buffer: bytes) -> DecodedRequest | InvalidArgument:
    # A deserializer that raises makes gRPC answer INTERNAL; malformed input is the caller's error.
    try:
        return decode_predict_request(buffer)
    except RequestRefused as error:
        return InvalidArgument(str(error))
    except WireError as error:
        return InvalidArgument(f"malformed PredictRequest: {error}")


def _parsed(buffer: bytes, limits: Limits) -> Any:
    """The message of `limits` from `buffer`, walked within its limits first; InvalidArgument when refused."""
    name = limits.name_of_message
    try:
        check_message(buffer, limits)
        return limits.message.FromString(buffer)  # type: ignore[attr-defined]
    except RequestRefused as error:
        return InvalidArgument(str(error))
    except (WireError, *PARSE_ERRORS) as error:
        return InvalidArgument(f"malformed {name}: {error}")


def _list_models_request(buffer: bytes) -> inference_pb2.ListModelsRequest | InvalidArgument:
    return _parsed(buffer, LIST_MODELS_LIMITS)


class InferenceServicer:
    def __init__(
        self,
        predictor: Predictor,
        classifier: Classifier,
        admission: Admission,
        metrics: FacadeMetrics,
        body_timeout: float = BODY_TIMEOUT_S,
        tracing: Tracing | None = None,
        stream_max_in_flight: int = 16,
        request_timeout: float | None = None,
    ) -> None:
        """`request_timeout`: the deadline of a ListModels call that sets none (the endpoints have their own)."""
        self.predictor = predictor
        self.classifier = classifier
        self.admission = admission
        self.metrics = metrics
        self.body_timeout = body_timeout
        self.tracing = tracing or Tracing("", 0.0)
        self.stream_max_in_flight = stream_max_in_flight
        self.request_timeout = request_timeout
        self.predict = self._from_call_start("Predict", "PredictRequest", self.predictor)
        self.classify = self._from_call_start("Classify", "ClassifyRequest", self.classifier)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                # Unary for callers; request-streaming here, so the handler runs when the call
                # starts and can refuse it before its body is read (see `_from_call_start`).
                "Predict": grpc.stream_unary_rpc_method_handler(
                    self.predict, request_deserializer=_predict_request, response_serializer=serialize_response
                ),
                "Classify": grpc.stream_unary_rpc_method_handler(
                    self.classify,
                    request_deserializer=self._classify_request,
                    response_serializer=inference_pb2.ClassifyResponse.SerializeToString,
                ),
                "PredictStream": grpc.stream_stream_rpc_method_handler(
                    self.predict_stream, request_deserializer=_predict_request, response_serializer=serialize_response
                ),
                "ListModels": grpc.unary_unary_rpc_method_handler(
                    self.list_models,
                    request_deserializer=_list_models_request,
                    response_serializer=inference_pb2.ListModelsResponse.SerializeToString,
                ),
            },
        )

    async def _serve(
        self,
        endpoint: Endpoint,
        receive: Callable[[], Awaitable[Any]],
        time_remaining: Callable[[], float | None],
        trace: CallTrace,
    ) -> Any:
        """One request, measured from its call's start; `receive` gives the request (or the failure to read it).

        The error boundary of every RPC that infers. Every failure comes out as a FacadeError, except cancellation,
        which propagates. The call's trace ends here, with its status.
        """
        started = time.perf_counter()
        request = None
        try:
            with trace.span("receive"):
                received = await receive()
            if isinstance(received, FacadeError):
                raise received
            request = received
            if request_id := endpoint.request_id(request):
                trace.set("tritonnx.request_id", request_id)
            with trace.span("admission"):
                ticket = self.admission.admit(endpoint.nbytes(request), endpoint.priority(request))
            try:
                model, response = await endpoint.run(request, time_remaining(), trace)
            finally:
                self.admission.release(ticket)
            self.metrics.answered(model, time.perf_counter() - started, *endpoint.sizes(request, response))
            trace.end(grpc.StatusCode.OK)
            return response
        except FacadeError as error:
            self._count_failure(endpoint.label(request), error)
            if error.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                # From the handler's start: the wait in gRPC's core and the event loop before it is not the facade's.
                self.metrics.rejection_latency.labels(error.reason).observe(time.perf_counter() - started)
            trace.end(error.code, error.message)
            # Without the frames that raised it: they hold the request (megabytes for a large one) in a reference
            # cycle with the error, which only the cycle collector frees, long after (found by fuzzing).
            request = received = None
            raise error.with_traceback(None)  # noqa: B904  # the same error, re-raised without its frames
        except asyncio.CancelledError:
            self.metrics.requests.labels(endpoint.label(request), grpc.StatusCode.CANCELLED.name).inc()
            trace.end(grpc.StatusCode.CANCELLED)
            raise
        except Exception as error:
            # Left to gRPC, a bug would reach the caller as UNKNOWN with its class name, uncounted;
            # in a PredictStream its request would go unanswered, or stall the stream to its deadline.
            log.exception("a request failed unexpectedly; answered INTERNAL")
            failure = Internal(UNEXPECTED_FAILURE)
            self._count_failure(endpoint.label(request), failure)
            trace.end(failure.code, failure.message)
            raise failure from error

    def _count_failure(self, label: str, error: FacadeError) -> None:
        self.metrics.requests.labels(label, error.code.name).inc()
        self.metrics.rejections.labels(error.reason).inc()

    def _classify_request(self, buffer: bytes) -> inference_pb2.ClassifyRequest | InvalidArgument:
        if len(buffer) > self.classifier.max_image_bytes + CLASSIFY_ENVELOPE_BYTES:
            # Refused unparsed: the image's size is read off the wire, its bytes are not copied.
            try:
                size = field_length(buffer, CLASSIFY_LIMITS, CLASSIFY_IMAGE_FIELD)
            except RequestRefused as error:
                return InvalidArgument(str(error))
            except WireError as error:
                return InvalidArgument(f"malformed ClassifyRequest: {error}")
            return image_too_large(size if size is not None else len(buffer), self.classifier.max_image_bytes)
        request = _parsed(buffer, CLASSIFY_LIMITS)
        if not isinstance(request, InvalidArgument):  # refused before admission charges its decoded size
            return too_many_pixels(request.image, self.classifier.max_image_pixels) or request
        return request

    def _from_call_start(
        self, method: str, message: str, endpoint: Endpoint
    ) -> Callable[[object, grpc.aio.ServicerContext], Awaitable[Any]]:
        """A unary RPC's handler, run as soon as the call starts, before its body is read.

        The call waits for its body in a receive place, so a burst beyond the receive places is refused at once
        rather than after each body arrived, and a caller that sends no body gives its place back at the body
        deadline. It takes an in-flight slot once its body is there.
        """

        async def handle(_requests: object, context: grpc.aio.ServicerContext) -> Any:
            async def receive() -> Any:
                request = await self.admission.receive(context.read, context.peer(), self.body_timeout)
                if request is grpc.aio.EOF:  # type: ignore[attr-defined]  # (not in grpc's stubs) no message came
                    return InvalidArgument(f"malformed {message}: the call carried none")
                return request

            trace = self.tracing.call(method, context.invocation_metadata())
            try:
                return await self._serve(endpoint, receive, context.time_remaining, trace)
            except FacadeError as error:
                await context.abort(error.code, error.message, trailing_metadata=error.trailing_metadata)

        return handle

    async def list_models(
        self, request: inference_pb2.ListModelsRequest | InvalidArgument, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ListModelsResponse:
        gateway = self.predictor.gateway
        try:
            if isinstance(request, InvalidArgument):
                raise request
            deadline = Deadline(context.time_remaining(), default=self.request_timeout)
            entries = await gateway.repository_index(request.ready_only, deadline.left())
            infos = {}
            for entry in entries:
                if entry.state == "READY":
                    infos[(entry.name, entry.version)] = await gateway.model_info(
                        entry.name, entry.version, deadline.left()
                    )
            return to_list_models_response(entries, infos)
        except FacadeError as error:
            await context.abort(error.code, error.message, trailing_metadata=error.trailing_metadata)
        except Exception:
            log.exception("ListModels failed unexpectedly; answered INTERNAL")
            await context.abort(grpc.StatusCode.INTERNAL, UNEXPECTED_FAILURE)
        raise AssertionError("abort raises")  # for the type checker: every path above returns or raises

    async def predict_stream(
        self, requests: AsyncIterator[DecodedRequest | InvalidArgument], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[EncodedResponse]:
        """Serve the stream's requests concurrently, at most `stream_max_in_flight` at once; answer each when done.

        A request's place is freed once its response was sent: a caller that stops reading stops the reading of its
        requests too, and gRPC's flow control then holds its writes, instead of the facade buffering them.
        """
        window = asyncio.Semaphore(self.stream_max_in_flight)
        done: asyncio.Queue[EncodedResponse | None] = asyncio.Queue()  # at most the window's responses
        tasks: set[asyncio.Task] = set()
        metadata = context.invocation_metadata()

        async def serve_one(decoded: DecodedRequest | InvalidArgument) -> None:
            request_id = "" if isinstance(decoded, FacadeError) else decoded.message.request_id
            trace = self.tracing.call("PredictStream", metadata)  # one trace per request of the stream
            try:
                done.put_nowait(
                    await self._serve(self.predictor, lambda: _ready(decoded), context.time_remaining, trace)
                )
            except FacadeError as error:
                failed = inference_pb2.PredictResponse(
                    request_id=request_id, error=inference_pb2.Error(code=error.code.value[0], message=error.message)
                )
                done.put_nowait(EncodedResponse(failed, None))

        async def read_all() -> None:
            incoming = aiter(requests)
            while True:
                await window.acquire()  # a place for the next request, before it is read
                try:
                    decoded = await anext(incoming)
                except StopAsyncIteration:
                    break
                task = asyncio.create_task(serve_one(decoded))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*tasks)
            done.put_nowait(None)

        reader = asyncio.create_task(read_all())
        try:
            while (response := await done.get()) is not None:
                yield response  # resumed once gRPC sent it
                window.release()
            await reader
        finally:
            for task in (reader, *tasks):
                task.cancel()
