"""The attacks: what each sends, at the hand-measured sizes (`Sizes()`), a smoke run's (`QUICK`) or the limit.

An attack "at the limit" sizes its body just under the facade's message limit, so it reaches the decoder instead of
gRPC's size check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

from bench.attacks.calls import BESIDE, Call, Calls, Held, channel, one, unread_stream
from bench.attacks.payloads import (
    EMPTY_OUTPUT_NAME,
    PRIORITY_FIELD,
    UNPACKED_FLOAT,
    at_limit,
    fitting,
    packed_shape,
    packed_shape_fitting,
    repeated,
    valid_predict,
    version_junk,
)
from bench.attacks.proxy import StallProxy
from bench.attacks.watch import Target
from tritonnx.server.prometheus import scrape

ATTACK_TIMEOUT_S = 120.0  # the attacker's own deadline: a call the facade has not ended by then never will
HELD_TIMEOUT_S = 60.0  # calls without their whole body: the facade ends them at its body deadline, if it has one
STALL_SHORT = 64 * 1024  # a held body at the limit stops this many bytes short of its end
# The calls a facade holds: being served, and (where it counts them apart) waiting for their body.
HOLDING = ("tritonnx_facade_in_flight_requests", "tritonnx_facade_receiving_calls")
TOKEN = "attack-campaign"  # the bearer token of the facade the unauthenticated calls meet; any will do


@dataclass(frozen=True)
class Sizes:
    """The hand-measured attacks' sizes (a field's elements, calls, seconds)."""

    junk_calls: int = 200
    junk_bytes: int = 1_000_000
    junk_calls_at_limit: int = 16
    priority_fields: int = 16_000_000
    unpacked_floats: int = 12_000_000
    shape_dims: int = 60_000_000
    output_names: int = 30_000_000
    stream_seconds: float = 45.0
    held_calls: int = 64
    held_calls_at_limit: int = 64
    unauthenticated_calls: int = 32
    baseline_seconds: float = 10.0
    silent_connections: int = 1000
    address_connections: int = 1100  # more than the facade's --max-connections (1,024): all of them, uncapped
    slow_connections: int = 500
    reset_streams: int = 20_000
    flood_seconds: float = 3.0


# A smoke run: every attack, small; a body at the limit stays at the limit, fewer of them.
QUICK = replace(
    Sizes(),
    junk_calls=20,
    junk_bytes=64 * 1024,
    junk_calls_at_limit=2,
    priority_fields=16_000_000 // 64,
    unpacked_floats=12_000_000 // 64,
    shape_dims=60_000_000 // 64,
    output_names=30_000_000 // 64,
    stream_seconds=3.0,
    held_calls_at_limit=4,
    unauthenticated_calls=4,
    baseline_seconds=3.0,
    silent_connections=250,
    address_connections=300,
    slow_connections=100,
    reset_streams=5_000,
    flood_seconds=1.0,
)


@dataclass
class Outcome:
    count: int  # crafted calls sent (messages, for a stream)
    body_bytes: int  # each one's
    calls: list[Call] = field(default_factory=list)  # each must be answered within the gate's time
    held: list[Call] = field(default_factory=list)  # ended at the facade's body deadline or by the attacker
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Context:
    target: Target  # the facade attacked
    limit: int  # its message limit
    sizes: Sizes
    quick: bool  # held calls are cancelled once measured instead of waiting for the facade to end them
    guard: threading.Event  # set by the memory guard: stop sending


@dataclass(frozen=True)
class Attack:
    name: str
    what: str
    run: Callable[[Context], Outcome]
    facade_args: tuple[str, ...] = ()  # a facade of its own, started with these flags (and stopped after)
    metadata: tuple[tuple[str, str], ...] = ()  # what the probe's calls to that facade carry


Body = Callable[[Context], bytes]


def crafted(body: Body, count: Callable[[Context], int] = lambda _: 1) -> Callable[[Context], Outcome]:
    """Calls one after the other, each carrying `body`."""

    def run(ctx: Context) -> Outcome:
        data, calls = body(ctx), []
        with channel(ctx.target.grpc_url) as chan:
            for _ in range(count(ctx)):
                if ctx.guard.is_set():
                    break
                calls.append(one(chan, data, ATTACK_TIMEOUT_S, ctx.target.metadata))
        return Outcome(len(calls), len(data), calls)

    return run


def unread(body: Body) -> Callable[[Context], Outcome]:
    def run(ctx: Context) -> Outcome:
        data = body(ctx)
        with channel(ctx.target.grpc_url) as chan:
            call, messages = unread_stream(chan, data, ctx.sizes.stream_seconds, ctx.guard, ctx.target.metadata)
        return Outcome(messages, len(data), held=[call])

    return run


def concurrent(body: Body, count: Callable[[Context], int]) -> Callable[[Context], Outcome]:
    """`count` calls at once on one channel (one connection), with the metadata of no one (no token)."""

    def run(ctx: Context) -> Outcome:
        data = body(ctx)
        with channel(ctx.target.grpc_url) as chan:
            calls = Calls(ATTACK_TIMEOUT_S).unary(chan, data, count(ctx)).wait()
        return Outcome(len(calls), len(data), calls)

    return run


def holding(target: Target) -> float:
    """The calls the facade holds now; -1 when its /metrics does not answer."""
    try:
        page = scrape(f"{target.http_url}/metrics", timeout=2)
    except OSError:
        return -1.0
    return sum(page.value(name) for name in HOLDING)


def until(condition: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def held(limit_body: bool) -> Callable[[Context], Outcome]:
    """Calls that send headers and no body (or a body at the limit that stalls), then a priority-1 Predict."""

    def run(ctx: Context) -> Outcome:
        with ExitStack() as closing:  # the channels close first: their connections end, the facade lets go
            calls: Calls
            if limit_body:
                count, body = ctx.sizes.held_calls_at_limit, version_junk(at_limit(ctx.limit))
                host, _, port = ctx.target.grpc_url.rpartition(":")
                proxy = closing.enter_context(StallProxy((host, int(port)), at_limit(ctx.limit) - STALL_SHORT))
                calls = Calls(HELD_TIMEOUT_S)
                for _ in range(count):  # a connection each, which the proxy stalls
                    calls.unary(closing.enter_context(channel(proxy.address)), body, metadata=ctx.target.metadata)
                arrived = until(lambda: proxy.stalled() + calls.done() >= count or ctx.guard.is_set(), 120)
            else:
                count, body = ctx.sizes.held_calls, b""
                calls = Held(
                    closing.enter_context(channel(ctx.target.grpc_url)), count, HELD_TIMEOUT_S, ctx.target.metadata
                )
                arrived = until(lambda: holding(ctx.target) + calls.done() >= count, 10)
            high = one(
                closing.enter_context(channel(ctx.target.grpc_url)),
                valid_predict(priority=1),
                ATTACK_TIMEOUT_S,
                ctx.target.metadata,
            )
            high.caller = BESIDE
            if ctx.quick or ctx.guard.is_set():
                calls.cancel()
            ended = calls.wait()
        notes = [f"a Predict at priority 1 sent while they were held: {high.code} in {high.seconds * 1000:,.0f} ms"]
        if not arrived:
            notes.append("not every held call had reached the facade when it was sent")
        return Outcome(count, len(body), [high], ended, notes)

    return run


def repeated_field(name: str, element: bytes, what: str, size: str) -> list[Attack]:
    """A field repeated: as many times as Sizes' `size` says, and as often as the limit allows."""
    sized = crafted(lambda c: repeated(element, getattr(c.sizes, size)))
    limited = crafted(lambda c: repeated(element, fitting(element, c.limit)))
    return [Attack(name, what, sized), Attack(f"{name}@limit", f"{what}, at the limit", limited)]


