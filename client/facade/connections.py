"""What one gRPC connection may do before the facade closes it, and the pools of long-lived calls.

gRPC's own bounds come first (server.py's channel arguments: idle and aged connections get GOAWAY, PING floods
too_many_pings, a connection count). What they leave is watched here, call by call, and ends at the connection:

* a connection that cancels more than `max_resets` calls a second before they were answered (HTTP/2 rapid reset:
  each stream opened and reset costs the facade a handler, the attacker a frame);
* one whose caller leaves an answer unread for `send_timeout` (a zero flow-control window: every call would stay
  open, holding its place in gRPC's count of calls, for as long as the connection lives);
* one whose reflection stream carries more than `REFLECTION_REQUESTS` requests;
* the newest of an address's connections beyond `max_per_address` (gRPC's own count is of all connections, so one
  address holding them all would keep every other caller out until they idle out), counted once a second; a
  connection answered lately is kept before an unanswered one.

The connection is shut down (sockets.py): its calls end; nothing else does.

Long-lived calls have pools of their own, refused beyond (RESOURCE_EXHAUSTED): health Watch streams (with a server
deadline: the watcher watches again), PredictStreams (a quarter per connection), reflection streams.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from typing import Any

import grpc

from tritonnx.client.facade.metrics import FacadeMetrics
from tritonnx.client.facade.sockets import Caller, census, shut_down

log = logging.getLogger("tritonnx.facade")
REFLECTION_REQUESTS = 100  # a client asks a handful (services, then a file or two) per stream
REFLECTION_STREAMS = 16
WATCH_METHOD = "/grpc.health.v1.Health/Watch"
PREDICT_STREAM_METHOD = "/inference.InferenceService/PredictStream"
REFLECTION_PREFIX = "/grpc.reflection."
SWEEP_S = 0.25
# Connections are counted every this many sweeps (a second): a census of them all, and a connection's age is
# known to the second it was first counted, so that an address's newest are the ones closed.
CENSUS_SWEEPS = 4
REMEMBERED_CONNECTIONS = 4096  # connections answered lately, spared by the count by address
Behaviour = Callable[..., Any]


def peer_address(peer: str) -> tuple[str, int] | None:
    """The (host, port) of a gRPC peer string (ipv4:1.2.3.4:5, ipv6:[::1]:5); None for other transports."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


class Pool:
    """At most `limit` calls at once, and `per_connection` of one connection (0: no share of its own)."""

    def __init__(self, what: str, limit: int, per_connection: int = 0) -> None:
        self.what, self.limit, self.per_connection = what, limit, per_connection or limit
        self.held = 0
        self._by_connection: dict[str, int] = {}

    def refusal(self, peer: str) -> str | None:
        """Why a new call from `peer` gets no place; None when it takes one (then `leave` gives it back)."""
        mine = self._by_connection.get(peer, 0)
        if self.held >= self.limit:
            return f"the server holds its limit of {self.limit} {self.what}"
        if mine >= self.per_connection:
            return f"this connection holds its limit of {self.per_connection} {self.what}"
        self.held += 1
        self._by_connection[peer] = mine + 1
        return None

    def leave(self, peer: str) -> None:
        self.held -= 1
        left = self._by_connection[peer] - 1
        if left:
            self._by_connection[peer] = left
        else:
            del self._by_connection[peer]


