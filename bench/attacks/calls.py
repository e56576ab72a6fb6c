"""Raw calls: bytes in, statuses and times out, on channels that send messages of any size.

Every call has a deadline of the attacker's own, so none can outlive the campaign; a call ended by that deadline or
cancelled by the attacker is told apart from one the facade ended (`Call.ended_by`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from bench.attacks.payloads import PREDICT, PREDICT_STREAM

Metadata = tuple[tuple[str, str], ...]
FACADE, ATTACKER = "facade", "attacker"
BESIDE = "beside"  # a legitimate caller's call sent during an attack from a connection of its own: must be answered OK
# A call ended this close to the attacker's own deadline was ended by it, not by the facade.
_DEADLINE_SLACK_S = 0.5


@dataclass
class Call:
    code: str  # the grpc.StatusCode's name
    seconds: float  # from the call's start to its end
    ended_by: str = FACADE  # ATTACKER: cancelled, or past the attacker's own deadline
    caller: str = ATTACKER  # or BESIDE


def channel(url: str) -> grpc.Channel:
    """A channel on a connection of its own (no subchannel shared with another), with no message size limit."""
    unlimited = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    return grpc.insecure_channel(url, options=[*unlimited, ("grpc.use_local_subchannel_pool", 1)])


@dataclass
class _Pending:
    call: grpc.Call
    started: float
    ended: threading.Event
    ended_at: float = 0.0
    cancelled: bool = False


class Calls:
    """Calls started now, each timed to its end by gRPC's termination callback; `wait` collects them."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._pending: list[_Pending] = []

    def add(self, start: Callable[[], grpc.Call]) -> grpc.Call:
        started = time.monotonic()
        pending = _Pending(start(), started, threading.Event())

        def end() -> None:
            pending.ended_at = time.monotonic()
            pending.ended.set()

        if not pending.call.add_callback(end):  # it had ended already
            end()
        self._pending.append(pending)
        return pending.call

    def unary(self, chan: grpc.Channel, body: bytes, count: int = 1, metadata: Metadata = ()) -> Calls:
        method = chan.unary_unary(PREDICT, request_serializer=None, response_deserializer=None)
        for _ in range(count):
            self.add(lambda: method.future(body, timeout=self.timeout, metadata=metadata))
        return self

    def done(self) -> int:
        return sum(pending.ended.is_set() for pending in self._pending)

    def cancel(self) -> None:
        """Cancel the calls still going: they count as ended by the attacker."""
        for pending in self._pending:
            if not pending.ended.is_set():
                pending.cancelled = True
                pending.call.cancel()

    def wait(self) -> list[Call]:
        """Every call's end; bounded, since each has its deadline."""
        results = []
        for pending in self._pending:
            pending.ended.wait(pending.started + self.timeout + 10 - time.monotonic())
            seconds = (pending.ended_at or time.monotonic()) - pending.started
            code = pending.call.code() or grpc.StatusCode.UNKNOWN
            by_attacker = pending.cancelled or (
                code == grpc.StatusCode.DEADLINE_EXCEEDED and seconds >= self.timeout - _DEADLINE_SLACK_S
            )
            results.append(Call(code.name, seconds, ATTACKER if by_attacker else FACADE))
        return results


def one(chan: grpc.Channel, body: bytes, timeout: float, metadata: Metadata = ()) -> Call:
    return Calls(timeout).unary(chan, body, metadata=metadata).wait()[0]


class Held(Calls):
    """Predict calls whose headers go out and whose body never comes, until `wait` (or their deadline)."""

    def __init__(self, chan: grpc.Channel, count: int, timeout: float, metadata: Metadata = ()) -> None:
        super().__init__(timeout)
        self._release = threading.Event()
        method = chan.stream_unary(PREDICT, request_serializer=None, response_deserializer=None)
        for _ in range(count):
            self.add(lambda: method.future(self._no_body(), timeout=timeout, metadata=metadata))

    def _no_body(self) -> Iterator[bytes]:
        # gRPC sends the call's headers when it starts, then waits here for a message that never comes.
        self._release.wait(self.timeout)
        yield from ()

    def wait(self) -> list[Call]:
        try:
            return super().wait()
        finally:
            self._release.set()  # ends the threads gRPC runs the request iterators on


def unread_stream(
    chan: grpc.Channel, body: bytes, seconds: float, stop: threading.Event, metadata: Metadata = ()
) -> tuple[Call, int]:
    """A PredictStream written with `body` for `seconds` (or until the facade ends it or `stop` is set), never read.

    Returns the stream's end and the messages handed to gRPC (which asks for the next once the one before is sent).
    """
    messages = 0
    deadline = time.monotonic() + seconds

    def bodies() -> Iterator[bytes]:
        nonlocal messages
        while time.monotonic() < deadline and not stop.is_set():
            yield body
            messages += 1

    calls = Calls(seconds + 60)
    method = chan.stream_stream(PREDICT_STREAM, request_serializer=None, response_deserializer=None)
    stream = calls.add(lambda: method(bodies(), timeout=calls.timeout, metadata=metadata))
    while time.monotonic() < deadline and not stop.is_set() and stream.is_active():
        stop.wait(0.1)
    if stream.is_active():
        calls.cancel()
    return calls.wait()[0], messages
