"""Backpressure: what the facade holds at once, bounded in calls and in bytes, refused beyond, never queued.

Two stages, because a call's body arrives after the call starts and may never arrive:

* a call waiting for its body holds a receive place (`receiving`), at most `max_receiving` of them, for at most the
  body deadline: a caller that opens calls and sends nothing (or slowly) ties up places it cannot take from
  anyone else;
* a call whose body arrived holds an in-flight slot and its body's bytes (`admit`) until it is answered: at most
  `limit` calls and `max_bytes` bytes. The last quarter of the slots is kept for high-priority requests
  (PredictRequest.priority 1, Triton's highest level), so under an overload of others they still get in.

All handlers run on one event loop, so plain counters are race-free.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from client.facade.errors import Overloaded, PriorityReserved
from client.facade.metrics import FacadeMetrics

HIGH_PRIORITY = 1  # PredictRequest.priority 1: Triton's highest level


@dataclass(frozen=True)
class Ticket:
    """What an admitted call holds until `Admission.release`."""

    nbytes: int


class Admission:
    HIGH_PRIORITY = HIGH_PRIORITY

    def __init__(
        self, limit: int, retry_after_ms: int, metrics: FacadeMetrics, max_bytes: int = 0, max_receiving: int = 0
    ) -> None:
        """`max_bytes` 0: no byte budget; `max_receiving` 0: as many receive places as in-flight slots."""
        self.limit = limit
        self.high_priority_reserve = limit // 4
        self.max_bytes = max_bytes
        self.max_receiving = max_receiving or limit
        self.in_flight = 0
        self.in_flight_bytes = 0
        self.receiving = 0
        self._retry_hint = (("grpc-retry-pushback-ms", str(retry_after_ms)),)
        self._metrics = metrics

    def _overloaded(self, what: str, kind: type[Overloaded] = Overloaded) -> Overloaded:
        return kind(
            f"{what}: retry after the grpc-retry-pushback-ms hint ({self._retry_hint[0][1]} ms)", self._retry_hint
        )

    @contextmanager
    def receive_place(self) -> Iterator[None]:
        """Held while a call's body is awaited; Overloaded at once when every place is taken."""
        if self.receiving >= self.max_receiving:
            raise self._overloaded(f"the server is waiting for the bodies of its limit of {self.max_receiving} calls")
        self.receiving += 1
        self._metrics.receiving.set(self.receiving)
        try:
            yield
        finally:
            self.receiving -= 1
            self._metrics.receiving.set(self.receiving)

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
        self._report()
        return Ticket(nbytes)

    def release(self, ticket: Ticket) -> None:
        self.in_flight -= 1
        self.in_flight_bytes -= ticket.nbytes
        self._report()

    def _report(self) -> None:
        self._metrics.in_flight.set(self.in_flight)
        self._metrics.in_flight_bytes.set(self.in_flight_bytes)
