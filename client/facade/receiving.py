"""Receive places: calls whose body has not arrived, bounded so that callers who send nothing cannot keep others out.

A call waits for its body in a place, for at most the body deadline. Places are bounded three ways:

* in count (`limit`), and per connection (`per_connection`): when every place is taken, a new call takes the place
  of the oldest call of the address holding the most places, if that is another address holding more than the
  newcomer's; otherwise of a connection of its own address holding more than its own connection (one that has not
  delivered a body lately first). Failing both, the new call is refused (a burst on one connection is refused at
  the door). So calls from one address, on any number of connections, never take a place from an address
  holding fewer; a few connections that open calls and send nothing cannot keep out a caller on a connection of
  its own; 1,000 connections with one silent call each lose their places, oldest first, to newcomers, never to the
  calls of a connection whose bodies keep arriving (its next body may be waiting for the event loop, not for the
  caller). Behind a proxy every caller shares its address, and connections are the peers;
* in bytes (`max_bytes`): gRPC holds a body on its way until it is whole, before the facade can see it, so its size
  is read where it is held: the process's resident memory above its level when nothing was being received. Beyond
  it, the calls that have waited longest are cut until it is back (`sweep`, a few times a second).

A cut call is answered RESOURCE_EXHAUSTED with the retry hint. All of it runs on the event loop: no locks.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tritonnx.client.facade.connections import peer_address
from tritonnx.client.facade.errors import DeadlineExceeded, FacadeError, Overloaded

T = TypeVar("T")
# Connections whose delivered bodies are remembered (the most recent), for eviction to spare them.
REMEMBERED_CONNECTIONS = 4096
_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """The resident memory of the process (a read of /proc/self/statm)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


class Receiver:
    """One call waiting for its body; `cut` ends the wait with `error` (the caller's handler gets it)."""

    def __init__(self, connection: str, started: float) -> None:
        self.connection = connection
        address = peer_address(connection)
        self.address = address[0] if address else connection  # a UNIX socket's peers: connections only
        self.started = started
        self.error: FacadeError | None = None
        self._task: asyncio.Task | None = None

    def _expire(self, seconds: float) -> None:
        self.cut(DeadlineExceeded(f"the request's body did not arrive within {seconds:g} s of the call's start"))

    def cut(self, error: FacadeError) -> None:
        if self.error is None and self._task is not None:
            self.error = error
            self._task.cancel()

    async def wait(self, body: Awaitable[T], seconds: float, on_reset: Callable[[str], None]) -> T:
        """`body`, unless `seconds` pass or the place is cut first (then the error says which)."""
        self._task = asyncio.current_task()
        timer = asyncio.get_running_loop().call_later(seconds, self._expire, seconds)
        try:
            return await body
        except asyncio.CancelledError:
            if self.error is None:
                on_reset(self.connection)  # the caller cancelled before sending its body
                raise
            uncancel = getattr(self._task, "uncancel", None)  # Python 3.11 on: the cancel was ours, not the caller's
            if uncancel is not None:
                uncancel()
            raise self.error from None
        finally:
            timer.cancel()
            self._task = None


