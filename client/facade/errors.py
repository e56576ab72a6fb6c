"""Every status the facade answers with, as types, and every rule that reads Triton's statuses.

A handler raises a `FacadeError`; the servicer turns it into the gRPC status, the message and the
trailing metadata. Triton's errors are read by status code only, never by message text, and only
messages written for callers (validation) are passed through. The gateway (gateway.py) asks Triton
and the predicates here decide what an answer means.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import grpc
from tritonclient.grpc import service_pb2

log = logging.getLogger("tritonnx.facade")
# The longest message a caller gets (gRPC's metadata limit is 8 KiB by default, and the message is metadata).
MAX_MESSAGE_CHARS = 2000
# Control characters a caller put in a value the message quotes (a model name): shown escaped, never echoed to a
# terminal or a log line that reads them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# The states of Triton's repository index in which a version is served, or about to be.
_SERVED_STATES = frozenset({"READY", "LOADING"})


class FacadeError(Exception):
    """An error a caller receives as `code` with `message` (and optional trailing metadata)."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str = "internal"  # the `reason` label of the rejection metrics

    def __init__(self, message: str, trailing_metadata: tuple[tuple[str, str], ...] = ()) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            # Messages quote the caller (names, shapes): a huge one would become a trailer above gRPC's metadata
            # limit, which the caller cannot read (RESOURCE_EXHAUSTED) and which costs the facade its size again.
            message = f"{message[:MAX_MESSAGE_CHARS]}... ({len(message) - MAX_MESSAGE_CHARS} more characters)"
        message = _CONTROL.sub(lambda found: f"\\x{ord(found[0]):02x}", message)
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


class PriorityReserved(Overloaded):
    """Overloaded, told once the body showed a default-priority request while only the priority-1 slots were left."""

    reason = "priority_reserve"


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


class ServerRestarting(Unavailable):
    """Triton restarted under a call, or is restarting or reloading its model: the caller retries."""


def restarted(model: str) -> ServerRestarting:
    # Never Triton's message about the shared-memory region: it names it.
    return ServerRestarting(f"model '{model}' cannot take the request now: the inference server restarted; retry")


def reloading(model: str) -> ServerRestarting:
    return ServerRestarting(
        f"model '{model}' is not available right now (the inference server is restarting or reloading it); retry"
    )


def not_served(name: str, version: str, ready: list[tuple[str, str]] | None = None) -> NotFound:
    """The model (version) is not served; `ready` lists Triton's ready (model, version)s when it could be asked."""
    target = f"model '{name}'" + (f" version '{version}'" if version else "")
    if ready is None:
        return NotFound(f"{target} is not served")
    served = sorted({model for model, _ in ready})
    versions = sorted((v for model, v in ready if model == name), key=lambda v: v.zfill(20))
    ready_versions = f"; ready versions of '{name}': {', '.join(versions)}" if version and versions else ""
    return NotFound(f"{target} is not served; ready models: {', '.join(served) or 'none'}{ready_versions}")


def on_tritons_side(failure: FacadeError) -> bool:
    """Whether a failed call says something of Triton's health (the health report shows the last one)."""
    return isinstance(failure, (ServerRestarting, Internal))


# What Triton's statuses mean beyond the one-to-one mapping of `from_triton`.


def model_not_served(code: grpc.StatusCode) -> bool:
    """Whether Triton's answer to a model's metadata or config means it does not serve that model (version).

    NOT_FOUND for a model or version it does not have, INVALID_ARGUMENT for a version it cannot read.
    """
    return code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)


def may_be_unloaded_version(code: grpc.StatusCode, version: str) -> bool:
    """Whether the answer to a request naming a version may mean the version is not loaded.

    Triton 2.51 answers NOT_FOUND for a version it never had, but UNAVAILABLE ("not at ready state") for one it
    unloaded (retired, rolled back) or that failed to load, as it does for a full queue: a live Triton whose
    repository index shows the version neither ready nor loading tells them apart (`version_not_served`).
    """
    return code == grpc.StatusCode.UNAVAILABLE and bool(version)


def version_not_served(
    index: Iterable[service_pb2.RepositoryIndexResponse.ModelIndex], name: str, version: str
) -> bool:
    """Whether Triton's repository index (every state) shows the version neither ready nor loading.

    A version being unloaded (a rollback, a retirement) is not served from the moment Triton starts unloading it;
    one being loaded is served moments later, so its UNAVAILABLE stays "retry". The server's own readiness is not
    asked: with strict readiness it is false while any version loads or unloads.
    """
    return not any(m.name == name and m.version == version and m.state in _SERVED_STATES for m in index)


def may_follow_a_restart(code: grpc.StatusCode) -> bool:
    """Whether a failed inference may follow Triton's restart (it forgot the shared-memory region).

    Anything but the caller's deadline or cancellation.
    """
    return code not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


def means_reloading(code: grpc.StatusCode, served_moments_ago: bool) -> bool:
    """Whether Triton is reloading a model it served moments ago (its metadata is still held).

    NOT_FOUND then means the model is being reloaded, or the server is shutting down for a restart. Once the held
    metadata expires, NOT_FOUND is the answer.
    """
    return code == grpc.StatusCode.NOT_FOUND and served_moments_ago


def replica_may_be_gone(code: grpc.StatusCode) -> bool:
    """Whether the answer may come from a replica that went away (its connection, or it is stopping and unloading).

    Worth one more try elsewhere, once the replica confirms it is not live. Any other answer stands.
    """
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)


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
