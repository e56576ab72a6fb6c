"""The attacks: what each sends, at the hand-measured sizes (`FULL`), a smoke run's (`QUICK`) or the limit.

Each attack is raw bytes from one stranger on channels of its own. An attack "at the limit" sizes its body just
under the facade's message limit, so it reaches the decoder instead of gRPC's size check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

from bench.attacks.calls import Call, Calls, Held, channel, one, unread_stream
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
    junk_calls: int
    junk_bytes: int
    junk_calls_at_limit: int
    priority_fields: int
    unpacked_floats: int
    shape_dims: int
    output_names: int
    stream_seconds: float
    held_calls: int
    held_calls_at_limit: int
    unauthenticated_calls: int
    flood_calls: int
    baseline_seconds: float


# The hand-measured attacks (issue 30), at their sizes.
FULL = Sizes(
    junk_calls=200,
    junk_bytes=1_000_000,
    junk_calls_at_limit=16,
    priority_fields=16_000_000,
    unpacked_floats=12_000_000,
    shape_dims=60_000_000,
    output_names=30_000_000,
    stream_seconds=45.0,
    held_calls=64,
    held_calls_at_limit=64,
    unauthenticated_calls=32,
    flood_calls=1000,
    baseline_seconds=10.0,
)
# A smoke run: every attack, small; a body at the limit stays at the limit, fewer of them.
QUICK = replace(
    FULL,
    junk_calls=20,
    junk_bytes=64 * 1024,
    junk_calls_at_limit=2,
    priority_fields=FULL.priority_fields // 64,
    unpacked_floats=FULL.unpacked_floats // 64,
    shape_dims=FULL.shape_dims // 64,
    output_names=FULL.output_names // 64,
    stream_seconds=3.0,
    held_calls_at_limit=4,
    unauthenticated_calls=4,
    flood_calls=200,
    baseline_seconds=3.0,
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
    # Valid calls beyond the facade's slots: load, not a crafted cost. The probe's calls still get in (priority 1),
    # but wait behind the flood in Triton's queue, so their latency is not judged.
    overload: bool = False


def mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def crafted(
    body: Callable[[Context], bytes], count: Callable[[Context], int] = lambda _: 1
) -> Callable[[Context], Outcome]:
    """Calls one after the other, each carrying `body`."""

    def run(ctx: Context) -> Outcome:
        data = body(ctx)
        calls = []
        with channel(ctx.target.grpc_url) as chan:
            for _ in range(count(ctx)):
                if ctx.guard.is_set():
                    break
                calls.append(one(chan, data, ATTACK_TIMEOUT_S))
        return Outcome(len(calls), len(data), calls)

    return run


def unread(body: Callable[[Context], bytes]) -> Callable[[Context], Outcome]:
    def run(ctx: Context) -> Outcome:
        data = body(ctx)
        with channel(ctx.target.grpc_url) as chan:
            written = unread_stream(chan, data, ctx.sizes.stream_seconds, ctx.guard)
        return Outcome(written.messages, len(data), held=[written.call])

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
    """Calls that send their headers and no body (or a body at the limit that stalls near its end).

    Then, while they are held, a Predict at priority 1, the level the facade keeps slots for.
    """

    def run(ctx: Context) -> Outcome:
        with ExitStack() as closing:  # the channels close first: their connections end, the facade lets go
            calls: Calls
            if limit_body:
                count, body = ctx.sizes.held_calls_at_limit, version_junk(at_limit(ctx.limit))
                budget = at_limit(ctx.limit) - STALL_SHORT
                proxy = closing.enter_context(StallProxy(_host_port(ctx.target.grpc_url), budget))
                calls = Calls(HELD_TIMEOUT_S)
                for _ in range(count):  # a connection each, which the proxy stalls
                    calls.unary(closing.enter_context(channel(proxy.address)), body)
                arrived = until(lambda: proxy.stalled() + calls.done() >= count or ctx.guard.is_set(), 120)
            else:
                count, body = ctx.sizes.held_calls, b""
                calls = Held(closing.enter_context(channel(ctx.target.grpc_url)), count, HELD_TIMEOUT_S)
                arrived = until(lambda: holding(ctx.target) + calls.done() >= count, 10)
            priority = closing.enter_context(channel(ctx.target.grpc_url))
            high = one(priority, valid_predict(priority=1), ATTACK_TIMEOUT_S)
            if ctx.quick or ctx.guard.is_set():
                calls.cancel()
            ended = calls.wait()
        notes = [f"a Predict at priority 1 sent while they were held: {high.code} in {high.seconds * 1000:,.0f} ms"]
        if not arrived:
            notes.append("not every held call had reached the facade when it was sent")
        return Outcome(count, len(body), [high], ended, notes)

    return run


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.rpartition(":")
    return host, int(port)


def concurrent(body: Callable[[Context], bytes], count: Callable[[Context], int]) -> Callable[[Context], Outcome]:
    """`count` calls at once on one channel (one connection), with the metadata of no one."""

    def run(ctx: Context) -> Outcome:
        data = body(ctx)
        with channel(ctx.target.grpc_url) as chan:
            calls = Calls(ATTACK_TIMEOUT_S).unary(chan, data, count(ctx)).wait()
        return Outcome(len(calls), len(data), calls)

    return run


def attacks() -> list[Attack]:
    """Every attack, each of the hand-measured ones at its size and at the limit."""
    limit_junk = crafted(lambda c: version_junk(at_limit(c.limit)), lambda c: c.sizes.junk_calls_at_limit)
    return [
        Attack(
            "version_junk",
            'Predicts whose model_version is "1" followed by junk, one after the other',
            crafted(lambda c: version_junk(len(valid_predict()) + c.sizes.junk_bytes), lambda c: c.sizes.junk_calls),
        ),
        Attack("version_junk@limit", "the same, at the limit", limit_junk),
        Attack(
            "priority_fields", "`priority` fields", crafted(lambda c: repeated(PRIORITY_FIELD, c.sizes.priority_fields))
        ),
        Attack(
            "priority_fields@limit",
            "`priority` fields, at the limit",
            crafted(lambda c: repeated(PRIORITY_FIELD, fitting(PRIORITY_FIELD, c.limit))),
        ),
        Attack(
            "unpacked_floats",
            "unpacked `data` floats",
            crafted(lambda c: repeated(UNPACKED_FLOAT, c.sizes.unpacked_floats)),
        ),
        Attack(
            "unpacked_floats@limit",
            "unpacked `data` floats, at the limit",
            crafted(lambda c: repeated(UNPACKED_FLOAT, fitting(UNPACKED_FLOAT, c.limit))),
        ),
        Attack("packed_shape", "a packed `shape` of dims 1", crafted(lambda c: packed_shape(c.sizes.shape_dims))),
        Attack(
            "packed_shape@limit",
            "a packed `shape`, at the limit",
            crafted(lambda c: packed_shape(packed_shape_fitting(c.limit))),
        ),
        Attack(
            "empty_output_names",
            "empty `output_names`",
            crafted(lambda c: repeated(EMPTY_OUTPUT_NAME, c.sizes.output_names)),
        ),
        Attack(
            "empty_output_names@limit",
            "empty `output_names`, at the limit",
            crafted(lambda c: repeated(EMPTY_OUTPUT_NAME, fitting(EMPTY_OUTPUT_NAME, c.limit))),
        ),
        Attack(
            "unread_stream",
            "a PredictStream of valid Predicts written at full speed, never read",
            unread(lambda _: valid_predict()),
        ),
        Attack(
            "unread_stream@limit",
            "a PredictStream of Predicts at the limit written at full speed, never read",
            unread(lambda c: version_junk(at_limit(c.limit))),
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
            concurrent(lambda c: version_junk(at_limit(c.limit)), lambda c: c.sizes.unauthenticated_calls),
            facade_args=("--auth-token", TOKEN),
            metadata=(("authorization", f"Bearer {TOKEN}"),),
        ),
        Attack(
            "stream_flood",
            "valid Predicts at once on one connection",
            concurrent(lambda _: valid_predict(), lambda c: c.sizes.flood_calls),
            overload=True,
        ),
    ]


NAMES = [attack.name for attack in attacks()]
