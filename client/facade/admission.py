"""Backpressure: what the facade holds at once, bounded in calls and in bytes, refused beyond, never queued.

Two stages, because a call's body arrives after the call starts and may never arrive:

* a call waiting for its body holds a receive place (`receive`; receiving.py), bounded in count, per connection and
  in bytes, for at most the body deadline: a caller that opens calls and sends nothing (or slowly) ties up places,
  never the slots of calls whose body arrived, and loses its places to callers who send;
* a call whose body arrived holds an in-flight slot and its body's bytes (`admit`) until it is answered: at most
  `limit` calls and `max_bytes` bytes. The last quarter of the slots is kept for high-priority requests
  (PredictRequest.priority 1, Triton's highest level), so under an overload of others they still get in.

All handlers run on one event loop, so plain counters are race-free.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tritonnx.client.facade.errors import Overloaded, PriorityReserved
from tritonnx.client.facade.metrics import FacadeMetrics
from tritonnx.client.facade.receiving import ReceivePlaces

T = TypeVar("T")

HIGH_PRIORITY = 1  # PredictRequest.priority 1: Triton's highest level


@dataclass(frozen=True)
class Ticket:
    """What an admitted call holds until `Admission.release`."""

    nbytes: int


class Admission:
    HIGH_PRIORITY = HIGH_PRIORITY

    def __init__(
        self,
        limit: int,
        retry_after_ms: int,
        metrics: FacadeMetrics,
        max_bytes: int = 0,
        max_receiving: int = 0,
        max_receiving_per_connection: int = 0,
        max_receiving_bytes: int = 0,
        on_reset: Callable[[str], None] = lambda _: None,
    ) -> None:
        """Zeros mean no bound of their own.

        `max_bytes` 0: no byte budget; `max_receiving` 0: as many receive places as in-flight slots;
        `max_receiving_per_connection` 0: a connection may hold every place; `max_receiving_bytes` 0: places are
        not bounded in bytes. `on_reset`: see ReceivePlaces.
        """
        self.limit = limit
        self.high_priority_reserve = limit // 4
        self.max_bytes = max_bytes
        self.in_flight = 0
        self.in_flight_bytes = 0
        self._retry_hint = (("grpc-retry-pushback-ms", str(retry_after_ms)),)
        self.places = ReceivePlaces(
            max_receiving or limit, max_receiving_per_connection, max_receiving_bytes, self._retry_hint, on_reset
        )
        # Read when scraped: setting a gauge takes its lock, three times a call's start and again at its end.
        metrics.in_flight.set_function(lambda: self.in_flight)
        metrics.in_flight_bytes.set_function(lambda: self.in_flight_bytes)
        metrics.receiving.set_function(lambda: self.receiving)

    @property
    def receiving(self) -> int:
        return len(self.places)

    def _overloaded(self, what: str, kind: type[Overloaded] = Overloaded) -> Overloaded:
        return kind(
            f"{what}: retry after the grpc-retry-pushback-ms hint ({self._retry_hint[0][1]} ms)", self._retry_hint
        )

    async def receive(self, body: Callable[[], Awaitable[T]], connection: str = "", seconds: float = 10.0) -> T:
        """The call's body, awaited in a receive place (receiving.py); Overloaded at once when it gets none.

        `connection`: the call's peer (gRPC's address:port of the caller's end), which tells connections apart.
        """
        return await self.places.receive(body, connection, seconds)

    def admit(self, nbytes: int, priority: int) -> Ticket:
        """A slot for a call whose body (`nbytes`) arrived, or Overloaded; every ticket is paired with one release.

        A body that alone exceeds the byte budget is still admitted when nothing else is in flight.
        """
        if self.in_flight >= self.limit:
            raise self._overloaded(f"the server is handling its limit of {self.limit} requests")
        if priority != self.HIGH_PRIORITY and self.in_flight >= self.limit - self.high_priority_reserve:
            raise self._overloaded(
                f"the server is handling {self.in_flight} requests; its last {self.high_priority_reserve} slots are "
                f"for priority {self.HIGH_PRIORITY}",
                PriorityReserved,
            )
        if self.max_bytes and self.in_flight_bytes and self.in_flight_bytes + nbytes > self.max_bytes:
            raise self._overloaded(
                f"the server holds {self.in_flight_bytes} bytes of requests; this one's {nbytes} would exceed its "
                f"limit of {self.max_bytes} (--max-in-flight-bytes)"
            )
        self.in_flight += 1
        self.in_flight_bytes += nbytes
        return Ticket(nbytes)

    def release(self, ticket: Ticket) -> None:
        self.in_flight -= 1
        self.in_flight_bytes -= ticket.nbytes