class ReceivePlaces:
    def __init__(
        self,
        limit: int,
        per_connection: int,
        max_bytes: int,
        retry_hint: tuple[tuple[str, str], ...],
        on_reset: Callable[[str], None] = lambda _: None,
    ) -> None:
        """`per_connection` 0: a connection may hold every place; `max_bytes` 0: no bound in bytes.

        `on_reset` is told the connection of each call its caller cancelled before sending the body.
        """
        self.on_reset = on_reset
        self.limit = limit
        self.per_connection = per_connection or limit
        self.max_bytes = max_bytes
        self._hint = retry_hint
        self._all: OrderedDict[Receiver, None] = OrderedDict()  # oldest first
        self._by_connection: dict[str, list[Receiver]] = {}  # only connections with a call waiting: bounded
        self._by_address: Counter[str] = Counter()  # places held, by address with a call waiting: bounded
        self._delivered: OrderedDict[str, None] = OrderedDict()  # connections that delivered a body, latest last
        self._floor = resident_bytes()  # resident memory when nothing was being received
        self.evicted = 0  # calls that lost their place to a newcomer
        self.cut_for_memory = 0

    def __len__(self) -> int:
        return len(self._all)

    def _overloaded(self, what: str) -> Overloaded:
        return Overloaded(f"{what}: retry after the grpc-retry-pushback-ms hint ({self._hint[0][1]} ms)", self._hint)

    async def receive(self, body: Callable[[], Awaitable[T]], connection: str, seconds: float) -> T:
        """The call's body, awaited in a place for at most `seconds`; Overloaded at once when it gets none."""
        receiver = self._enter(connection)
        try:
            received = await receiver.wait(body(), seconds, self.on_reset)
        finally:
            self._leave(receiver)
        self._delivered[connection] = None
        self._delivered.move_to_end(connection)
        if len(self._delivered) > REMEMBERED_CONNECTIONS:
            self._delivered.popitem(last=False)
        return received

    def _enter(self, connection: str) -> Receiver:
        mine = self._by_connection.get(connection, [])
        if len(mine) >= self.per_connection:
            raise self._overloaded(
                f"this connection has {len(mine)} calls waiting for their body, its limit: send their bodies first"
            )
        now = asyncio.get_running_loop().time()
        receiver = Receiver(connection, now)
        if len(self._all) >= self.limit:
            victim = self._victim(receiver)
            if victim is None:
                raise self._overloaded(f"the server is waiting for the bodies of its limit of {self.limit} calls")
            self.evicted += 1
            victim.cut(
                self._overloaded(
                    f"the server needed this call's place for another caller: its body had not arrived after "
                    f"{now - victim.started:.2f} s, while its address or connection held more calls waiting for "
                    "theirs than the other caller's"
                )
            )
            self._leave(victim)  # at once: the victim's handler lets go of it when it next runs
        self._all[receiver] = None
        self._by_connection.setdefault(connection, []).append(receiver)
        self._by_address[receiver.address] += 1
        return receiver

    def _victim(self, newcomer: Receiver) -> Receiver | None:
        """The call whose place `newcomer` takes, if any (see the module); oldest first."""
        own_address = self._by_address[newcomer.address]
        most = max((held for address, held in self._by_address.items() if address != newcomer.address), default=0)
        if most > own_address:

            def chosen(receiver: Receiver) -> bool:
                return receiver.address != newcomer.address and self._by_address[receiver.address] == most

        else:
            own_connection = len(self._by_connection.get(newcomer.connection, ()))

            def chosen(receiver: Receiver) -> bool:
                return (
                    receiver.address == newcomer.address
                    and len(self._by_connection[receiver.connection]) > own_connection
                )

        fallback = None
        for receiver in self._all:
            if chosen(receiver):
                if receiver.connection not in self._delivered:
                    return receiver
                fallback = fallback or receiver
        return fallback

    def _leave(self, receiver: Receiver) -> None:
        if self._all.pop(receiver, False) is False:
            return  # evicted: it left when it was cut
        calls = self._by_connection[receiver.connection]
        calls.remove(receiver)
        if not calls:
            del self._by_connection[receiver.connection]
        self._by_address[receiver.address] -= 1
        if not self._by_address[receiver.address]:
            del self._by_address[receiver.address]

    def sweep(self, message_bytes: int) -> int:
        """Cut the longest-waiting calls while bodies on their way hold more than `max_bytes`; how many were cut.

        Each cut frees at most `message_bytes` (the message limit): as many are cut as the excess needs.
        """
        resident = resident_bytes()
        if not self._all:
            self._floor = resident
            return 0
        excess = resident - self._floor - self.max_bytes
        if not self.max_bytes or excess <= 0:
            return 0
        count = min(len(self._all), -(-excess // max(message_bytes, 1)))
        for receiver in list(self._all)[:count]:
            receiver.cut(
                self._overloaded(
                    f"bodies on their way hold more than the server's {self.max_bytes >> 20} MiB for them "
                    "(--max-receiving-bytes), and this call's had waited longest"
                )
            )
            self._leave(receiver)
        self.cut_for_memory += count
        return count
