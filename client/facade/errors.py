"""Every status the facade answers with, as types, and the one mapping from Triton's statuses.

A handler raises a `FacadeError`; the servicer turns it into the gRPC status, the message and the
trailing metadata. Triton's errors are mapped by status code only, never by message text, and
only messages written for callers (validation) are passed through.
"""

from __future__ import annotations

import logging
import re

import grpc

log = logging.getLogger("tritonnx.facade")


class FacadeError(Exception):
    """An error a caller receives as `code` with `message` (and optional trailing metadata)."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str = "internal"  # the `reason` label of the rejection metrics

    def __init__(self, message: str, trailing_metadata: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.trailing_metadata = trailing_metadata


class InvalidArgument(FacadeError):
    code, reason = grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument"


class NotFound(FacadeError):
    code, reason = grpc.StatusCode.NOT_FOUND, "not_found"


class Overloaded(FacadeError):
    """The facade's own backpressure: too many requests in flight."""

    code, reason = grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded"


class TooLarge(FacadeError):
    """A request or response beyond the configured size limits."""

    code, reason = grpc.StatusCode.RESOURCE_EXHAUSTED, "too_large"


class Unavailable(FacadeError):
    code, reason = grpc.StatusCode.UNAVAILABLE, "unavailable"


class DeadlineExceeded(FacadeError):
    code, reason = grpc.StatusCode.DEADLINE_EXCEEDED, "deadline_exceeded"


class Cancelled(FacadeError):
    code, reason = grpc.StatusCode.CANCELLED, "cancelled"


class Internal(FacadeError):
    code, reason = grpc.StatusCode.INTERNAL, "internal"


# Triton prefixes its messages with the request id; the caller has its own copy of that.
_REQUEST_ID_PREFIX = re.compile(r"^\[request id: [^\]]*\]\s*")


def from_triton(error: grpc.aio.AioRpcError, model: str, version: str) -> FacadeError:
    """The facade's answer to a failed Triton call, chosen by status code."""
    code = error.code()
    target = f"model '{model}'" + (f" version {version}" if version else "")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        # Written for callers by Triton's request checks or by the backend's validation.
        return InvalidArgument(f"{target} rejected the request: {_REQUEST_ID_PREFIX.sub('', error.details() or '')}")
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(f"{target} is not served by this server")
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(
            f"{target} cannot take the request now (its queue is full, the request waited past the queue "
            "timeout, or the inference server is unreachable): retry later"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"{target} did not answer before the deadline")
    if code == grpc.StatusCode.CANCELLED:
        return Cancelled(f"the request to {target} was cancelled")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return TooLarge(f"{target} refused the request: it is too large or the server is out of resources")
    log.error("Triton failed a request to %s: %s %s", target, code.name, error.details())
    return Internal(f"{target} failed to run the request; the server log has the details")