def attacks() -> list[Attack]:
    """Every attack, each of the hand-measured ones at its size and at the limit."""
    junk_at_limit: Body = lambda c: version_junk(at_limit(c.limit))  # noqa: E731
    return [
        Attack(
            "version_junk",
            'Predicts whose model_version is "1" followed by junk, one after the other',
            crafted(lambda c: version_junk(len(valid_predict()) + c.sizes.junk_bytes), lambda c: c.sizes.junk_calls),
        ),
        Attack(
            "version_junk@limit",
            "the same, at the limit",
            crafted(junk_at_limit, lambda c: c.sizes.junk_calls_at_limit),
        ),
        *repeated_field("priority_fields", PRIORITY_FIELD, "`priority` fields", "priority_fields"),
        *repeated_field("unpacked_floats", UNPACKED_FLOAT, "unpacked `data` floats", "unpacked_floats"),
        *repeated_field("empty_output_names", EMPTY_OUTPUT_NAME, "empty `output_names`", "output_names"),
        Attack("packed_shape", "a packed `shape` of dims 1", crafted(lambda c: packed_shape(c.sizes.shape_dims))),
        Attack(
            "packed_shape@limit",
            "a packed `shape`, at the limit",
            crafted(lambda c: packed_shape(packed_shape_fitting(c.limit))),
        ),
        Attack(
            "unread_stream",
            "a PredictStream of valid Predicts written at full speed, never read",
            unread(lambda _: valid_predict()),
        ),
        Attack(
            "unread_stream@limit",
            "a PredictStream of Predicts at the limit written at full speed, never read",
            unread(junk_at_limit),
        ),
        Attack("header_only", "calls that send headers and no body, then a priority-1 Predict", held(False)),
        Attack(
            "header_only@limit",
            "calls whose body at the limit stalls 64 KiB short of its end, then a priority-1 Predict",
            held(True),
        ),
        Attack(
            "unauthenticated",
            "calls at once without the bearer token, each with a body at the limit, to a facade with --auth-token",
            concurrent(junk_at_limit, lambda c: c.sizes.unauthenticated_calls),
            facade_args=("--auth-token", TOKEN),
            metadata=(("authorization", f"Bearer {TOKEN}"),),
        ),
    ]
