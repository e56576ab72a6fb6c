"""inference.InferenceService: the servicer translates between gRPC and the facade's pieces.

Backpressure lives in `Admission`, deadlines in `Predictor.predict`, error mapping in
`errors.py`; the servicer only wires them to gRPC (status, trailers, metrics).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager

import grpc
from tritonclient.grpc import service_pb2

from client.facade.cache import ResultCache, cache_key
from client.facade.errors import DeadlineExceeded, FacadeError, Internal, InvalidArgument, Overloaded
from client.facade.metrics import UNRESOLVED_MODEL, FacadeMetrics
from client.facade.tracing import NOT_TRACED, CallTrace, Tracing
from client.facade.translate import ModelInfo, to_infer_request, to_list_models_response, to_predict_response
from client.facade.triton import METADATA_RECHECK_S, TritonGateway
from client.facade.wire import DecodedRequest, EncodedResponse, WireError, decode_predict_request, serialize_response
from client.proto import inference_pb2

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name
log = logging.getLogger("tritonnx.facade")
# What a caller learns of a failure nobody foresaw (a bug): no class names, paths or tracebacks,
# which stay in the log.
UNEXPECTED_FAILURE = "the facade failed to serve the request; see its log"
# A call holds its in-flight slot from its start: one whose body does not arrive within this
# (a stalled or deliberately slow sender) gives the slot back instead of holding it forever.
RECEIVE_TIMEOUT_S = 30.0


class Admission:
    """Backpressure: at most `limit` requests in flight, the rest refused at once, never queued.

    The last quarter of the slots is kept for high-priority requests (PredictRequest.priority 1,
    Triton's highest level): under an overload of others, they still get in. All handlers run on
    one event loop, so a plain counter is race-free.
    """

    HIGH_PRIORITY = 1

    def __init__(self, limit: int, retry_after_ms: int, metrics: FacadeMetrics) -> None:
        self.limit = limit
        self.high_priority_reserve = limit // 4
        self.in_flight = 0
        self._retry_hint = (("grpc-retry-pushback-ms", str(retry_after_ms)),)
        self._metrics = metrics

    def acquire(self) -> None:
        """Take a slot, or raise Overloaded; every acquire that returns is paired with one release."""
        if self.in_flight >= self.limit:
            raise Overloaded(
                f"the server is handling its limit of {self.limit} requests: retry after the "
                f"grpc-retry-pushback-ms hint ({self._retry_hint[0][1]} ms)",
                self._retry_hint,
            )
        self.in_flight += 1
        self._metrics.in_flight.set(self.in_flight)

    def release(self) -> None:
        self.in_flight -= 1
        self._metrics.in_flight.set(self.in_flight)

    @contextmanager
    def slot(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def check_priority(self, priority: int) -> None:
        """Once the request is read: refuse it if it is not high priority and only reserved slots are left.

        (The slot was taken at the call's start, before its priority could be known.)
        """
        if priority != self.HIGH_PRIORITY and self.in_flight > self.limit - self.high_priority_reserve:
            raise Overloaded(
                f"the server is handling {self.in_flight} requests; its last {self.high_priority_reserve} "
                f"slots are for priority {self.HIGH_PRIORITY}: retry after the grpc-retry-pushback-ms hint "
                f"({self._retry_hint[0][1]} ms)",
                self._retry_hint,
            )


class Predictor:
    """One PredictRequest through Triton: model lookup, checks, translation, the call."""

    def __init__(self, gateway: TritonGateway, default_model: str, cache: ResultCache | None = None) -> None:
        self.gateway = gateway
        self.default_model = default_model
        self.cache = cache

    def model_label(self, decoded: DecodedRequest | WireError | None) -> str:
        """The metrics label of a request: its model once Triton confirmed it serves that model."""
        if decoded is None or isinstance(decoded, WireError):
            return UNRESOLVED_MODEL
        name = decoded.message.model_name or self.default_model
        return name if self.gateway.knows(name, decoded.message.model_version) else UNRESOLVED_MODEL

    async def predict(
        self, decoded: DecodedRequest, time_remaining: float | None, trace: CallTrace = NOT_TRACED
    ) -> tuple[str, EncodedResponse]:
        """The model's name and the response; `time_remaining` is the caller's deadline in seconds."""
        message = decoded.message
        deadline = None if time_remaining is None else time.monotonic() + time_remaining
        if message.timeout_ms:
            own = time.monotonic() + message.timeout_ms / 1000
            deadline = own if deadline is None else min(deadline, own)

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        name = message.model_name or self.default_model
        try:
            info, response = await self._infer(decoded, name, left, trace)
        except InvalidArgument:
            # Refused (by the checks here or by Triton) against metadata held for a while: a version with
            # another signature may have gone live. Once more with Triton's metadata (the gateway drops
            # it on Triton's refusal; here on the facade's own).
            renewed = self.gateway.forget(name, older_than=METADATA_RECHECK_S)
            if not renewed and self.gateway.knows(name, message.model_version):
                raise
            info, response = await self._infer(decoded, name, left, trace)
        if response.model_version and response.model_version not in info.versions:
            self.gateway.forget(name)  # a version went live that the metadata held does not list
        trace.set("tritonnx.model_version", response.model_version)
        with trace.span("encode"):
            return info.name, to_predict_response(decoded, info, response)

    async def _infer(
        self, decoded: DecodedRequest, name: str, left: Callable[[], float | None], trace: CallTrace
    ) -> tuple[ModelInfo, service_pb2.ModelInferResponse]:
        """The model's metadata and Triton's response (or the cached one) to the request."""
        message = decoded.message
        with trace.span("decode"):
            info = await self.gateway.model_info(name, message.model_version, left())
            remaining = left()
            # Triton's own timeout covers the queue: a request whose caller gave up is dropped there.
            request = to_infer_request(decoded, info, None if remaining is None else max(1, int(remaining * 1e6)))
            cache = self.cache if self.cache is not None and self.cache.enabled_for(info.name) else None
            key = cache_key(info, request) if cache is not None else b""
            response = cache.get(info.name, key) if cache is not None else None
        trace.set("tritonnx.model", info.name)
        if cache is not None:
            trace.set("tritonnx.cache_hit", response is not None)
        if response is None:
            with trace.span("ModelInfer", client=True) as span:
                response = await self.gateway.infer(request, left(), trace.propagation(span))
            if cache is not None:
                cache.put(key, response)
        return info, response


def _payload_bytes(decoded: DecodedRequest) -> int:
    message = decoded.message
    data = 0 if decoded.data is None else decoded.data.nbytes
    raw = 0 if decoded.raw is None else len(decoded.raw)
    return data + raw + sum(len(t.raw_data) for t in message.inputs)


async def _ready(decoded: DecodedRequest | WireError) -> DecodedRequest | WireError:
    return decoded


def _deserialize(buffer: bytes) -> DecodedRequest | WireError:
    # A deserializer that raises makes gRPC answer INTERNAL; malformed input is the caller's error.
    try:
        return decode_predict_request(buffer)
    except WireError as error:
        return error


class InferenceServicer:
    def __init__(
        self,
        predictor: Predictor,
        admission: Admission,
        metrics: FacadeMetrics,
        receive_timeout: float = RECEIVE_TIMEOUT_S,
        tracing: Tracing | None = None,
    ) -> None:
        self.predictor = predictor
        self.admission = admission
        self.metrics = metrics
        self.receive_timeout = receive_timeout
        self.tracing = tracing or Tracing("", 0.0)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                # Unary for callers; request-streaming here, so the handler runs when the call
                # starts and can refuse it before its body is read (see `predict`).
                "Predict": grpc.stream_unary_rpc_method_handler(
                    self.predict, request_deserializer=_deserialize, response_serializer=serialize_response
                ),
                "PredictStream": grpc.stream_stream_rpc_method_handler(
                    self.predict_stream, request_deserializer=_deserialize, response_serializer=serialize_response
                ),
                "ListModels": grpc.unary_unary_rpc_method_handler(
                    self.list_models,
                    request_deserializer=inference_pb2.ListModelsRequest.FromString,
                    response_serializer=inference_pb2.ListModelsResponse.SerializeToString,
                ),
            },
        )

    async def _serve(
        self,
        receive: Callable[[], Awaitable[DecodedRequest | WireError]],
        time_remaining: Callable[[], float | None],
        trace: CallTrace,
    ) -> EncodedResponse:
        """One request, measured from its arrival; `receive` gives the request once a slot is taken.

        The error boundary of Predict and PredictStream. Every failure comes out as a FacadeError, except cancellation,
        which propagates. The call's trace ends here, with its status.
        """
        started = time.perf_counter()
        decoded: DecodedRequest | WireError | None = None
        try:
            with trace.span("admission"):
                self.admission.acquire()
            try:
                with trace.span("receive"):
                    decoded = await receive()
                if isinstance(decoded, WireError):
                    raise InvalidArgument(f"malformed PredictRequest: {decoded}")
                if decoded.message.request_id:
                    trace.set("tritonnx.request_id", decoded.message.request_id)
                self.admission.check_priority(decoded.message.priority)
                model, response = await self.predictor.predict(decoded, time_remaining(), trace)
            finally:
                self.admission.release()
            self.metrics.latency.labels(model).observe(time.perf_counter() - started)
            self.metrics.request_bytes.labels(model).observe(_payload_bytes(decoded))
            outputs = response.message.outputs
            self.metrics.response_bytes.labels(model).observe(
                sum(len(t.raw_data) for t in outputs)
                or (0 if response.predictions is None else response.predictions.nbytes)
            )
            # Counted last: a request is OK or failed, never both.
            self.metrics.requests.labels(model, grpc.StatusCode.OK.name).inc()
            trace.end(grpc.StatusCode.OK)
            return response
        except FacadeError as error:
            self._count_failure(decoded, error)
            trace.end(error.code, error.message)
            raise
        except asyncio.CancelledError:
            self.metrics.requests.labels(self.predictor.model_label(decoded), grpc.StatusCode.CANCELLED.name).inc()
            trace.end(grpc.StatusCode.CANCELLED)
            raise
        except Exception as error:
            # Left to gRPC, a bug would reach the caller as UNKNOWN with its class name, uncounted;
            # in a PredictStream its request would go unanswered, or stall the stream to its deadline.
            log.exception("a request failed unexpectedly; answered INTERNAL")
            failure = Internal(UNEXPECTED_FAILURE)
            self._count_failure(decoded, failure)
            trace.end(failure.code, failure.message)
            raise failure from error

    def _count_failure(self, decoded: DecodedRequest | WireError | None, error: FacadeError) -> None:
        self.metrics.requests.labels(self.predictor.model_label(decoded), error.code.name).inc()
        self.metrics.rejections.labels(error.reason).inc()

    async def predict(self, _requests: object, context: grpc.aio.ServicerContext) -> EncodedResponse:
        """A unary Predict, run as soon as the call starts: the in-flight slot is taken before the body is read.

        Counting calls, not bodies received, a burst of large calls over the limit is refused at once
        instead of after each body has arrived (measured: p99 about 0.6 s for 400 calls of 600 KB).
        """

        async def receive() -> DecodedRequest | WireError:
            try:
                message = await asyncio.wait_for(context.read(), self.receive_timeout)
            except TimeoutError:
                raise DeadlineExceeded(
                    f"the request's body did not arrive within {self.receive_timeout:.0f} s of the call's start"
                ) from None
            if isinstance(message, DecodedRequest | WireError):
                return message
            return WireError("the call carried no PredictRequest")  # gRPC's EOF: the stream ended first

        trace = self.tracing.call("Predict", context.invocation_metadata())
        try:
            return await self._serve(receive, context.time_remaining, trace)
        except FacadeError as error:
            await context.abort(error.code, error.message, trailing_metadata=error.trailing_metadata)

    async def list_models(
        self, request: inference_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ListModelsResponse:
        gateway = self.predictor.gateway
        try:
            entries = await gateway.repository_index(request.ready_only, context.time_remaining())
            infos = {}
            for entry in entries:
                if entry.state == "READY":
                    infos[(entry.name, entry.version)] = await gateway.model_info(
                        entry.name, entry.version, context.time_remaining()
                    )
            return to_list_models_response(entries, infos)
        except FacadeError as error:
            await context.abort(error.code, error.message, trailing_metadata=error.trailing_metadata)
        except Exception:
            log.exception("ListModels failed unexpectedly; answered INTERNAL")
            await context.abort(grpc.StatusCode.INTERNAL, UNEXPECTED_FAILURE)
        raise AssertionError("abort raises")  # for the type checker: every path above returns or raises

    async def predict_stream(
        self, requests: AsyncIterator[DecodedRequest | WireError], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[EncodedResponse]:
        """Serve every request of the stream concurrently; answer each as soon as it is done."""
        done: asyncio.Queue[EncodedResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task] = set()
        metadata = context.invocation_metadata()

        async def serve_one(decoded: DecodedRequest | WireError) -> None:
            request_id = "" if isinstance(decoded, WireError) else decoded.message.request_id
            trace = self.tracing.call("PredictStream", metadata)  # one trace per request of the stream
            try:
                done.put_nowait(await self._serve(lambda: _ready(decoded), context.time_remaining, trace))
            except FacadeError as error:
                failed = inference_pb2.PredictResponse(
                    request_id=request_id, error=inference_pb2.Error(code=error.code.value[0], message=error.message)
                )
                done.put_nowait(EncodedResponse(failed, None))

        async def read_all() -> None:
            async for decoded in requests:
                task = asyncio.create_task(serve_one(decoded))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*tasks)
            done.put_nowait(None)

        reader = asyncio.create_task(read_all())
        try:
            while (response := await done.get()) is not None:
                yield response
            await reader
        finally:
            for task in (reader, *tasks):
                task.cancel()
