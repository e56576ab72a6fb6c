"""The facade's reading of Triton's statuses (client/facade/errors.py): by status code, never by message text."""

import grpc
import pytest
from tritonclient.grpc import service_pb2

from tritonnx.client.facade import errors

Code = grpc.StatusCode


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
        (grpc.StatusCode.NOT_FOUND, errors.NotFound),
        (grpc.StatusCode.UNAVAILABLE, errors.Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, errors.DeadlineExceeded),
        (grpc.StatusCode.CANCELLED, errors.Cancelled),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.TooLarge),
        (grpc.StatusCode.INTERNAL, errors.Internal),
        (grpc.StatusCode.UNKNOWN, errors.Internal),
    ],
)
def test_triton_errors_map_by_status_code(code, kind):
    mapped = errors.from_triton(rpc_error(code, "Exceeds maximum queue size"), "resnet50", "")
    assert type(mapped) is kind and mapped.code == kind.code
    # The same code with another message maps the same way: the text never decides.
    assert type(errors.from_triton(rpc_error(code, "something else"), "resnet50", "")) is kind


def test_only_caller_facing_messages_pass_through():
    invalid = errors.from_triton(
        rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "[request id: 7] input 'x' is wrong"), "m", "2"
    )
    assert invalid.message == "model 'm' version 2 rejected the request: input 'x' is wrong"
    internal = errors.from_triton(
        rpc_error(grpc.StatusCode.INTERNAL, "Failed to open /dev/shm/triton_python_backend_shm_region_1"), "m", ""
    )
    assert "/dev/shm" not in internal.message and "server log" in internal.message


def test_a_metadata_request_refused_as_not_found_or_invalid_means_the_model_is_not_served():
    assert errors.model_not_served(Code.NOT_FOUND) and errors.model_not_served(Code.INVALID_ARGUMENT)
    assert not any(errors.model_not_served(code) for code in (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED, Code.INTERNAL))


def test_only_unavailable_for_a_named_version_may_mean_the_version_is_unloaded():
    assert errors.may_be_unloaded_version(Code.UNAVAILABLE, "2")
    assert not errors.may_be_unloaded_version(Code.UNAVAILABLE, "")  # the latest: a full queue or a restart
    assert not errors.may_be_unloaded_version(Code.NOT_FOUND, "2")  # a version never had: not_found already


def test_the_callers_deadline_or_cancellation_never_counts_as_a_restart():
    assert not errors.may_follow_a_restart(Code.DEADLINE_EXCEEDED) and not errors.may_follow_a_restart(Code.CANCELLED)
    assert errors.may_follow_a_restart(Code.UNAVAILABLE) and errors.may_follow_a_restart(Code.INTERNAL)


def test_not_found_for_a_model_served_moments_ago_means_it_is_reloading():
    assert errors.means_reloading(Code.NOT_FOUND, served_moments_ago=True)
    assert not errors.means_reloading(Code.NOT_FOUND, served_moments_ago=False)
    assert not errors.means_reloading(Code.UNAVAILABLE, served_moments_ago=True)


def test_a_replica_may_be_gone_only_when_it_answered_unavailable_or_not_found():
    assert errors.replica_may_be_gone(Code.UNAVAILABLE) and errors.replica_may_be_gone(Code.NOT_FOUND)
    assert not any(errors.replica_may_be_gone(code) for code in (Code.RESOURCE_EXHAUSTED, Code.DEADLINE_EXCEEDED))


def test_restarts_and_reloads_are_retryable_and_with_internal_failures_are_health_signals():
    for failure in (errors.restarted("m"), errors.reloading("m")):
        assert failure.code == Code.UNAVAILABLE and "retry" in failure.message and errors.on_tritons_side(failure)
    assert errors.on_tritons_side(errors.Internal("m failed"))
    assert not errors.on_tritons_side(errors.Unavailable("queue full"))  # the model is busy, not broken
    assert not errors.on_tritons_side(errors.InvalidArgument("bad input"))


def test_not_served_names_the_ready_models_and_the_ready_versions_of_the_one_asked_for():
    ready = [("b", "1"), ("a", "10"), ("a", "2")]
    assert errors.not_served("a", "3", ready).message == (
        "model 'a' version '3' is not served; ready models: a, b; ready versions of 'a': 2, 10"
    )
    assert errors.not_served("c", "", ready).message == "model 'c' is not served; ready models: a, b"
    assert errors.not_served("c", "", []).message == "model 'c' is not served; ready models: none"
    assert errors.not_served("c", "1").message == "model 'c' version '1' is not served"  # the index did not answer


def test_a_message_quoting_a_huge_caller_value_is_cut_to_fit_grpcs_metadata():
    """Found by fuzzing: a 10 MB model name quoted whole made a trailer the caller could not read."""
    error = errors.NotFound(f"model '{'m' * 10_000_000}' is not served")
    assert len(error.message) < errors.MAX_MESSAGE_CHARS + 50
    assert error.message.endswith(f"... ({10_000_000 + 22 - errors.MAX_MESSAGE_CHARS} more characters)")
    assert errors.InvalidArgument("short").message == "short"


def test_control_characters_a_caller_sent_are_escaped_in_the_message():
    error = errors.NotFound("model 'a\x00b\x1b[31m\r\nc' is not served")
    assert error.message == "model 'a\\x00b\\x1b[31m\\x0d\\x0ac' is not served"


def index_of(*entries: tuple[str, str, str]) -> list[service_pb2.RepositoryIndexResponse.ModelIndex]:
    return [service_pb2.RepositoryIndexResponse.ModelIndex(name=n, version=v, state=s) for n, v, s in entries]


def test_a_version_unloading_unloaded_or_absent_is_not_served_but_one_ready_or_loading_is():
    for state in ("UNLOADING", "UNAVAILABLE"):
        assert errors.version_not_served(index_of(("m", "1", "READY"), ("m", "2", state)), "m", "2")
    assert errors.version_not_served(index_of(("m", "1", "READY")), "m", "2")  # no longer listed
    assert errors.version_not_served(index_of(("other", "2", "READY")), "m", "2")  # another model's version 2
    for state in ("READY", "LOADING"):  # a full queue; a version about to be served: UNAVAILABLE stays "retry"
        assert not errors.version_not_served(index_of(("m", "1", "UNLOADING"), ("m", "2", state)), "m", "2")
