"""When a call must be answered by: the caller's gRPC deadline, shortened by the request's timeout_ms."""

from __future__ import annotations

import time


class Deadline:
    """A call's deadline on time.monotonic(); none when neither the caller nor the request gives one."""

    def __init__(self, time_remaining: float | None, timeout_ms: int = 0) -> None:
        now = time.monotonic()
        ends = None if time_remaining is None else now + time_remaining
        if timeout_ms:
            own = now + timeout_ms / 1000
            ends = own if ends is None else min(ends, own)
        self._ends = ends

    def left(self) -> float | None:
        """Seconds left (0 once passed), or None for no deadline."""
        return None if self._ends is None else max(0.0, self._ends - time.monotonic())

    def triton_timeout_us(self) -> int | None:
        """Triton's own request timeout: it covers the queue, so a request whose caller gave up is dropped there."""
        remaining = self.left()
        return None if remaining is None else max(1, int(remaining * 1e6))
