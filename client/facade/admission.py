"""Backpressure: the facade's in-flight limit, counted from each call's start."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from client.facade.errors import Overloaded, PriorityReserved
from client.facade.metrics import FacadeMetrics

HIGH_PRIORITY = 1  # PredictRequest.priority 1: Triton's highest level


class Admission:
    """Backpressure: at most `limit` requests in flight, the rest refused at once, never queued.

    The last quarter of the slots is kept for high-priority requests (PredictRequest.priority 1,
    Triton's highest level): under an overload of others, they still get in. All handlers run on
    one event loop, so a plain counter is race-free.
    """

    HIGH_PRIORITY = HIGH_PRIORITY

    def __init__(self, limit: int, retry_after_ms: int, metrics: FacadeMetrics) -> None:
        self.limit = limit
        self.high_priority_reserve = limit // 4
        self.in_flight = 0
        self._retry_hint = (("grpc-retry-pushback-ms", str(retry_after_ms)),)
        self._metrics = metrics

    def acquire(self) -> None:
        """Take a slot, or raise Overloaded; every acquire that returns is paired with one release."""
        if self.in_flight >= self.limit:
            raise Overloaded(
                f"the server is handling its limit of {self.limit} requests: retry after the "
                f"grpc-retry-pushback-ms hint ({self._retry_hint[0][1]} ms)",
                self._retry_hint,
            )
        self.in_flight += 1
        self._metrics.in_flight.set(self.in_flight)

    def release(self) -> None:
        self.in_flight -= 1
        self._metrics.in_flight.set(self.in_flight)

    @contextmanager
    def slot(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def check_priority(self, priority: int) -> None:
        """Once the request is read: refuse it if it is not high priority and only reserved slots are left.

        (The slot was taken at the call's start, before its priority could be known.)
        """
        if priority != self.HIGH_PRIORITY and self.in_flight > self.limit - self.high_priority_reserve:
            raise PriorityReserved(
                f"the server is handling {self.in_flight} requests; its last {self.high_priority_reserve} "
                f"slots are for priority {self.HIGH_PRIORITY}: retry after the grpc-retry-pushback-ms hint "
                f"({self._retry_hint[0][1]} ms)",
                self._retry_hint,
            )