class ConnectionGuard(grpc.aio.ServerInterceptor):
    """Watches each call's connection (see the module), as gRPC's server interceptor; `port` is set once bound."""

    def __init__(
        self,
        metrics: FacadeMetrics,
        *,
        send_timeout: float,
        max_resets: int,
        max_watches: int,
        watch_seconds: float,
        max_predict_streams: int,
        retry_after_ms: int,
        max_per_address: int = 0,
    ) -> None:
        self.metrics = metrics
        self.max_per_address = max_per_address
        self.send_timeout = send_timeout
        self.max_resets = max_resets
        self.watch_seconds = watch_seconds
        self.port = 0
        self.pools = {
            WATCH_METHOD: Pool("health Watch streams", max_watches),
            PREDICT_STREAM_METHOD: Pool("PredictStreams", max_predict_streams, max(1, max_predict_streams // 4)),
            REFLECTION_PREFIX: Pool("reflection streams", REFLECTION_STREAMS),
        }
        self._hint = (("grpc-retry-pushback-ms", str(retry_after_ms)),)
        self._unread: dict[object, tuple[str, float]] = {}  # a call (its context) answered, unread -> (peer, since)
        self._resets: dict[str, tuple[float, int]] = {}  # peer -> (second, calls cancelled in it)
        self._sweeps = 0
        self._first_seen: dict[Caller, int] = {}  # a caller's (host, port) -> the sweep that first saw it
        self._census_failed = False
        self._served: OrderedDict[Caller, None] = OrderedDict()  # connections answered lately, the latest last
        # method -> (gRPC's handler, its wrap); the methods are the server's own few, unknown ones get no handler
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method
        wrapped = self._wrapped.get(method)
        if wrapped is None or wrapped[0] is not handler:  # the servicers' handlers are made once: so is each wrap
            wrapped = (handler, self._wrap(handler, method))
            self._wrapped[method] = wrapped
        return wrapped[1]

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        pool = self.pools.get(REFLECTION_PREFIX if method.startswith(REFLECTION_PREFIX) else method)
        kind = handler.unary_unary or handler.stream_unary
        if kind is not None:
            wrapped = self._unary_response(kind)
            make = grpc.unary_unary_rpc_method_handler if handler.unary_unary else grpc.stream_unary_rpc_method_handler
        else:
            streaming: Behaviour = handler.unary_stream or handler.stream_stream  # type: ignore[assignment]
            wrapped = self._stream_response(streaming, pool, method)
            make = (
                grpc.unary_stream_rpc_method_handler if handler.unary_stream else grpc.stream_stream_rpc_method_handler
            )
        return make(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _unary_response(self, behaviour: Behaviour) -> Behaviour:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            response = await behaviour(request, context)
            self._answer(context)
            return response

        return call

    def _stream_response(self, behaviour: Behaviour, pool: Pool | None, method: str) -> Behaviour:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            peer = context.peer()
            if pool is not None and (why := pool.refusal(peer)) is not None:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why, trailing_metadata=self._hint)
            try:
                if method.startswith(REFLECTION_PREFIX):
                    request = self._counted(request, peer)
                if method == WATCH_METHOD:
                    # The server's deadline: the stream ends OK, and the watcher watches again.
                    with suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(behaviour(request, context), self.watch_seconds)
                    return
                produced = behaviour(request, context)
                if not hasattr(produced, "__aiter__"):
                    await produced  # writes with context.write
                    return
                answered = False
                async for message in produced:
                    if not answered:
                        self._answered(peer)
                        answered = True
                    self._unread[context] = (peer, time.monotonic())
                    yield message  # resumed once gRPC sent it
                    self._unread.pop(context, None)
            finally:
                self._unread.pop(context, None)
                if pool is not None:
                    pool.leave(peer)

        return call

    async def _counted(self, requests: AsyncIterator[Any], peer: str) -> AsyncIterator[Any]:
        count = 0
        async for request in requests:
            count += 1
            if count > REFLECTION_REQUESTS:
                self.close(peer, "reflection_flood")
                return
            yield request

    def _answer(self, context: grpc.aio.ServicerContext) -> None:
        """An answer handed to gRPC: unread until the call is done."""
        peer = context.peer()
        self._unread[context] = (peer, time.monotonic())
        context.add_done_callback(self._done)  # type: ignore[arg-type]  # (grpc's stubs have another signature)
        self._answered(peer)

    def _answered(self, peer: str) -> None:
        """`peer` got an answer: its connection is among the last to be closed for its address's share."""
        caller = peer_address(peer)
        if caller is not None:
            self._served[caller] = None
            self._served.move_to_end(caller)
            if len(self._served) > REMEMBERED_CONNECTIONS:
                self._served.popitem(last=False)

    def _done(self, context: grpc.aio.ServicerContext) -> None:
        self._unread.pop(context, None)

    def reset(self, peer: str) -> None:
        """A call of `peer` cancelled by its caller before its body arrived (receiving.py tells)."""
        second = int(time.monotonic())
        start, count = self._resets.get(peer, (second, 0))
        count = count + 1 if start == second else 1
        if count > self.max_resets:
            self._resets.pop(peer, None)
            self.close(peer, "resets")
            return
        self._resets[peer] = (second, count)
        if len(self._resets) > 4096:  # only this second's are worth keeping
            self._resets = {p: v for p, v in self._resets.items() if v[0] == second}

    def sweep(self) -> None:
        """Close the connections with an answer unread for `send_timeout`; forget old reset counts."""
        now = time.monotonic()
        late = {peer for peer, since in self._unread.values() if now - since > self.send_timeout}
        for peer in late:
            self.close(peer, "unread")
        self._unread = {context: entry for context, entry in self._unread.items() if entry[0] not in late}
        second = int(now)
        self._resets = {p: v for p, v in self._resets.items() if v[0] >= second - 1}
        self._sweeps += 1
        if self.max_per_address and self._sweeps % CENSUS_SWEEPS == 0:
            self.cap_addresses()

    def cap_addresses(self) -> None:
        """Close the newest connections of each address holding more than `max_per_address`."""
        try:
            callers = census(self.port)
        except OSError as error:
            if not self._census_failed:
                log.warning("connections are not counted by address (--max-connections-per-address): %s", error)
            self._census_failed = True
            return
        by_host: dict[str, list[Caller]] = {}
        for caller in callers:
            by_host.setdefault(caller[0], []).append(caller)
        self._first_seen = {c: self._first_seen.get(c, self._sweeps) for held in by_host.values() for c in held}
        beyond: set[Caller] = set()
        for host, held in by_host.items():
            if len(held) > self.max_per_address:
                # Kept first: connections that were answered lately, then the oldest.
                held.sort(key=lambda caller: (caller not in self._served, self._first_seen[caller], caller[1]))
                beyond.update(held[self.max_per_address :])
                log.warning(
                    "closing %d of the %d connections from %s (--max-connections-per-address %d)",
                    len(held) - self.max_per_address,
                    len(held),
                    host,
                    self.max_per_address,
                )
        if beyond:
            self.metrics.connections_closed.labels("per_address").inc(shut_down(beyond, self.port, callers))

    def close(self, peer: str, reason: str) -> None:
        address = peer_address(peer)
        if address is not None and shut_down({address}, self.port):
            self.metrics.connections_closed.labels(reason).inc()
            log.warning("closed the connection from %s (%s)", peer, reason)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            self.sweep()
