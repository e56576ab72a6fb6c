"""Token authentication of the inference service, as a gRPC server interceptor.

Only inference.InferenceService needs the token: health checks come from load balancers and
orchestrators that carry none, and reflection is switched off separately.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from tritonnx.client.facade.service import SERVICE_NAME

_PROTECTED_PREFIX = f"/{SERVICE_NAME}/"


def _refuse(message: str) -> tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]:
    """Handlers (unary, stream) that end a call UNAUTHENTICATED with `message` as it starts, its body unread.

    Both take a request stream: a unary handler would be run only once the whole body (up to the message limit)
    arrived. On the wire a unary call is a stream of one message, so its caller sees no difference.
    """

    async def unary(requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # an async generator, as stream handlers are

    return grpc.stream_unary_rpc_method_handler(unary), grpc.stream_stream_rpc_method_handler(stream)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Calls to the inference service need `authorization: Bearer <token>`."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()
        self._missing = _refuse("this server needs `authorization: Bearer <token>` metadata")
        self._wrong = _refuse("the bearer token is not valid")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if not method.startswith(_PROTECTED_PREFIX):
            return await continuation(handler_call_details)
        given = next(
            (value for key, value in handler_call_details.invocation_metadata or () if key == "authorization"), None
        )
        if given is not None and hmac.compare_digest(
            given if isinstance(given, bytes) else given.encode(), self._expected
        ):
            return await continuation(handler_call_details)
        unary, stream = self._missing if given is None else self._wrong
        return stream if method.endswith("/PredictStream") else unary
