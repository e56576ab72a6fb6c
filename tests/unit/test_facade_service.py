import os
import subprocess
import sys

import grpc
import pytest

from tritonnx.client.facade import errors
from tritonnx.client.facade.admission import Admission
from tritonnx.client.facade.metrics import FacadeMetrics


def test_admission_refuses_beyond_the_limit_with_a_retry_hint():
    admission = Admission(limit=2, retry_after_ms=150, metrics=FacadeMetrics())
    tickets = [admission.admit(10, priority=1), admission.admit(10, priority=1)]
    with pytest.raises(errors.Overloaded) as caught:
        admission.admit(10, priority=1)
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.trailing_metadata == (("grpc-retry-pushback-ms", "150"),)
    assert admission.in_flight == 2 and admission.in_flight_bytes == 20
    for ticket in tickets:
        admission.release(ticket)
    assert admission.in_flight == 0 and admission.in_flight_bytes == 0
    admission.release(admission.admit(10, priority=0))  # freed slots are usable again


def test_the_last_quarter_of_the_slots_is_for_priority_1():
    admission = Admission(limit=8, retry_after_ms=100, metrics=FacadeMetrics())
    held = [admission.admit(1, priority=0) for _ in range(6)]
    with pytest.raises(errors.PriorityReserved, match="last 2 slots are for priority 1"):
        admission.admit(1, priority=0)
    held += [admission.admit(1, priority=1), admission.admit(1, priority=1)]
    with pytest.raises(errors.Overloaded, match="its limit of 8"):
        admission.admit(1, priority=1)
    assert len(held) == 8


def test_the_byte_budget_refuses_a_body_that_would_exceed_it_but_takes_one_alone():
    admission = Admission(limit=64, retry_after_ms=100, metrics=FacadeMetrics(), max_bytes=100)
    alone = admission.admit(500, priority=0)  # larger than the budget, but nothing else is in flight
    with pytest.raises(errors.Overloaded, match="--max-in-flight-bytes"):
        admission.admit(1, priority=1)
    admission.release(alone)
    first = admission.admit(60, priority=0)
    with pytest.raises(errors.Overloaded, match="this one's 41 would exceed its limit of 100"):
        admission.admit(41, priority=0)
    second = admission.admit(40, priority=0)
    assert admission.in_flight_bytes == 100
    admission.release(first)
    admission.release(second)
    assert admission.in_flight == 0 and admission.in_flight_bytes == 0


def test_receive_places_are_counted_apart_from_the_slots():
    metrics = FacadeMetrics()
    admission = Admission(limit=2, retry_after_ms=100, metrics=metrics, max_receiving=3)
    with admission.receive_place(), admission.receive_place(), admission.receive_place():
        assert metrics.registry.get_sample_value("tritonnx_facade_receiving_calls") == 3
        with pytest.raises(errors.Overloaded, match="bodies of its limit of 3 calls"):
            with admission.receive_place():
                pass
        admission.release(admission.admit(1, priority=0))  # bodies that arrived are not held up by the others
    assert admission.receiving == 0


def test_one_connection_holds_at_most_its_share_of_the_receive_places():
    admission = Admission(limit=8, retry_after_ms=100, metrics=FacadeMetrics(), max_receiving=8,
                          max_receiving_per_connection=2)  # fmt: skip
    with admission.receive_place("ipv4:10.0.0.1:5000"), admission.receive_place("ipv4:10.0.0.1:5000"):
        with pytest.raises(errors.Overloaded, match="this connection has 2 calls waiting for their body"):
            with admission.receive_place("ipv4:10.0.0.1:5000"):
                pass
        with admission.receive_place("ipv4:10.0.0.1:5001"):  # another connection of the same host
            assert admission.receiving == 3
    assert admission.receiving == 0 and admission._receiving_by_connection == {}


PURE_PYTHON_PROTOBUF = """
from google.protobuf.internal import api_implementation
from tritonnx.client.facade import service
from tritonnx.client.facade.errors import InvalidArgument
from tritonnx.client.facade.wire import CLASSIFY_LIMITS

assert api_implementation.Type() == "python", api_implementation.Type()
for parse, body in (
    (service._predict_request, b"\\x1a\\x02\\xff\\xfe"),
    (lambda body: service._parsed(body, CLASSIFY_LIMITS), b"\\x12\\x02\\xff\\xfe"),
):
    refused = parse(body)  # model_name, not UTF-8
    assert isinstance(refused, InvalidArgument), refused
    print(refused.message)
"""


def test_a_string_that_is_not_utf8_is_invalid_argument_with_protobufs_pure_python_implementation_too():
    """Found by fuzzing: onnxruntime_extensions sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python on import, under
    which such a string raises UnicodeDecodeError, not DecodeError, and the facade answered INTERNAL."""
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    done = subprocess.run([sys.executable, "-c", PURE_PYTHON_PROTOBUF], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("malformed PredictRequest: ")
    assert done.stdout.splitlines()[1].startswith("malformed ClassifyRequest: ")
