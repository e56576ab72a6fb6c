"""When a call must be answered by: the caller's gRPC deadline, shortened by the request's timeout_ms, else the default."""

from __future__ import annotations

import time


class Deadline:
    """A call's deadline on time.monotonic().

    The earlier of the caller's gRPC deadline and the request's own timeout; `default` seconds when the caller gives
    neither (None: no deadline), so that no call waits on Triton forever.
    """

    def __init__(self, time_remaining: float | None, timeout_ms: int = 0, default: float | None = None) -> None:
        now = time.monotonic()
        ends = None if time_remaining is None else now + time_remaining
        if timeout_ms:
            own = now + timeout_ms / 1000
            ends = own if ends is None else min(ends, own)
        if ends is None and default is not None:
            ends = now + default
        self._ends = ends

    def left(self) -> float | None:
        """Seconds left (0 once passed), or None for no deadline."""
        return None if self._ends is None else max(0.0, self._ends - time.monotonic())

    def triton_timeout_us(self) -> int | None:
        """Triton's own request timeout: it covers the queue, so a request whose caller gave up is dropped there."""
        remaining = self.left()
        return None if remaining is None else max(1, int(remaining * 1e6))
