"""Token authentication of every gRPC call, as a server interceptor.

Health checks and reflection need the token too: the services without it were a way in for anyone who reaches the
port (a Watch stream held open, reflection requests by the thousand). Probes that carry no token use the HTTP
port's /health.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc


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
    """Every call needs `authorization: Bearer <token>`."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()
        self._missing = _refuse("this server needs `authorization: Bearer <token>` metadata")
        self._wrong = _refuse("the bearer token is not valid")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        given = next(
            (value for key, value in handler_call_details.invocation_metadata or () if key == "authorization"), None
        )
        if given is not None and hmac.compare_digest(
            given if isinstance(given, bytes) else given.encode(), self._expected
        ):
            return await continuation(handler_call_details)
        unary, stream = self._missing if given is None else self._wrong
        handler = await continuation(handler_call_details)
        return stream if handler is not None and handler.response_streaming else unary
